#!/usr/bin/env bash
# The cost of a first GPU call: with empty kernel caches (CuPy's and xmesh's, fresh temporary folders),
# time `xmesh reconstruct` on the demo inputs in fp32 (cold), then fp16 right after (its own kernels
# still to build), then fp32 again (warm). Each is a new process, timed from start to exit.
#
#   bash scripts/first_gpu_call.sh [DEMO_DIR] [OUT_DIR]
#
# DEMO_DIR holds plane1.png plane2.png plane3.png cameras.txt (default: ../shared/demo); each run's
# stderr (the compile line, per-compilation traces) goes to OUT_DIR (default: a temporary folder).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
demo="${1:-$here/../../shared/demo}"
out="${2:-$(mktemp -d)}"
mkdir -p "$out"
export CUPY_CACHE_DIR="$(mktemp -d)" XMESH_KERNEL_CACHE_DIR="$(mktemp -d)"
echo "caches: CUPY_CACHE_DIR=$CUPY_CACHE_DIR XMESH_KERNEL_CACHE_DIR=$XMESH_KERNEL_CACHE_DIR (empty)"
run=0
for precision in fp32 fp16 fp32; do
    run=$((run + 1))
    start=$(date +%s.%N)
    python3 "$here/trace_compiles.py" --json "$out/call${run}_${precision}.json" -- reconstruct \
        "$demo/plane1.png" "$demo/plane2.png" "$demo/plane3.png" --cameras "$demo/cameras.txt" \
        --weights synthetic:1 --backend cupy --precision "$precision" --out "$out/mesh${run}.obj" \
        2> "$out/call${run}_${precision}.log" >/dev/null || echo "call $run ($precision) FAILED: see $out/call${run}_${precision}.log"
    end=$(date +%s.%N)
    wall=$(python3 -c "print(f'{$end - $start:.2f}')")
    summary=$(grep "NVRTC compilations" "$out/call${run}_${precision}.log" || true)
    echo "call $run ($precision): $wall s wall; $summary"
    grep "^xmesh: compiling" "$out/call${run}_${precision}.log" || true
done
echo "cache folders now: $(du -sh "$CUPY_CACHE_DIR" | cut -f1) (CuPy), $(du -sh "$XMESH_KERNEL_CACHE_DIR" | cut -f1) (xmesh), $(ls "$XMESH_KERNEL_CACHE_DIR" | wc -l) xmesh files"
