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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # model.py and actors.py, also under runpy

from actors import Checkpointer, Evaluator, Trainer  # noqa: E402
from model import FULL, TINY  # noqa: E402

from regent import Session  # noqa: E402


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
        trainers = trainer_procs.spawn("trainers", Trainer, cfg.asdict())
        evaluator = aux.spawn("evaluator", Evaluator, cfg.asdict())
        saver = aux.spawn("checkpointer", Checkpointer, cfg.asdict(), directory)
        publisher = trainers.slice(**dict.fromkeys(trainers.dims, 0))
        buf = publisher.weights.call_one().get()

        # What follows a checkpoint must be what a takeover runs after resume(): the loop's
        # top. So a checkpoint notes that a snapshot is due, and the top takes it.
        state = s.resume({"step": 0, "losses": [], "evals": [], "saved": [], "snapshot_due": False})
        pending: list = []  # (kind, future): evaluations and saves still running
        live = Live(s)
        while True:
            if state["snapshot_due"]:
                state["snapshot_due"] = False
                publisher.publish.call_one(state["step"]).get()
                pending.append(("eval", evaluator.evaluate.call_one(buf, state["step"])))
                if state["step"] % cfg.save_every == 0 or state["step"] == steps:
                    pending.append(("save", saver.save.call_one(buf, state["step"])))
            if state["step"] >= steps:
                break
            step = state["step"]
            loss = trainers.step.call(step).get().values()[0]
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
                collect(s, pending, state)
                state["snapshot_due"] = True
                s.checkpoint(state)  # nothing in flight: a takeover resumes exactly here
        collect(s, pending, state)
        digests = trainers.digest.call().get().values()
        live.check()
        result = {"session": s.name, "steps": steps, "weights_sha256": digests[0],
                  "replicas_agree": len(set(digests)) == 1, "losses": state["losses"],
                  "evals": state["evals"], "saved": state["saved"], "stats": s.stats, "role": s.role,
                  "pid": os.getpid(), "checkpoint_dir": directory}
    print(json.dumps(result), flush=True)
    return result


def collect(s: Session, pending: list, state: dict) -> None:
    for kind, fut in pending:
        value = fut.get()
        if kind == "eval":
            state["evals"].append(value)
            if not s.replaying:
                print(f"eval step {value['step']} val_loss {value['val_loss']:.4f} sample {value['sample']!r}",
                      file=sys.stderr, flush=True)
        else:
            state["saved"].append(value)
    pending.clear()


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
