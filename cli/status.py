"""`regent status SESSION [--journal URL] [--watch [S]] [--json]`: where a session stands, on one
screen (controller/status.py), read from its journal and store only."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def add_parser(sub: argparse._SubParsersAction) -> None:
    st = sub.add_parser("status", help="where a session stands: leader, epochs, meshes, hosts, restarts, "
                                       "failovers, call rate (read-only)")
    st.add_argument("session")
    st.add_argument("--journal", default=os.environ.get("REGENT_JOURNAL"),
                    help="the session's journal (default: $REGENT_JOURNAL, else the embedded store)")
    st.add_argument("--watch", nargs="?", type=float, const=2.0, default=None, metavar="S",
                    help="show it again every S seconds (default 2) until Ctrl-C")
    st.add_argument("--json", action="store_true", help="print JSON (one object per look with --watch)")


def run(args: argparse.Namespace) -> int:
    from regent.controller.status import render, session_status
    from regent.journal import open_journal

    if args.watch is not None and args.watch <= 0:
        print(f"regent status: --watch {args.watch:g}: give a positive number of seconds", file=sys.stderr)
        return 2
    try:
        j = open_journal(args.journal)
    except Exception as e:  # noqa: BLE001 - a store that is down or a bad url: said, not a traceback
        print(f"regent status: cannot open the journal {args.journal or '(embedded store)'}: {e}", file=sys.stderr)
        return 2
    try:
        while True:
            try:
                if args.session not in j.backend.session_names():
                    known = ", ".join(sorted(j.backend.session_names())[:20]) or "none"
                    print(f"regent status: no session {args.session!r} in {j.url} (sessions there: {known})",
                          file=sys.stderr)
                    return 2
                st = session_status(j, args.session)
            except Exception as e:  # noqa: BLE001 - the store stopped answering: said, not a traceback
                print(f"regent status: the journal {j.url} did not answer: {type(e).__name__}: {e}",
                      file=sys.stderr)
                if args.watch is None:
                    return 2
            else:
                if args.json:
                    print(json.dumps(st, default=str), flush=True)
                else:
                    if args.watch is not None and sys.stdout.isatty():
                        print("\x1b[H\x1b[2J", end="")
                    print(render(st), flush=True)
            if args.watch is None:
                return 0
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return 0
    finally:
        j.close()
