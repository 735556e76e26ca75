"""The `regent` command line: host agents, keys, running programs, the demo and journal tools."""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _cmd_host(args: argparse.Namespace, rest: list[str]) -> int:
    from worker.host import main as host_main

    host_main(rest)
    return 0


def _cmd_keys(args: argparse.Namespace, rest: list[str]) -> int:
    from worker.security import init_keys

    d = init_keys(force=args.force)
    print(f"CURVE keys in {d}: copy this folder to every host, then set REGENT_SECURE=1")
    return 0


def _cmd_demo(args: argparse.Namespace, rest: list[str]) -> int:
    program = REPO / "examples" / "quickstart.py"
    sys.argv = [str(program), *rest]
    runpy.run_path(str(program), run_name="__main__")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="regent", description="regent: a fault-tolerant controller for PyTorch clusters")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("host", help="run this machine's host agent (options: regent host --help)", add_help=False)
    keys = sub.add_parser("keys", help="CURVE keys for non-loopback clusters")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    init = keys_sub.add_parser("init", help="create the cluster keypair in $REGENT_HOME/keys")
    init.add_argument("--force", action="store_true", help="replace existing keys")
    sub.add_parser("demo", help="run the main job (see README)", add_help=False)
    return p


_COMMANDS = {"host": _cmd_host, "keys": _cmd_keys, "demo": _cmd_demo}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if argv and argv[0] in ("host", "demo"):
        args, rest = parser.parse_args(argv[:1]), argv[1:]
    else:
        args, rest = parser.parse_args(argv), []
    return _COMMANDS[args.command](args, rest)


if __name__ == "__main__":
    sys.exit(main())
