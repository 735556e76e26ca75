"""The training job's controller program: a character-level transformer trained data-parallel
on two procs, evaluated asynchronously on a third, checkpointed as it goes.

Run it twice with the same session name and one becomes a standby that takes over if
the first dies (`regent run examples/train/train.py --standby 1 -- --session NAME`, or
`regent demo`). The program is deterministic apart from what it asks the session for,
and checkpoints its own state with `s.checkpoint`, so a takeover replays only the steps
since the last checkpoint and the journal can be compacted however long the run.

Progress goes to stderr as lines (`step 12/600 loss 2.3456`, `eval ...`, `live ...`);
the result is one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # model.py and actors.py, also under runpy

from actors import Checkpointer, Evaluator, Trainer  # noqa: E402
from model import FULL, TINY  # noqa: E402

from regent import RestartPolicy, Session, SupervisionError  # noqa: E402


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--session", default="train")
    p.add_argument("--journal", default=os.environ.get("REGENT_JOURNAL"),
                   help="etcd://host:port or sqlite:///path.db (default: the embedded store)")
    p.add_argument("--tiny", action="store_true", help="the small configuration tests use")
    p.add_argument("--steps", type=int, help="override the configuration's number of steps")
    p.add_argument("--checkpoint-dir", help="where the checkpoint actor writes (default: a temp dir)")
    p.add_argument("--leader-file", help="append 'pid unix-time' here on becoming leader (for the demo)")
    p.add_argument("--lease-ttl", type=float, default=1.0, help="seconds a dead primary holds the lead")
    p.add_argument("--hosts", type=int, default=0,
                   help="train on N hosts of $REGENT_CLUSTER, one proc each (default: 3 procs on this host)")
    p.add_argument("--spares", type=int, default=0,
                   help="spare hosts registered beyond --hosts: a lost host is replaced from one "
                        "(on_host_lost='replace') and its replica heals from a healthy one")
    p.add_argument("--resume-from", help="a checkpoint file the checkpoint actor wrote: start every replica "
                                         "from it (a whole-job restart, as TorchElastic does)")
    p.add_argument("--step-delay", type=float, default=0.0,
                   help="sleep this long per step (tests use it to give a kill time to land)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    cfg = TINY if args.tiny else FULL
    steps = args.steps or cfg.steps
    with Session(args.session, journal=args.journal, lease_ttl_s=args.lease_ttl) as s:
        if args.leader_file:
            with open(args.leader_file, "a") as f:
                f.write(f"{os.getpid()} {time.time()}\n")
        # A fresh directory differs between runs: asked of the session, so a replay sees the same.
        directory = args.checkpoint_dir or s.side_effect(
            lambda: tempfile.mkdtemp(prefix=f"regent-{args.session}-ckpt-"))
        if args.hosts:
            # One proc per host, every one a trainer; the last also evaluates and saves. The
            # weights it reads come over the network (RDMA over TCP) from the first host.
            trainer_procs = s.host_mesh(hosts=args.hosts).spawn_procs(per_host={"procs": 1})
            aux = trainer_procs.slice(hosts=args.hosts - 1)
        else:
            procs = s.spawn_procs(per_host={"procs": 3})
            trainer_procs = procs.slice(procs=slice(0, 2))
            aux = procs.slice(procs=2)
        trainer_procs.init_process_group()  # gloo on CPU: gradients are all-reduced through it
        # With spares, a lost host's procs start again on one, the group re-forms, and every
        # mesh restarts (its replicas keep their state on the procs that survived).
        policy = RestartPolicy(strategy="one_for_all", on_host_lost="replace", max_restarts=10, window_s=300,
                               restart_timeout_s=300) if args.spares else None
        trainers = trainer_procs.spawn("trainers", Trainer, cfg.asdict(), restart=policy)
        evaluator = aux.spawn("evaluator", Evaluator, cfg.asdict(), restart=policy)
        saver = aux.spawn("checkpointer", Checkpointer, cfg.asdict(), directory, restart=policy)
        publisher = trainers.slice(**dict.fromkeys(trainers.dims, 0))
        buf = publisher.weights.call_one().get()

        # What follows a checkpoint must be what a takeover runs after resume(): the loop's
        # top. So a checkpoint notes that a snapshot is due, and the top takes it.
        first = trainers.restore.call(args.resume_from).get().values()[0] if args.resume_from else 0
        state = s.resume({"step": first, "first": first, "losses": [], "evals": [], "saved": [], "snapshot_due": False})
        pending: list = []  # (kind, future): evaluations and saves still running
        live = Live(s)
        while True:
            if state["snapshot_due"]:
                try:
                    trainers.publish.call(state["step"]).get()  # every replica: any one can serve it
                except SupervisionError:
                    if not policy:
                        raise
                    buf = heal(s, trainers, publisher, state)
                    continue
                state["snapshot_due"] = False
                state["snapshot_step"] = state["step"]
                pending.append(("eval", evaluator.evaluate.call_one(buf, state["step"])))
                if state["step"] % cfg.save_every == 0 or state["step"] == steps:
                    pending.append(("save", saver.save.call_one(buf, state["step"])))
            if state["step"] >= steps:
                break
            step = state["step"]
            try:
                loss = trainers.step.call(step).get().values()[0]
            except SupervisionError as e:  # a host was lost: heal the replicas, then the step again
                if not policy:
                    raise
                state["redone"] = state.get("redone", 0) + 1
                say(s, f"step {step + 1} failed ({e.reason}): healing the replicas")
                buf = heal(s, trainers, publisher, state)
                continue
            state["losses"].append(loss)
            state["step"] = step + 1
            live.check()
            if not s.replaying:
                print(f"step {step + 1}/{steps} loss {loss:.4f}", file=sys.stderr, flush=True)
                if args.step_delay:
                    time.sleep(args.step_delay)
            if state["step"] % cfg.eval_every == 0 or state["step"] == steps:
                # The previous evaluation and save read the buffer: wait for them before it
                # changes. They ran while the trainers went on, so this rarely waits.
                buf = collect(s, pending, state, buf, Heal(trainers, publisher, evaluator, saver) if policy else None)
                state["snapshot_due"] = True
                s.checkpoint(state)  # nothing in flight: a takeover resumes exactly here
        collect(s, pending, state, buf, Heal(trainers, publisher, evaluator, saver) if policy else None)
        digests = trainers.digest.call().get().values()
        live.check()
        result = {"session": s.name, "steps": steps, "weights_sha256": digests[0],
                  "replicas_agree": len(set(digests)) == 1, "losses": state["losses"],
                  "evals": state["evals"], "saved": state["saved"], "stats": s.stats, "role": s.role,
                  "redone": state.get("redone", 0), "healed": state.get("healed", []),
                  "pid": os.getpid(), "checkpoint_dir": directory}
    print(json.dumps(result), flush=True)
    return result


def say(s: Session, line: str) -> None:
    if not s.replaying:
        print(line, file=sys.stderr, flush=True)


def heal(s: Session, trainers: Any, publisher: Any, state: dict) -> Any:
    """After a lost host: bring every replica to the most advanced healthy one's state, read
    through an RDMA buffer (live recovery), or, with none left, to the last checkpoint. Every
    step is a call, so a replay heals the same way. The publisher's buffer, as it is now."""
    while True:
        try:
            progress = trainers.progress.call().get().values()
            healthy = [r for r, (_, trained) in enumerate(progress) if trained]
            if not healthy:  # no replica survived: the checkpoint is all there is
                if not state["saved"]:
                    raise RuntimeError("every replica was lost before the first checkpoint")
                resumed = trainers.restore.call(state["saved"][-1]).get().values()[0]
                del state["losses"][max(0, resumed - state["first"]):]
                state["step"] = resumed
                state.setdefault("healed", []).append({"from": "checkpoint", "step": resumed})
                say(s, f"healed from checkpoint {state['saved'][-1]} at step {resumed}")
            else:
                source = max(healthy, key=lambda r: progress[r][0])
                at = progress[source][0]
                if any(p != (at, True) for p in progress):
                    sel = {d: 0 for d in trainers.dims}
                    sel[next(iter(trainers.dims))] = source
                    blob = trainers.slice(**sel).export_state.call_one().get()
                    took = trainers.import_state.call(blob, at).get().values()
                    state.setdefault("healed", []).append({"from": source, "step": at, "took": sum(took)})
                    say(s, f"healed {sum(took)} replica(s) from replica {source} at step {at}")
            return publisher.weights.call_one().get()
        except SupervisionError as e:
            say(s, f"healing was interrupted ({e.reason}); again")


@dataclass
class Heal:
    """What collect needs to redo an evaluation or a save a lost host failed."""

    trainers: Any
    publisher: Any
    evaluator: Any
    saver: Any


def collect(s: Session, pending: list, state: dict, buf: Any = None, healing: Heal | None = None) -> Any:
    """Wait for the evaluations and saves in flight; one a lost host failed is run again on
    the snapshot every replica keeps (so it gives what it would have). The buffer, as now."""
    for kind, fut in pending:
        while True:
            try:
                value = fut.get()
                break
            except SupervisionError:
                if healing is None:
                    raise
                buf = heal(s, healing.trainers, healing.publisher, state)
                step = state["snapshot_step"]
                fut = (healing.evaluator.evaluate.call_one(buf, step) if kind == "eval"
                       else healing.saver.save.call_one(buf, step))
        if kind == "eval":
            state["evals"].append(value)
            if not s.replaying:
                print(f"eval step {value['step']} val_loss {value['val_loss']:.4f} sample {value['sample']!r}",
                      file=sys.stderr, flush=True)
        else:
            state["saved"].append(value)
    pending.clear()
    return buf


class Live:
    """Says once, on stderr, when this controller is live (a standby: its replay is over)."""

    def __init__(self, s: Session):
        self.s = s
        self.said = False

    def check(self) -> None:
        if not self.said and not self.s.replaying:
            self.said = True
            st = self.s.stats
            print(f"live at {time.time():.3f} replayed {st['replayed']} resent {st['resent']} role {self.s.role}",
                  file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
