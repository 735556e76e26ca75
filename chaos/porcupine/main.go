// Command regent-porcupine checks a key-value history for linearizability with Porcupine
// (github.com/anishathalye/porcupine), a checker regent did not write.
//
// The chaos workload's controllers record every register call they issue and every answer they
// see; regent.chaos.linearizability merges those records into one history and runs this program
// on it. It only reads a history and prints a verdict: it knows nothing of regent.
//
// Usage:
//
//	regent-porcupine [-timeout 60s] [-html out.html] [HISTORY | -]
//
// HISTORY (default: standard input) is a JSON array of operations, an object
// {"operations": [...]}, or one operation per line:
//
//	{"id": "p4.0", "client": 0, "call": 1700000000000000000, "return": 1700000000000500000,
//	 "input": {"op": "put", "key": "k0", "value": "4"}, "output": {"value": null}}
//
// call and return are timestamps (any unit, one clock); return null or absent means the
// operation never returned, so it may have taken effect at any point after its call, or not at
// all. Inputs: put (set key to value), append (add value to the end of key's value), get. A
// get's output value is what it read, null when the key had none; the outputs of put and
// append are not checked. Values are strings.
//
// It prints one JSON verdict on standard output and exits 0 when the history is
// linearizable ("ok"), 1 when it is not ("illegal"), 2 when the check ran out of time
// ("unknown"), and 3 when the history cannot be read (the reason on standard error).
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"runtime/debug"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

const (
	exitOK       = 0
	exitIllegal  = 1
	exitUnknown  = 2
	exitBadInput = 3
	porcupineMod = "github.com/anishathalye/porcupine"
)

// record is one operation as the history file spells it.
type record struct {
	ID     string          `json:"id"`
	Client int             `json:"client"`
	Call   *int64          `json:"call"`
	Return *int64          `json:"return"`
	Input  *recordInput    `json:"input"`
	Output *recordOutput   `json:"output"`
	Meta   json.RawMessage `json:"meta,omitempty"`
}

type recordInput struct {
	Op    string  `json:"op"`
	Key   *string `json:"key"`
	Value *string `json:"value"`
}

type recordOutput struct {
	Value *string `json:"value"`
}

// The model's own values are comparable structs, so that porcupine's default == compares
// states and a state is cheap to copy.
type kvInput struct {
	op, key, value string
}

type kvOutput struct {
	unknown bool // never returned: any answer is possible
	present bool
	value   string
}

type kvState struct {
	present bool
	value   string
}

type opMeta struct {
	id      string
	pending bool
}

func (m opMeta) String() string {
	if m.pending {
		return m.id + " (never returned)"
	}
	return m.id
}

// partitionByKey splits a history into one sub-history per key, keys in order of first call:
// a key-value store is linearizable if and only if each key is, taken alone.
func partitionByKey(history []porcupine.Operation) [][]porcupine.Operation {
	index := map[string]int{}
	var parts [][]porcupine.Operation
	for _, op := range history {
		key := op.Input.(kvInput).key
		i, seen := index[key]
		if !seen {
			i = len(parts)
			index[key] = i
			parts = append(parts, nil)
		}
		parts[i] = append(parts[i], op)
	}
	return parts
}

// step is one key's sequential specification: a register that put overwrites and append
// extends, and whose get returns its current value.
func step(state, input, output interface{}) (bool, interface{}) {
	st, in, out := state.(kvState), input.(kvInput), output.(kvOutput)
	switch in.op {
	case "put":
		return true, kvState{present: true, value: in.value}
	case "append":
		return true, kvState{present: true, value: st.value + in.value}
	default: // get
		if out.unknown {
			return true, st
		}
		return out.present == st.present && out.value == st.value, st
	}
}

func hashState(state interface{}) uint64 {
	st := state.(kvState)
	h := fnv.New64a()
	if st.present {
		h.Write([]byte{1})
	}
	h.Write([]byte(st.value))
	return h.Sum64()
}

func describeOperation(input, output interface{}) string {
	in, out := input.(kvInput), output.(kvOutput)
	switch in.op {
	case "put", "append":
		return fmt.Sprintf("%s(%q, %q)", in.op, in.key, in.value)
	}
	switch {
	case out.unknown:
		return fmt.Sprintf("get(%q) -> ?", in.key)
	case !out.present:
		return fmt.Sprintf("get(%q) -> none", in.key)
	default:
		return fmt.Sprintf("get(%q) -> %q", in.key, out.value)
	}
}

func describeState(state interface{}) string {
	st := state.(kvState)
	if !st.present {
		return "none"
	}
	return fmt.Sprintf("%q", st.value)
}

var kvModel = porcupine.Model{
	Partition:                 partitionByKey,
	Init:                      func() interface{} { return kvState{} },
	Step:                      step,
	Hash:                      hashState,
	DescribeOperation:         describeOperation,
	DescribeState:             describeState,
	DescribeOperationMetadata: func(meta interface{}) string { return fmt.Sprint(meta) },
}

// readRecords accepts a JSON array of operations, {"operations": [...]}, or a stream of
// operations (JSON lines), and any mix of these one after another.
func readRecords(r io.Reader) ([]record, error) {
	dec := json.NewDecoder(bufio.NewReader(r))
	var out []record
	for n := 0; ; n++ {
		var raw json.RawMessage
		if err := dec.Decode(&raw); errors.Is(err, io.EOF) {
			return out, nil
		} else if err != nil {
			return nil, fmt.Errorf("JSON value %d: %w", n+1, err)
		}
		raw = bytes.TrimSpace(raw)
		switch {
		case len(raw) > 0 && raw[0] == '[':
			var recs []json.RawMessage
			if err := json.Unmarshal(raw, &recs); err != nil {
				return nil, fmt.Errorf("JSON value %d: %w", n+1, err)
			}
			for _, one := range recs {
				rec, err := strictRecord(one)
				if err != nil {
					return nil, fmt.Errorf("operation %d: %w", len(out)+1, err)
				}
				out = append(out, rec)
			}
		case len(raw) > 0 && raw[0] == '{':
			var doc map[string]json.RawMessage
			if err := json.Unmarshal(raw, &doc); err != nil {
				return nil, fmt.Errorf("JSON value %d: %w", n+1, err)
			}
			if ops, isDoc := doc["operations"]; isDoc && len(doc) == 1 {
				more, err := readRecords(bytes.NewReader(ops))
				if err != nil {
					return nil, err
				}
				out = append(out, more...)
				continue
			}
			rec, err := strictRecord(raw)
			if err != nil {
				return nil, fmt.Errorf("operation %d: %w", len(out)+1, err)
			}
			out = append(out, rec)
		default:
			return nil, fmt.Errorf("JSON value %d: want an operation object or an array of them, got %.40s", n+1, raw)
		}
	}
}

func strictRecord(raw json.RawMessage) (record, error) {
	var rec record
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rec); err != nil {
		return rec, err
	}
	return rec, nil
}

// toOperations validates the records and makes porcupine's operations of them. An operation
// that never returned gets a return after every other event and an output any step accepts.
func toOperations(recs []record) ([]porcupine.Operation, error) {
	var latest int64
	for i, rec := range recs {
		name := fmt.Sprintf("operation %d (id %q)", i+1, rec.ID)
		switch {
		case rec.Call == nil:
			return nil, fmt.Errorf("%s: no call time", name)
		case rec.Return != nil && *rec.Return < *rec.Call:
			return nil, fmt.Errorf("%s: returned (%d) before its call (%d)", name, *rec.Return, *rec.Call)
		case rec.Client < 0:
			return nil, fmt.Errorf("%s: client %d is negative", name, rec.Client)
		case rec.Input == nil:
			return nil, fmt.Errorf("%s: no input", name)
		case rec.Input.Key == nil:
			return nil, fmt.Errorf("%s: the input has no key", name)
		}
		switch rec.Input.Op {
		case "put", "append":
			if rec.Input.Value == nil {
				return nil, fmt.Errorf("%s: a %s needs a value", name, rec.Input.Op)
			}
		case "get":
			if rec.Return != nil && rec.Output == nil {
				return nil, fmt.Errorf("%s: a get that returned needs an output ({\"value\": null} if it read nothing)", name)
			}
		default:
			return nil, fmt.Errorf("%s: unknown op %q (want put, append or get)", name, rec.Input.Op)
		}
		if *rec.Call > latest {
			latest = *rec.Call
		}
		if rec.Return != nil && *rec.Return > latest {
			latest = *rec.Return
		}
	}
	ops := make([]porcupine.Operation, 0, len(recs))
	for _, rec := range recs {
		in := kvInput{op: rec.Input.Op, key: *rec.Input.Key}
		if rec.Input.Value != nil {
			in.value = *rec.Input.Value
		}
		var out kvOutput
		ret := latest + 1
		if rec.Return == nil {
			out.unknown = true
		} else {
			ret = *rec.Return
			if rec.Output != nil && rec.Output.Value != nil {
				out.present, out.value = true, *rec.Output.Value
			}
		}
		ops = append(ops, porcupine.Operation{
			ClientId: rec.Client,
			Input:    in,
			Call:     *rec.Call,
			Output:   out,
			Return:   ret,
			Metadata: opMeta{id: rec.ID, pending: rec.Return == nil},
		})
	}
	return ops, nil
}

type keyVerdict struct {
	Operations   int   `json:"operations"`
	Pending      int   `json:"pending"`
	Linearizable *bool `json:"linearizable,omitempty"` // absent when the check timed out
	Longest      *int  `json:"longest_linearizable,omitempty"`
}

type verdict struct {
	Result        string                 `json:"result"` // ok, illegal or unknown
	Operations    int                    `json:"operations"`
	Pending       int                    `json:"pending"`
	Keys          map[string]*keyVerdict `json:"keys"`
	IllegalKeys   []string               `json:"illegal_keys"`
	TimeoutS      float64                `json:"timeout_s"`
	ElapsedS      float64                `json:"elapsed_s"`
	Checker       string                 `json:"checker"`
	Visualization string                 `json:"visualization,omitempty"`
}

func checkerVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			if dep.Path == porcupineMod {
				return dep.Path + " " + dep.Version
			}
		}
	}
	return porcupineMod
}

func check(ops []porcupine.Operation, timeout time.Duration, html string) (verdict, error) {
	v := verdict{Operations: len(ops), Keys: map[string]*keyVerdict{}, IllegalKeys: []string{},
		TimeoutS: timeout.Seconds(), Checker: checkerVersion()}
	parts := partitionByKey(ops)
	for _, part := range parts {
		kv := &keyVerdict{Operations: len(part)}
		for _, op := range part {
			if op.Output.(kvOutput).unknown {
				kv.Pending++
			}
		}
		v.Pending += kv.Pending
		v.Keys[part[0].Input.(kvInput).key] = kv
	}
	start := time.Now()
	result, info := porcupine.CheckOperationsVerbose(kvModel, ops, timeout)
	v.ElapsedS = time.Since(start).Seconds()
	switch result {
	case porcupine.Ok:
		v.Result = "ok"
	case porcupine.Illegal:
		v.Result = "illegal"
	default:
		v.Result = "unknown"
	}
	if result != porcupine.Unknown {
		// The checker's partitions are partitionByKey's, in its order; a key is linearizable
		// when some linearization found for it covers all of its operations.
		for i, partials := range info.PartialLinearizations() {
			kv := v.Keys[parts[i][0].Input.(kvInput).key]
			longest := 0
			for _, p := range partials {
				if len(p) > longest {
					longest = len(p)
				}
			}
			ok := longest == kv.Operations
			kv.Linearizable, kv.Longest = &ok, &longest
			if !ok {
				v.IllegalKeys = append(v.IllegalKeys, parts[i][0].Input.(kvInput).key)
			}
		}
		sort.Strings(v.IllegalKeys)
	}
	if html != "" && len(ops) > 0 {
		if err := porcupine.VisualizePath(kvModel, info, html); err != nil {
			return v, fmt.Errorf("writing the visualization to %s: %w", html, err)
		}
		v.Visualization = html
	}
	return v, nil
}

func main() {
	os.Exit(run())
}

func run() int {
	timeout := flag.Duration("timeout", 60*time.Second, "give up (result unknown) after this long; 0: never")
	html := flag.String("html", "", "also write porcupine's HTML visualization of the history here")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: %s [-timeout 60s] [-html out.html] [HISTORY | -]\n", os.Args[0])
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() > 1 {
		flag.Usage()
		return exitBadInput
	}
	in, name := io.Reader(os.Stdin), "standard input"
	if path := flag.Arg(0); path != "" && path != "-" {
		f, err := os.Open(path)
		if err != nil {
			fmt.Fprintf(os.Stderr, "regent-porcupine: cannot read the history: %v\n", err)
			return exitBadInput
		}
		defer f.Close()
		in, name = f, path
	}
	v, err := checkHistory(in, *timeout, *html)
	if err != nil {
		fmt.Fprintf(os.Stderr, "regent-porcupine: %s: %v\n", name, err)
		return exitBadInput
	}
	out, _ := json.Marshal(v)
	fmt.Println(string(out))
	switch v.Result {
	case "ok":
		return exitOK
	case "illegal":
		return exitIllegal
	default:
		return exitUnknown
	}
}

func checkHistory(in io.Reader, timeout time.Duration, html string) (verdict, error) {
	recs, err := readRecords(in)
	if err != nil {
		return verdict{}, err
	}
	ops, err := toOperations(recs)
	if err != nil {
		return verdict{}, err
	}
	return check(ops, timeout, html)
}
