#!/usr/bin/env bash
# The full test suite (what CI runs), installing what it needs first (Python deps, etcd,
# Toxiproxy, Porcupine, namespace tools, Slurm, sshd).
#
# Most tests wait (TTLs, leases, restarts) rather than compute, so they run in parallel:
# REGENT_TEST_WORKERS pytest-xdist workers (default 6 on this 2-core machine), each taking whole
# files, longest first (tests/conftest.py). Tests marked `serial` (timing under load, the random
# chaos mixes) then run alone. Arguments go to both pytest runs.
set -uo pipefail
cd "$(dirname "$0")/.."
set -e
scripts/bootstrap.sh
scripts/install_etcd.sh
scripts/install_toxiproxy.sh
scripts/install_porcupine.sh
scripts/install_netns_tools.sh
scripts/install_slurm.sh
scripts/install_sshd.sh
scripts/install_chromium.sh
export PATH="$PWD/.tools/bin:$PATH"
scripts/lint.sh
set +e

workers=${REGENT_TEST_WORKERS:-6}
start=$(date +%s)
# The slowest tests are listed at the end of each part: the suite must stay under 30 min here.
.venv/bin/python -m pytest -q --durations=15 -n "$workers" --dist loadfile -m "not serial" "$@"
parallel=$?
if [ "$parallel" -eq 1 ]; then
  # A test that failed beside the other workers runs again, alone: one that passes then failed
  # only under the machine's load. It is named here, as a bug of its own to fix (a bound that
  # load breaks); one that fails alone too fails the suite.
  echo "test suite: these failed with $workers workers beside them; running them again alone:" >&2
  .venv/bin/python -m pytest -q -p no:xdist --lf --last-failed-no-failures none -m "not serial" "$@"
  parallel=$?
  [ "$parallel" -eq 0 ] && echo "test suite: FLAKY UNDER LOAD: the tests above failed beside the other workers and passed alone" >&2
fi
.venv/bin/python -m pytest -q --durations=15 -p no:xdist -m serial "$@"
serial=$?
echo "test suite: $(( $(date +%s) - start )) s (parallel part exit $parallel, serial part exit $serial)"
# pytest exits 5 when a selection holds no test (a run narrowed by arguments): not a failure.
for rc in $parallel $serial; do
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then exit "$rc"; fi
done
if [ "$parallel" -eq 5 ] && [ "$serial" -eq 5 ]; then
  echo "no test ran" >&2
  exit 5
fi
exit 0
