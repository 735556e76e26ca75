#!/usr/bin/env bash
# hipcore on a real GPU: the hipcore test-suite with the GPU backend forced, then the
# RDMA benchmark. Needs a CUDA or ROCm build of torch and at least one visible GPU.
# Budget: under 5 minutes (tests ~2-3 min, benchmark ~1 min). Run from anywhere:
#     bash bench/gpu_check.sh            # results in $OUT (default: ./gpu_check_out)
# Exit status: 0 all passed, 2 no GPU, otherwise the failing step's status.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=${OUT:-gpu_check_out}
mkdir -p "$OUT"

flavour=$("$PY" - <<'PYEOF'
import torch
if not torch.cuda.is_available():
    print("none")
else:
    print("hip" if torch.version.hip else "cuda")
PYEOF
)
if [[ "$flavour" == "none" ]]; then
    echo "gpu_check: torch.cuda.is_available() is False: no GPU visible; nothing to check" >&2
    exit 2
fi

export REGENT_HIPCORE_BACKEND="$flavour"
export REGENT_HIPCORE_RDMA_ADDR=127.0.0.1
{
    echo "backend: $flavour"
    "$PY" -c "from regent import hipcore; i = hipcore.backend(); print(i.name, '|', i.reason)"
    "$PY" -c "import torch; print(torch.__version__, [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])"
    (command -v nvidia-smi >/dev/null && nvidia-smi -L) || (command -v rocm-smi >/dev/null && rocm-smi --showproductname) || true
} 2>&1 | tee "$OUT/env.txt"

status=0
echo "== hipcore tests, REGENT_HIPCORE_BACKEND=$flavour"
timeout 240 "$PY" -m pytest tests/hipcore -q -p no:cacheprovider --timeout 120 \
    --junitxml="$OUT/hipcore-tests.xml" 2>&1 | tee "$OUT/hipcore-tests.txt"
rc=${PIPESTATUS[0]}
[[ $rc -ne 0 ]] && status=$rc

echo "== RDMA benchmark"
timeout 150 "$PY" bench/bench_rdma.py --sizes-mib 1 64 1024 --tcp-mib 64 --reps 3 \
    >"$OUT/bench_rdma.json" 2>"$OUT/bench_rdma.stderr"
rc=$?
cat "$OUT/bench_rdma.json"
[[ $rc -ne 0 && $status -eq 0 ]] && status=$rc

echo "gpu_check: exit $status (outputs in $OUT/)"
exit $status
