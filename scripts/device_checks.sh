#!/usr/bin/env bash
# GPU checks on a borrowed device, in parts that each fit one device call:
#   bash scripts/device_checks.sh tests      # GPU tests (golden agreement on CuPy included)
#   bash scripts/device_checks.sh tests16    # the 16-bit modes' chained layers and their one-layer reference
#   bash scripts/device_checks.sh precision  # each precision mode's error against the golden data
#   bash scripts/device_checks.sh bench      # `xmesh bench` (CuPy b=1/16/64 and NumPy b=1 in one run)
#   bash scripts/device_checks.sh profile    # per-kernel roofline tables under Nsight Compute (ncu on the PATH)
#   bash scripts/device_checks.sh serve      # xmesh serve's GPU tests (a real server on the GPU, fp32 and fp16)
#   bash scripts/device_checks.sh train      # training: the layer pairs' float64 checks and the golden steps on
#                                            # CuPy, where a stage-2 step's time goes, then its samples/s table
# Expects: .whl/base (the array-api-compat wheel), for `serve` also .whl/serve (litserve, fastapi, starlette,
# uvicorn, pydantic, pydantic-core, pyzmq, python-multipart and what they need that the machine lacks:
# typing-inspection, annotated-doc, annotated-types, typing-extensions, opentelemetry-api), and
# .devdata/shared (golden + demo copies).
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/base/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
export XMESH_SHARED=$PWD/.devdata/shared
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
case "${1:-tests}" in
tests)
  XMESH_TEST_BACKEND=cupy timeout 560 python3 -m pytest -q -p no:cacheprovider tests/test_tc_gemm.py \
    tests/test_golden.py tests/test_cupy_backend.py tests/test_metrics_gpu.py tests/test_out_of_memory.py \
    tests/test_model.py tests/test_drb32h.py tests/test_kernel_sources.py tests/test_kernel_cache.py \
    tests/test_branches.py tests/test_pinned_upload.py tests/test_kernel_manifest.py tests/test_kernel_constants.py \
    tests/test_plan.py tests/test_stage_kernels.py tests/test_pipeline.py tests/test_eval.py --durations=30 2>&1 | tee "$OUT/gpu_tests.log" | tail -4
  ;;
tests16)
  XMESH_TEST_BACKEND=cupy timeout 560 python3 -m pytest -q -p no:cacheprovider tests/test_drb16_reference.py \
    tests/test_drb16_chain.py --durations=10 2>&1 | tee "$OUT/gpu_tests16.log" | tail -4
  ;;
precision)
  timeout 300 python3 scripts/precision_errors.py fp32 tf32 fp16 bf16 2>&1 | tail -6
  ;;
bench)
  timeout 560 python3 -m xmesh bench --backend all --batch-sizes 1 16 64 --repeat 5 --json > "$OUT/bench.json" 2> "$OUT/bench.err"
  python3 - "$OUT/bench.json" <<'PY'
import json, sys
from xmesh.benchmarking import format_table
print(format_table(json.load(open(sys.argv[1]))))
PY
  ;;
serve)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/serve/*.whl >/dev/null 2>&1
  XMESH_TEST_BACKEND=cupy timeout 560 python3 -m pytest -q -p no:cacheprovider tests/test_serve.py -m gpu \
    --durations=10 2>&1 | tee "$OUT/gpu_serve.log" | tail -30
  ;;
train)
  XMESH_TEST_BACKEND=cupy timeout 170 python3 -m pytest -q -s -p no:cacheprovider tests/test_train_layers.py \
    tests/test_train_losses.py tests/test_train_drb.py tests/test_train_adam.py tests/test_train_products.py \
    tests/test_train_layer_kernels.py tests/test_train_golden*.py -k "cupy or golden or layer_kernels" \
    --durations=8 > "$OUT/gpu_train_tests.log" 2>&1
  grep -iE "^stage|^s[12] |products.matmul|passed|failed|error" "$OUT/gpu_train_tests.log" | tail -30
  XMESH_TEST_BACKEND=cupy timeout 120 python3 -m pytest -q -s -p no:cacheprovider tests/test_train_graph_step.py \
    tests/test_cublas_gemm.py > "$OUT/gpu_graph_tests.log" 2>&1
  grep -E "^.?step [0-9]|passed|failed|error" "$OUT/gpu_graph_tests.log" | tail -8
  timeout 60 python3 scripts/weight_gradient_bench.py --batch 32 --repeat 5 2>&1 | tee "$OUT/weight_gradient_bench.txt"
  timeout 100 python3 scripts/train_profile.py --backend cupy --batch-sizes 1 32 --steps 3 --compare 2>&1 | tee "$OUT/train_profile.txt"
  timeout 200 python3 scripts/train_bench.py --backend cupy --batch-sizes 1 32 --steps 10 ${TRAIN_BENCH_ARGS:---no-command} \
    2>&1 | tee "$OUT/train_bench.txt" | tail -6
  ;;
profile)
  python3 scripts/kernel_profile.py --modes --budget 540 --out "$OUT/profile" 2>&1 | tail -150
  ;;
esac
