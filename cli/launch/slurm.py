"""`regent launch slurm`: an sbatch script that runs a regent job on a Slurm allocation.

One `regent host` agent per node (`srun --ntasks-per-node=1`), joined to a cluster named
after the job; the primary controller in the batch step (on the first node); with
`--standby`, a standby on the second node (`srun --overlap -N1 -w NODE`); the journal in the
etcd `--journal` names, or, without one, a single etcd member on the first node that lives
as long as the job. The job's exit status is the program's (the controller that ended the
run: one deposed or killed while a standby carries on does not count).
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

from regent.cli.launch.common import (
    KILLED,
    LaunchError,
    check_journal,
    check_keys,
    check_program,
    etcd_command,
    say,
)
from regent.controller.session import DEPOSED_EXIT_STATUS

PROG = "regent launch slurm"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("program", help="the controller program (PROGRAM.py); arguments after it go to it")
    p.add_argument("--nodes", "-N", type=int, required=True, help="nodes to allocate: one host agent on each")
    p.add_argument("--gpus-per-node", type=int, default=None, help="GPUs per node (#SBATCH --gpus-per-node)")
    p.add_argument("--standby", action="store_true", help="a standby controller on the second node")
    p.add_argument("--journal", default=None,
                   help="etcd://HOST:2379[,...] for the journal (default: one etcd member on the first "
                        "node, for the job's life only)")
    p.add_argument("--partition", "-p", default=None)
    p.add_argument("--time", "-t", default=None, help="time limit, as sbatch takes it (e.g. 4:00:00)")
    p.add_argument("--job-name", default=None, help="default: regent-<program>")
    p.add_argument("--output", "-o", default=None, help="the job's output file (default slurm-%%j.out)")
    p.add_argument("--cluster", default=None, help="the regent cluster name (default slurm-<job id>)")
    p.add_argument("--etcd-port", type=int, default=2379, help="the job's own etcd client port (default 2379)")
    p.add_argument("--python", default=sys.executable, help="the Python that runs regent on the nodes "
                   "(default: this one; the nodes must share its path, as a shared file system gives)")
    p.add_argument("--sbatch-arg", action="append", default=[], metavar="ARG",
                   help="another #SBATCH line, e.g. --sbatch-arg=--account=ml (repeatable)")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--submit", action="store_true", help="submit the script with sbatch")
    how.add_argument("--print", action="store_true", help="print the script (the default)")


def render(a: argparse.Namespace, program: Path, args: list[str]) -> str:
    """The sbatch script for these options."""
    from regent.wire.security import regent_home

    if a.nodes < 1:
        raise LaunchError(f"--nodes {a.nodes}: a job needs at least one node")
    heads = [f"--job-name={a.job_name or 'regent-' + program.stem}", f"--nodes={a.nodes}", "--ntasks-per-node=1"]
    heads += [f"--partition={a.partition}"] * bool(a.partition) + [f"--time={a.time}"] * bool(a.time)
    heads += [f"--gpus-per-node={a.gpus_per_node}"] * bool(a.gpus_per_node)
    heads += [f"--output={a.output}"] * bool(a.output) + list(a.sbatch_arg)
    q = shlex.quote
    py, cmd = q(a.python), " ".join(q(x) for x in [str(program), *args])
    etcd = etcd_command('"$ETCD_DIR"', '"$ADDR0"', a.etcd_port, name='"regent-$SLURM_JOB_ID"')
    etcd_line = " ".join(x if x.startswith('"') or "$" in x else q(x) for x in etcd)
    standby = ("srun --overlap --nodes=1 --ntasks=1 -w \"$STANDBY_NODE\" " + f"{py} {cmd} &\nCTL+=($!)\n"
               'say "standby controller on $STANDBY_NODE"') if a.standby else ""
    journal = a.journal or ""
    lines = ["#!/bin/bash", *(f"#SBATCH {h}" for h in heads), f"""\
# Written by `regent launch slurm`: one regent host agent per node, the primary controller in
# this batch step, {"a standby controller on the second node, " if a.standby else ""}the journal in etcd.
set -uo pipefail
say() {{ echo "regent: $*" >&2; }}
export REGENT_HOME={q(str(regent_home()))}
export REGENT_SECURE=1 PYTHONUNBUFFERED=1
export REGENT_CLUSTER={q(a.cluster) if a.cluster else '"slurm-$SLURM_JOB_ID"'}
mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
STANDBY_NODE="${{NODES[1]:-${{NODES[0]}}}}"
node_addr() {{  # a node's address as Slurm reaches it (its NodeAddr), as a literal IP
  local a
  a=$(scontrol show node "$1" -o | sed -n 's/.*NodeAddr=\\([^ ]*\\).*/\\1/p')
  getent ahostsv4 "${{a:-$1}}" | awk 'NR == 1 {{ print $1 }}'
}}
CTL=()
AGENTS=
ETCD_PID=
ETCD_DIR=
cleanup() {{
  for p in "${{CTL[@]}}" $AGENTS; do kill -TERM "$p" 2>/dev/null; done
  for p in "${{CTL[@]}}" $AGENTS; do wait "$p" 2>/dev/null; done
  if [ -n "$ETCD_PID" ]; then kill -TERM "$ETCD_PID" 2>/dev/null; wait "$ETCD_PID" 2>/dev/null; fi
  if [ -n "$ETCD_DIR" ]; then rm -rf "$ETCD_DIR"; fi
}}
trap cleanup EXIT
trap 'exit 143' TERM INT
JOURNAL={q(journal)}
if [ -z "$JOURNAL" ]; then
  ADDR0=$(node_addr "${{NODES[0]}}")
  ETCD_DIR=$(mktemp -d "${{TMPDIR:-/tmp}}/regent-etcd-$SLURM_JOB_ID.XXXXXX")
  {etcd_line} >"$ETCD_DIR/etcd.log" 2>&1 &
  ETCD_PID=$!
  JOURNAL="etcd://$ADDR0:{a.etcd_port}"
  say "journal $JOURNAL: one etcd member on ${{NODES[0]}} that lives as long as this job (its journal ends with the job; give --journal for one that outlives it)"
fi
export REGENT_JOURNAL="$JOURNAL"
{py} -m regent.cli launch wait --store "$REGENT_JOURNAL" --timeout 60 || exit 1
srun --overlap --nodes="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 --kill-on-bad-exit=0 \\
  {py} -m regent.cli host --cluster "$REGENT_CLUSTER" --store "$REGENT_JOURNAL" --advertise auto &
AGENTS=$!
{py} -m regent.cli launch wait --store "$REGENT_JOURNAL" --cluster "$REGENT_CLUSTER" \\
  --hosts "$SLURM_JOB_NUM_NODES" --timeout 120 || exit 1
say "host agents of cluster $REGENT_CLUSTER on ${{NODES[*]}}; primary controller on ${{NODES[0]}} (the batch step)"
{py} {cmd} &
CTL+=($!)
{standby}
# The run is over when a controller ends it: one deposed ({DEPOSED_EXIT_STATUS}) or killed ({KILLED[1]}) while
# another still runs does not; the standby carries the run on.
status=1
while [ "${{#CTL[@]}}" -gt 0 ]; do
  wait -n -p done "${{CTL[@]}}"
  status=$?
  left=()
  for p in "${{CTL[@]}}"; do [ "$p" != "$done" ] && left+=("$p"); done
  CTL=("${{left[@]}}")
  if [ "${{#CTL[@]}}" -gt 0 ] && {{ [ "$status" -eq {DEPOSED_EXIT_STATUS} ] || [ "$status" -eq {KILLED[1]} ]; }}; then
    say "controller $done ended with status $status (deposed or killed); a standby carries the run on"
    continue
  fi
  break
done
say "the run ended with status $status"
exit "$status"
"""]
    return "\n".join(lines)


def run(a: argparse.Namespace, rest: list[str]) -> int:
    try:
        program = check_program(a.program)
        check_keys()
        if a.journal:
            check_journal(a.journal)
        script = render(a, program, rest)
        if not a.submit:
            print(script, end="")
            return 0
        return _submit(script, a)
    except LaunchError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2


def _submit(script: str, a: argparse.Namespace) -> int:
    try:
        done = subprocess.run(["sbatch", "--parsable"], input=script, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise LaunchError("sbatch is not installed here: run on a Slurm login node, or use --print") from None
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or ["no reason given"])[-1].removeprefix("sbatch: error: ")
        raise LaunchError(f"sbatch refused the job: {why}")
    job = done.stdout.strip().split(";")[0]
    say(PROG, f"submitted job {job}: {a.nodes} node(s), one host agent each"
        f"{', a standby on the second node' if a.standby else ''}; journal "
        f"{a.journal or 'a single etcd member on the first node, for the job only'}")
    print(job)
    return 0
