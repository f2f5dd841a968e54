#!/usr/bin/env bash
# GPU checks on a borrowed device: GPU tests (golden agreement on CuPy included) and `xmesh bench`.
# Expects: .whl/asv (array-api-compat, asv wheels) and .devdata/shared (golden + demo copies).
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/asv/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || true
export XMESH_SHARED=$PWD/.devdata/shared
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
XMESH_TEST_BACKEND=cupy python3 -m pytest -q -p no:cacheprovider tests/test_golden.py tests/test_cupy_backend.py \
  tests/test_metrics_gpu.py tests/test_model.py 2>&1 | tee "$OUT/gpu_tests.log" | tail -5
python3 -m pytest -q -p no:cacheprovider tests/test_eval.py -k "cuda or cupy" 2>&1 | tail -2
python3 -m xmesh bench --backend all --batch-sizes 1 16 64 --repeat 5 --json > "$OUT/bench.json" 2> "$OUT/bench.err"
python3 - "$OUT/bench.json" <<'PY'
import json, sys
from xmesh.benchmarking import format_table
print(format_table(json.load(open(sys.argv[1]))))
PY
