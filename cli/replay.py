"""`regent journal replay`: re-run a controller program against recorded journals with no workers
(controller/audit.py), one session or, as a CI check of a changed program, every session of a
store (optionally those whose name starts with a prefix) or of every SQLite journal under a
directory, as Temporal's replayer runs recorded histories against new code before a deploy.

It reads each session's records, closes the store, then replays: no store is touched by the
replay, no worker and no socket.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from regent.controller.audit import AuditReport

SESSION_FIELD = "{session}"  # in the program's arguments: replaced by each session's name


def add_arguments(replay: argparse.ArgumentParser) -> None:
    replay.add_argument("session", nargs="?", help="the session (default: every session of --journal whose "
                                                   "name starts with --prefix)")
    replay.add_argument("--program", required=True, help="the controller program (a .py file)")
    replay.add_argument("--prefix", default=None, help="without SESSION: only sessions whose name starts with this")


def run(args: argparse.Namespace, rest: list[str]) -> int:
    if not os.path.isfile(args.program):
        print(f"regent journal replay: no program at {args.program}", file=sys.stderr)
        return 2
    if args.session is not None:
        if args.prefix is not None:
            print("regent journal replay: give a SESSION or --prefix, not both", file=sys.stderr)
            return 2
        report = _replay_one(args.journal, args.session, args.program, rest, progress=None)
        print(report.render(), file=sys.stderr)
        return 0 if report.ok else 1
    return _replay_many(args.journal, args.prefix or "", args.program, rest)


def journals(where: str | None) -> list[str | None]:
    """The journal urls `where` names: every *.db file under a directory, else the url itself
    (None: the default store)."""
    if where and os.path.isdir(where):
        return [f"sqlite://{p.resolve()}" for p in sorted(Path(where).rglob("*.db")) if p.is_file()]
    return [where]


def _sessions(url: str | None, prefix: str) -> list[str]:
    from regent.journal import open_journal

    with open_journal(url) as j:
        return sorted(i.name for i in j.sessions() if i.name.startswith(prefix) and i.records)


def _replay_one(url: str | None, session: str, program: str, argv: list[str], progress: bool | None) -> AuditReport:
    from tqdm import tqdm

    from regent.controller.audit import replay_program
    from regent.journal import open_journal

    j = open_journal(url)
    try:
        total = j.session_info(session).records if progress is None else None
        records = list(tqdm(j.read(session), total=total, desc="reading journal", unit="rec",
                            disable=None if progress is None else not progress, leave=False))
        checkpoint = j.read_checkpoint(session)
        url = j.url
    finally:
        j.close()
    argv = [a.replace(SESSION_FIELD, session) for a in argv]
    return replay_program(program, session, records, checkpoint, argv, url, progress=progress)


def _replay_many(where: str | None, prefix: str, program: str, argv: list[str]) -> int:
    """Every session of every journal `where` names; one line each, the failures in full."""
    ok = failed = 0
    for url in journals(where):
        try:
            names = _sessions(url, prefix)
        except Exception as e:  # noqa: BLE001 - an unreadable journal is a failed check, named
            print(f"FAILED  {url}: cannot list its sessions: {e}", file=sys.stderr)
            failed += 1
            continue
        for session in names:
            report = _replay_one(url, session, program, argv, progress=False)
            where_ = f"{session} ({url})" if url else session
            if report.ok:
                ok += 1
                print(f"OK      {where_}: {report.calls} calls", file=sys.stderr)
            else:
                failed += 1
                print(f"FAILED  {where_}\n{report.render()}", file=sys.stderr)
    if ok + failed == 0:
        print(f"regent journal replay: no session{f' starting with {prefix!r}' if prefix else ''} in "
              f"{where or 'the default store'}: nothing was checked", file=sys.stderr)
        return 2
    print(f"regent journal replay: {ok + failed} sessions replayed with {program}: {ok} OK, {failed} failed",
          file=sys.stderr)
    return 0 if failed == 0 else 1
