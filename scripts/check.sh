#!/usr/bin/env bash
# The fast tier for everyday work (under 3 minutes here): lint, the import contracts, and the
# tests that need no cluster: the engines and cores, the journal on SQLite and a single etcd,
# the wire's decoders (fuzzed with fewer examples), the chaos tools, hipcore on the CPU backend,
# and the quick runtime tests on one machine. Tests marked `slow` are left to `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
scripts/install_etcd.sh
scripts/install_toxiproxy.sh
scripts/install_porcupine.sh
export PATH="$PWD/.tools/bin:$PATH"
scripts/lint.sh
export REGENT_FUZZ_EXAMPLES=${REGENT_FUZZ_EXAMPLES:-40}
exec .venv/bin/python -m pytest -q --durations=10 -n "${REGENT_TEST_WORKERS:-4}" --dist loadfile \
  -m "not slow and not serial" \
  tests/runtime/test_engine.py tests/runtime/test_dedupe_cache.py tests/runtime/test_replay_index.py \
  tests/runtime/test_core_watermark.py tests/runtime/test_fence_store.py tests/runtime/test_drive.py \
  tests/runtime/test_port_order.py tests/runtime/test_exit_status.py tests/runtime/test_endpoints.py \
  tests/runtime/test_handoff_signal.py tests/runtime/test_class_loading.py tests/runtime/test_proc_core.py \
  tests/runtime/test_host_requests.py tests/runtime/test_many_peers.py \
  tests/journal tests/fuzz tests/chaos_infra tests/hipcore tests/packaging/test_one_name.py "$@"
