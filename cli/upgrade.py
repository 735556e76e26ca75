"""`regent upgrade SESSION PROGRAM.py`: change the program of a running session without stopping
its workers. The new program is replayed against the live journal with no workers (as `regent
journal replay` does); if it diverges, nothing is touched and the command says where. Else this
process becomes the new program, started as a standby of the session that asks the primary,
through the store, to hand over (controller/upgrade.py), and takes over at once: no call runs
twice, workers keep their pids. docs/failover.md, "Changing a running program"."""

from __future__ import annotations

import argparse
import os
import sys
import time


def add_parser(sub: argparse._SubParsersAction) -> None:
    up = sub.add_parser("upgrade", help="change a running session's program: check it against the journal, "
                                        "then take the session over from its primary")
    up.add_argument("session")
    up.add_argument("program", help="the new controller program (a .py file); its own arguments go after --")
    up.add_argument("--journal", default=None, help="the session's journal (default: $REGENT_JOURNAL, else the "
                                                   "embedded store)")
    up.add_argument("--dry-run", action="store_true", help="check only: say whether the upgrade would go through")


def run(args: argparse.Namespace, rest: list[str]) -> int:
    from regent.controller.audit import replay_program
    from regent.controller.upgrade import UPGRADE_ENV
    from regent.journal import open_journal

    if not os.path.isfile(args.program):
        print(f"regent upgrade: no program at {args.program}", file=sys.stderr)
        return 2
    started = time.monotonic()
    j = open_journal(args.journal)
    try:
        leader = j.backend.leader(args.session)
        if leader is None:
            print(f"regent upgrade: no controller leads session {args.session!r} in {j.url}, so there is "
                  f"nothing to hand over; start {args.program} as you would start it (it replays the "
                  "journal if the run has not ended)", file=sys.stderr)
            return 2
        records = list(j.read(args.session))
        checkpoint = j.read_checkpoint(args.session)
        url = j.url
    finally:
        j.close()
    report = replay_program(args.program, args.session, records, checkpoint, rest, url)
    if not report.ok:
        print(report.render(), file=sys.stderr)
        why = ("A change to calls the journal already holds must be guarded with s.patched(change_id) "
               "(docs/failover.md, \"Changing a running program\")" if report.divergence is not None else
               "The new program did not replay the journal (above)")
        print(f"regent upgrade: refused; the primary ({leader[0]}, epoch {leader[1]}) runs on untouched. {why}",
              file=sys.stderr)
        return 1
    print(f"regent upgrade: {args.program} replays the {report.calls} calls of session {args.session!r} "
          f"({report.mode}; checked in {time.monotonic() - started:.2f} s)", file=sys.stderr)
    if args.dry_run:
        print("regent upgrade: --dry-run: the upgrade would go through; nothing was changed", file=sys.stderr)
        return 0
    print(f"regent upgrade: starting {args.program} as a standby; it asks the primary ({leader[0]}) to hand "
          "over", file=sys.stderr, flush=True)
    env = {**os.environ, UPGRADE_ENV: args.session}
    if args.journal:
        env.setdefault("REGENT_JOURNAL", args.journal)
    # This process becomes the new controller, as `regent run`'s are: its output is the program's.
    os.execve(sys.executable, [sys.executable, args.program, *rest], env)
    return 0  # not reached
