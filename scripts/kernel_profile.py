"""Per-kernel GPU time of each benchmark stage, read by Nsight Compute (device only).

    ncu --csv --page raw --nvtx --profile-from-start off --cache-control none --clock-control none \
        --metrics gpu__time_duration.sum python3 scripts/kernel_profile.py 1 [fp16] > prof.csv
    python3 scripts/kernel_profile.py --report prof.csv

The first form runs every leaf stage of the benchmark once untimed, then once more inside the
profiler with an NVTX range per stage. The second sums ``gpu__time_duration`` per stage and per
kernel (name and grid), so launch-bound stages (many short kernels) and slow kernels stand out.
"""
from __future__ import annotations

import csv
import sys
from collections import defaultdict

LEAF_STAGES = ("cnn_stage1", "graph_projection", "graph_block_1", "graph_block_2", "graph_block_3",
               "cnn_stage2", "local_projection", "drb_1", "drb_2")


def profile(batch: int, precision: str = "fp32") -> None:
    import cupy

    from xmesh.benchmarking import Workload

    work = Workload("cupy", batch=batch, precision=precision)
    work.prepare(*LEAF_STAGES)
    for name in LEAF_STAGES:
        work.stage(name)()
    cupy.cuda.runtime.deviceSynchronize()
    cupy.cuda.profiler.start()
    for name in LEAF_STAGES:
        cupy.cuda.nvtx.RangePush(name)
        work.stage(name)()
        cupy.cuda.nvtx.RangePop()
    cupy.cuda.profiler.stop()


def report(path: str, top: int = 12) -> None:
    with open(path, newline="") as fh:
        lines = [line for line in fh if line.startswith('"')]
    rows = list(csv.reader(lines))
    header, rows = rows[0], rows[2:]          # the second row holds the units
    col = {name: i for i, name in enumerate(header)}
    nvtx = next(i for name, i in col.items() if name.startswith("thread Domain"))
    stage_total, stage_count = defaultdict(float), defaultdict(int)
    per_kernel = defaultdict(lambda: [0.0, 0])
    for row in rows:
        stage = next((s for s in LEAF_STAGES if s in row[nvtx]), "?")
        ns = float(row[col["gpu__time_duration.sum"]].replace(",", ""))
        kernel = row[col["Kernel Name"]].split("(")[0][:48]
        stage_total[stage] += ns
        stage_count[stage] += 1
        entry = per_kernel[(stage, kernel, row[col["Grid Size"]])]
        entry[0] += ns
        entry[1] += 1
    print(f"{'stage':<18}{'kernels':>8}{'GPU ms':>10}")
    for stage in LEAF_STAGES:
        print(f"{stage:<18}{stage_count[stage]:>8}{stage_total[stage] / 1e6:>10.3f}")
    print(f"{'sum':<18}{sum(stage_count.values()):>8}{sum(stage_total.values()) / 1e6:>10.3f}")
    for stage in LEAF_STAGES:
        items = sorted(((v, k) for k, v in per_kernel.items() if k[0] == stage), reverse=True)[:top]
        print(f"\n{stage}")
        for (ns, count), (_, kernel, grid) in items:
            print(f"  {ns / 1e6:8.3f} ms {count:4d}x  {kernel:<48} grid {grid}")


if __name__ == "__main__":
    if sys.argv[1] == "--report":
        report(sys.argv[2])
    else:
        profile(int(sys.argv[1]), *sys.argv[2:3])
