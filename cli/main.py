"""The `regent` command line: host agents, keys, running programs with standbys, the
demo, and the journal tools (ls, show, verify, compact, repair, export, replay)."""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import runpy
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _cmd_host(args: argparse.Namespace, rest: list[str]) -> int:
    if any(a == "--cluster" or a.startswith("--cluster=") for a in rest):
        from regent.cli.hosts import cluster_agent

        return cluster_agent(rest)
    from regent.worker.host import main as host_main

    host_main(rest)
    return 0


def _cmd_hosts(args: argparse.Namespace, rest: list[str]) -> int:
    from regent.cli.hosts import hosts_ls

    return hosts_ls(args.cluster, args.store, as_json=args.json)


def _cmd_keys(args: argparse.Namespace, rest: list[str]) -> int:
    from regent.wire.security import init_keys

    d = init_keys(force=args.force)
    print(f"CURVE keys in {d}: copy this folder to every host, then set REGENT_SECURE=1")
    return 0


def _cmd_demo(args: argparse.Namespace, rest: list[str]) -> int:
    """The main job: examples/train/demo.py (training through controller failovers), or with
    --rl examples/rl/demo.py (asyncio RL post-training through a controller and a sampler kill)."""
    if "--rl" in rest:
        rest = [a for a in rest if a != "--rl"]
        program = REPO / "examples" / "rl" / "demo.py"
    else:
        program = REPO / "examples" / "train" / "demo.py"
    sys.argv = [str(program), *rest]
    demo = runpy.run_path(str(program), run_name="regent_demo")
    return demo["main"](rest)


def _cmd_run(args: argparse.Namespace, rest: list[str]) -> int:
    """A primary and N standbys of the same program; exits with the run's status."""
    cmd = [sys.executable, args.program, *rest]
    procs = [subprocess.Popen(cmd) for _ in range(1 + args.standby)]
    print(f"regent run: started {len(procs)} controllers of {args.program} "
          f"(pids {', '.join(str(p.pid) for p in procs)}); the first to lead is primary", file=sys.stderr)

    def forward(signum: int, frame: object) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    # The run is over when a controller ends it (one deposed or SIGKILLed while a standby
    # runs does not); standbys would find an ended session, which they start anew: stopped.
    from regent.cli.launch.common import supervise

    return supervise(procs)


def _cmd_launch(args: argparse.Namespace, rest: list[str]) -> int:
    from regent.cli.launch import run

    return run(args, rest)


def _cmd_upgrade(args: argparse.Namespace, rest: list[str]) -> int:
    from regent.cli.upgrade import run

    return run(args, rest)


def _cmd_status(args: argparse.Namespace, rest: list[str]) -> int:
    from regent.cli.status import run

    return run(args)


def _cmd_dashboard(args: argparse.Namespace, rest: list[str]) -> int:
    from regent.cli.dashboard import run

    return run(args)


def _cmd_chaos(args: argparse.Namespace, rest: list[str]) -> int:
    from regent.chaos.cli import run

    return run(args)


def _open(args: argparse.Namespace):
    from regent.journal import open_journal

    return open_journal(args.journal)


def _cmd_journal(args: argparse.Namespace, rest: list[str]) -> int:
    from regent.controller.timeline import Filter, timeline

    if args.journal_command == "replay":
        from regent.cli.replay import run

        return run(args, rest)
    j = _open(args)
    try:
        if args.journal_command == "ls":
            infos = j.sessions()
            if not infos:
                print(f"no sessions in {j.url}")
            for i in infos:
                when = _dt.datetime.fromtimestamp(i.last_write).isoformat(" ", "seconds") if i.last_write else "-"
                state = "ended" if i.ended else (f"led by {i.leader} (epoch {i.epoch})" if i.leader else "no leader")
                print(f"{i.name:<32} {i.records:>8} records  last write {when}  {state}")
            return 0
        if args.journal_command == "show":
            flt = Filter(args.actor, args.endpoint, args.errors, _parse_time(args.since), _parse_time(args.until))
            for line in timeline(j.read(args.session), flt):
                print(line)
            return 0
        if args.journal_command == "verify":
            report = j.verify(args.session)
            print(report)
            if not report.ok and j.repair(args.session, dry_run=True).tail:
                print(f"  the log ends in a torn tail and is clean before it: `regent journal repair "
                      f"{args.session} --dry-run` shows what dropping it removes")
            return 0 if report.ok else 1
        if args.journal_command == "compact":
            removed = j.compact(args.session, keep_before_lsn=_prologue_end(j, args.session))
            print(f"compacted {removed} records of {args.session!r} covered by its checkpoint")
            return 0
        if args.journal_command == "repair":
            plan = j.repair(args.session, dry_run=args.dry_run)
            for line in plan.lines(dry_run=args.dry_run):
                print(line)
            return 1 if plan.refused is not None else 0
        if args.journal_command == "export":
            return _export(j, args)
    finally:
        j.close()
    return 2


def _with_bar(records, j, session: str, what: str):
    """A progress bar over a session's records (on a terminal only)."""
    from tqdm import tqdm

    total = j.session_info(session).records
    return tqdm(records, total=total, desc=what, unit="rec", disable=None, leave=False)


def _export(j, args: argparse.Namespace) -> int:
    import json

    from regent.controller.export import export_jsonl, export_perfetto

    records = _with_bar(j.read(args.session), j, args.session, f"exporting {args.session}")
    out = open(args.output, "w") if args.output and args.output != "-" else sys.stdout
    try:
        if args.format == "jsonl":
            for line in export_jsonl(records):
                out.write(line + "\n")
        else:
            json.dump(export_perfetto(records, args.session), out)
            out.write("\n")
    finally:
        if out is not sys.stdout:
            out.close()
            print(f"wrote {args.output}" + (" (open it at https://ui.perfetto.dev)" if args.format == "perfetto" else ""),
                  file=sys.stderr)
    return 0


def _prologue_end(j, session: str) -> int | None:
    """The program's prologue (meshes made before resume(), and the resume record itself) is
    kept: a replay needs it. Without the resume record a takeover would take resume() for a
    new call and start over from the default state."""
    ckpt = j.read_checkpoint(session)
    if not ckpt or ckpt["data"].get("resume_lsn") is None:
        return None
    return ckpt["data"]["resume_lsn"] + 1


def _parse_time(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        when = _dt.datetime.fromisoformat(text)
        # `journal show` prints UTC times: a time without a zone means UTC too.
        return (when if when.tzinfo else when.replace(tzinfo=_dt.UTC)).timestamp()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="regent", description="regent: a fault-tolerant controller for PyTorch clusters")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("host", help="run this machine's host agent; --cluster NAME joins a cluster "
                              "(regent host --help, regent host --cluster X --help)", add_help=False)
    hosts = sub.add_parser("hosts", help="the host agents registered in a cluster")
    hosts_sub = hosts.add_subparsers(dest="hosts_command", required=True)
    ls = hosts_sub.add_parser("ls", help="list a cluster's registered hosts, their state and age")
    ls.add_argument("--cluster", default=os.environ.get("REGENT_CLUSTER"), required="REGENT_CLUSTER" not in os.environ,
                    help="the cluster (default $REGENT_CLUSTER)")
    ls.add_argument("--store", default=os.environ.get("REGENT_JOURNAL"),
                    help="etcd://host:port or sqlite:///path (default $REGENT_JOURNAL)")
    ls.add_argument("--json", action="store_true", help="the records as JSON")
    keys = sub.add_parser("keys", help="CURVE keys for non-loopback clusters")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    init = keys_sub.add_parser("init", help="create the cluster keypair in $REGENT_HOME/keys")
    init.add_argument("--force", action="store_true", help="replace existing keys")
    sub.add_parser("demo", help="the main job: training through controller failovers (regent demo --help; "
                               "--rl: RL post-training as an asyncio program)",
                   add_help=False)
    run = sub.add_parser("run", help="run PROGRAM.py as a primary plus N standbys")
    run.add_argument("program")
    run.add_argument("--standby", type=int, default=1, help="number of standby controllers (default 1)")
    chaos = sub.add_parser("chaos", help="fault injection: run a program under a scenario and check it")
    chaos_sub = chaos.add_subparsers(dest="chaos_command", required=True)
    from regent.chaos.cli import add_arguments as _chaos_arguments

    _chaos_arguments(chaos_sub.add_parser("run", help="run SCENARIO (a .toml or .json file), print the report"))
    from regent.cli.launch import add_parsers as _launch_parsers

    _launch_parsers(sub)
    from regent.cli.upgrade import add_parser as _upgrade_parser

    _upgrade_parser(sub)
    from regent.cli.status import add_parser as _status_parser

    _status_parser(sub)
    from regent.cli.dashboard import add_parser as _dashboard_parser

    _dashboard_parser(sub)
    jr = sub.add_parser("journal", help="inspect a session's journal")
    jr.add_argument("--journal", default=os.environ.get("REGENT_JOURNAL"),
                    help="etcd://host:port, etcds://host:port?ca=..&cert=..&key=.. (TLS; add &user=NAME "
                         "with $REGENT_ETCD_PASSWORD for etcd auth) or sqlite:///path (default: the embedded store)")
    jsub = jr.add_subparsers(dest="journal_command", required=True)
    jsub.add_parser("ls", help="list sessions")
    show = jsub.add_parser("show", help="a readable timeline of a session")
    show.add_argument("session")
    show.add_argument("--actor", help="only calls to this actor mesh")
    show.add_argument("--endpoint", help="only calls of this endpoint")
    show.add_argument("--errors", action="store_true", help="only errors, supervision events and timeouts")
    show.add_argument("--since", help="unix time or ISO time")
    show.add_argument("--until", help="unix time or ISO time")
    verify = jsub.add_parser("verify", help="check checksums, contiguity and epochs; non-zero exit on a defect")
    verify.add_argument("session")
    compact = jsub.add_parser("compact", help="delete log records covered by the latest checkpoint")
    compact.add_argument("session")
    repair = jsub.add_parser(
        "repair", help="drop a torn tail (the damaged last batches) that stops the session from resuming",
        description="Drop SESSION's torn tail: the stored batches from the first one that fails to decode "
                    "to the end of the log, none of which decodes. Prints what it drops (lsns, record kinds "
                    "where readable, bytes). Refused, non-zero exit, while a live controller leads the "
                    "session, or when the log has any other damage (which it names).")
    repair.add_argument("session")
    repair.add_argument("--dry-run", action="store_true", help="show what it would drop; change nothing")
    export = jsub.add_parser("export", help="a session as a Perfetto trace (ui.perfetto.dev) or JSON lines")
    export.add_argument("session")
    export.add_argument("--format", choices=("perfetto", "jsonl"), default="perfetto")
    export.add_argument("-o", "--output", help="file to write (default: stdout)")
    replay = jsub.add_parser(
        "replay", help="re-run a controller program against a session's journal with no workers (audit); "
                       "without SESSION, against every session of a store or of the journals in a directory",
        description="Re-run PROGRAM against the recorded journal of SESSION: every result comes from the "
                    "journal, no process is started and no socket opened. Exits 0 if the program makes the "
                    "recorded calls in order, 1 with the first divergence otherwise. Arguments for the program "
                    "go after --, as it ran: regent journal replay S --program p.py -- --session S. Without "
                    "SESSION (a CI check of a changed program): every session of --journal whose name starts "
                    "with --prefix, or of every *.db journal under --journal DIR, one line each; {session} in "
                    "the program's arguments stands for each session's name; exit 1 if any fails, 2 if none "
                    "was found")
    from regent.cli.replay import add_arguments as _replay_arguments

    _replay_arguments(replay)
    for sp in (show, verify, compact, repair, export, replay):
        sp.add_argument("--journal", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return p


_COMMANDS = {"host": _cmd_host, "hosts": _cmd_hosts, "keys": _cmd_keys, "demo": _cmd_demo, "run": _cmd_run, "journal": _cmd_journal,
             "chaos": _cmd_chaos, "launch": _cmd_launch, "upgrade": _cmd_upgrade, "status": _cmd_status,
             "dashboard": _cmd_dashboard}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if argv and argv[0] in ("host", "demo"):
        args, rest = parser.parse_args(argv[:1]), argv[1:]
    elif argv and argv[0] == "run":
        args, rest = parser.parse_known_args(argv)
    elif argv and argv[0] in ("journal", "launch", "upgrade") and "--" in argv:  # the program's own arguments
        cut = argv.index("--")
        args, rest = parser.parse_args(argv[:cut]), argv[cut + 1:]
    else:
        args, rest = parser.parse_args(argv), []
    return _COMMANDS[args.command](args, rest)


if __name__ == "__main__":
    sys.exit(main())
