"""Per-kernel roofline of the benchmark's stages, read by Nsight Compute (the profiled run needs a GPU).

    python3 scripts/kernel_profile.py --modes [fp16-b64 fp32-b1 fp32-b64] [--out DIR] [--budget S]
    python3 scripts/kernel_profile.py --report prof.csv [--meta prof.json]
    python3 scripts/kernel_profile.py 64 fp16 [--meta prof.json]       # the program ncu profiles

``--modes`` runs each mode (precision, batch) under ``ncu`` in turn, one process each, within
``--budget`` seconds in all, and writes to DIR ($OUT/profile when $OUT is set): MODE.csv (ncu's
``--csv --page raw`` output), MODE.json (batch, precision, device, FLOP of each stage), MODE.log
(ncu's and the program's messages), MODE.md (the tables) and roofline.md (every mode's tables).
``--report`` prints the tables of one CSV.

The profiled program runs every stage of ``PROFILED_STAGES`` once untimed (kernel compilation,
warm caches), then once more between ``cudaProfilerStart`` / ``Stop`` with an NVTX range per stage:
Nsight Compute replays each kernel of that second run once per metric pass. ``local_projection`` is
left out: drb_1 and drb_2 run their own local projection, whose kernels appear in their rows.

The tables: per kernel (name, within a stage) above 3% of the mode's GPU time, its time, useful
TFLOP/s against the tensor-core peak of its instruction, DRAM bytes and bandwidth, SM and memory
throughput (the SpeedOfLight section's two figures), the limiter those imply, and two floors with
how far the kernel is from each: its work's (useful FLOP at the tensor pipe's peak, or DRAM bytes at
full bandwidth, whichever is longer: no design doing this work beats it) and its busiest unit's (the
time at 100% of the busiest unit measured: what this design could reach); then per-stage totals
and the mode's time at every kernel's floors. Peaks, FLOP attribution and limiter rules are
described where they are defined below and in docs/PERFORMANCE.md ("Per kernel").
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROFILED_STAGES = (
    "cnn_stage1",
    "graph_projection",
    "graph_block_1",
    "graph_block_2",
    "graph_block_3",
    "cnn_stage2",
    "drb_1",
    "drb_2",
)
MODES = {"fp16-b64": ("fp16", 64), "fp32-b1": ("fp32", 1), "fp32-b64": ("fp32", 64)}  # in the order run
SHARE_CUT = 0.03  # kernels below this share of a mode's GPU time stay out of the roofline table
DRAM_PEAK_GBS = 3350.0  # H100 SXM HBM3; a device-to-device copy measured about 3,000 GB/s

# ---------------------------------------------------------------------------- metrics
TIME = "gpu__time_duration.sum"
DRAM_READ, DRAM_WRITE = "dram__bytes_read.sum", "dram__bytes_write.sum"
SM_PCT = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
MEM_PCT = "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"
MEMORY_UNITS = {
    "DRAM": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "L2": "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "L1": "l1tex__throughput.avg.pct_of_peak_sustained_elapsed",
}
WAVES = "launch__waves_per_multiprocessor"
TENSOR_CYCLES = "sm__pipe_tensor_cycles_active.sum"
GMMA_INST, HMMA_INST = "sm__inst_executed_pipe_tensor_op_gmma.sum", "sm__inst_executed_pipe_tensor_op_hmma.sum"
STALL_REASONS = (
    "barrier",
    "branch_resolving",
    "dispatch_stall",
    "drain",
    "lg_throttle",
    "long_scoreboard",
    "math_pipe_throttle",
    "membar",
    "mio_throttle",
    "misc",
    "no_instruction",
    "not_selected",
    "short_scoreboard",
    "sleeping",
    "tex_throttle",
    "wait",
)
HOPPER_STALL_REASONS = ("gmma", "imc_miss")  # gmma: waiting on warpgroup MMAs
STALLS = {
    reason: f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio"
    for reason in STALL_REASONS + HOPPER_STALL_REASONS
}

# What the table needs (a run without these is refused), then groups that add detail: a group
# whose metrics this Nsight Compute does not know is left out as a whole (``probe_metrics``).
CORE_METRICS = (TIME, DRAM_READ, DRAM_WRITE, SM_PCT, MEM_PCT)
OPTIONAL_METRICS = {
    "memory units and waves": (*MEMORY_UNITS.values(), WAVES),
    "tensor pipe cycles": (TENSOR_CYCLES,),
    "tensor instructions": (GMMA_INST, HMMA_INST),
    "warp stalls": tuple(STALLS[reason] for reason in STALL_REASONS),
    "Hopper warp stalls": tuple(STALLS[reason] for reason in HOPPER_STALL_REASONS),
}
NCU_FLAGS = ("--nvtx", "--cache-control", "none", "--clock-control", "none", "--csv", "--page", "raw")
UNITS_FLAGS = ("--print-units", "base")


# ---------------------------------------------------------------------------- analytic work
def stage_flops(counts: dict[str, float]) -> dict[str, float]:
    """FLOP per sample of each profiled stage, from ``xmesh.benchmarking.flop_counts``'s parts (a part's
    name is the stage that runs it; stages without a part, such as the projections, do 0)."""
    return {stage: float(counts.get(stage, 0.0)) for stage in PROFILED_STAGES}


# ---------------------------------------------------------------------------- the profiled program
def profile(batch: int, precision: str = "fp32", meta_path: str | None = None) -> None:
    """Run every profiled stage once, then once more inside the profiler's range with NVTX ranges."""
    import cupy

    from xmesh.benchmarking import Workload

    work = Workload("cupy", batch=batch, precision=precision)
    work.prepare(*PROFILED_STAGES)
    for name in PROFILED_STAGES:
        work.stage(name)()
    cupy.cuda.runtime.deviceSynchronize()
    # less device memory for the profiler to save and restore around every replayed kernel
    cupy.get_default_memory_pool().free_all_blocks()
    if meta_path:
        per_sample = stage_flops(work.flop)
        meta = {
            "precision": precision,
            "batch": batch,
            "device": work.device(),
            "stages": list(PROFILED_STAGES),
            "flop_per_call": {stage: flop * batch for stage, flop in per_sample.items()},
            "flop_per_sample": work.flop["total"],
        }
        write_text(meta_path, json.dumps(meta, indent=1) + "\n")
    cupy.cuda.profiler.start()
    for name in PROFILED_STAGES:
        cupy.cuda.nvtx.RangePush(name)
        work.stage(name)()
        cupy.cuda.nvtx.RangePop()
    cupy.cuda.profiler.stop()


def write_text(path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------- reading ncu's CSV
_TIME_NS = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6, "second": 1e9, "s": 1e9}
_PREFIX = {"K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def to_base(text: str, unit: str) -> float | None:
    """A CSV cell as a number in base units (time in nanoseconds, bytes, cycles, %); None when empty or n/a.

    ncu writes thousands separators ("1,234,567") and, unless told ``--print-units base``, scaled
    units ("usecond", "Mbyte")."""
    text = text.strip().replace(",", "")
    if not text or text.lower() in ("n/a", "nan"):
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    unit = unit.strip()
    if unit in _TIME_NS:
        return value * _TIME_NS[unit]
    if len(unit) > 1 and unit[0] in _PREFIX and unit[1:] in ("byte", "cycle", "inst", "sector", "warp", "request"):
        return value * _PREFIX[unit[0]]
    return value


@dataclass
class Launch:
    """One profiled kernel launch: its stage (NVTX range), kernel name and metric values in base units."""

    stage: str
    kernel: str
    values: dict[str, float]


def kernel_label(name: str) -> str:
    """A kernel's name without its return type and parameter list (template arguments kept: a library
    kernel's name is often in them)."""
    name = name.strip()
    if name.startswith("void "):
        name = name[5:]
    depth = 0
    for i, ch in enumerate(name):
        depth += (ch == "<") - (ch == ">")
        if ch == "(" and depth == 0 and i > 0:
            return name[:i].strip()
    return name


def stage_of(nvtx: str) -> str:
    """The profiled stage whose NVTX range a launch ran in ('?' outside every range)."""
    found = [stage for stage in PROFILED_STAGES if stage in nvtx]
    return max(found, key=len) if found else "?"


def read_launches(path) -> list[Launch]:
    """The launches of an ``ncu --csv --page raw`` output: a header row, a units row, a row per launch.
    Lines that are not CSV records (the program's and ncu's messages) are skipped."""
    with open(path, newline="") as fh:
        lines = [line for line in fh if line.startswith('"')]
    rows = list(csv.reader(lines))
    if len(rows) < 2:
        raise ValueError(f"{path}: no ncu CSV records (header and units rows) found")
    header, units, records = rows[0], rows[1], rows[2:]
    col = {name: i for i, name in enumerate(header)}
    if "Kernel Name" not in col or TIME not in col:
        raise ValueError(f"{path}: the header lacks 'Kernel Name' or {TIME}; is it ncu's --page raw output?")
    nvtx = next((i for name, i in col.items() if name.startswith("thread Domain") or "Push/Pop_Range" in name), None)
    known = {
        TIME,
        DRAM_READ,
        DRAM_WRITE,
        SM_PCT,
        MEM_PCT,
        WAVES,
        TENSOR_CYCLES,
        GMMA_INST,
        HMMA_INST,
        *MEMORY_UNITS.values(),
        *STALLS.values(),
    }
    metric_cols = [(name, i) for name, i in col.items() if name in known]
    launches = []
    for row in records:
        if len(row) < len(header):
            continue
        values = {}
        for name, i in metric_cols:
            value = to_base(row[i], units[i] if i < len(units) else "")
            if value is not None:
                values[name] = value
        if TIME not in values:
            continue
        launches.append(
            Launch(stage_of(row[nvtx]) if nvtx is not None else "?", kernel_label(row[col["Kernel Name"]]), values)
        )
    return launches


# ---------------------------------------------------------------------------- instructions and peaks
@dataclass(frozen=True)
class Instruction:
    """A tensor-core instruction form and its H100 SXM dense peak (TFLOP/s of its own products).

    ``products``: tensor products per useful product (3 for 3xTF32 and the fp32 mode's three float16
    products, whose useful rate is a third of the instruction's). ``pipe_peak_tflops``: the tensor
    pipe's own peak for the operand type where the instruction's is only an estimate below it
    (mma.sync): the floors take that, so that no kernel can beat its floor."""

    name: str
    peak_tflops: float
    products: int = 1
    pipe_peak_tflops: float | None = None

    @property
    def useful_peak_tflops(self) -> float:
        return self.peak_tflops / self.products

    @property
    def floor_peak_tflops(self) -> float:
        """The useful rate no kernel with this instruction can exceed (the work floor's)."""
        return (self.pipe_peak_tflops or self.peak_tflops) / self.products

    @property
    def pipe_cost(self) -> float:
        """Tensor-pipe time per useful FLOP relative to one 16-bit product (TF32 runs at half the rate)."""
        return self.products * (2.0 if "tf32" in self.name else 1.0)

    def label(self) -> str:
        times = f" x{self.products}" if self.products > 1 else ""
        return f"{self.name}{times} ({self.useful_peak_tflops:.0f})"


# H100 SXM dense peaks: wgmma 989.4 TFLOP/s in 16 bits, 494.7 in TF32. mma.sync has no published peak
# on Hopper; it is taken as half of wgmma's (kernels/wgmma_gemm.cu: wgmma runs at about twice the rate
# mma.sync reaches on an H100).
WGMMA_F16, WGMMA_BF16, WGMMA_TF32 = 989.4, 989.4, 494.7
MMA_SYNC_TF32 = WGMMA_TF32 / 2

# xmesh's own kernels, by name (kernels/*.cu); the first pattern that matches decides
_OWN_KERNELS = (
    (r"^wg_.*3xf16", Instruction("wgmma f16", WGMMA_F16, 3)),
    (r"^wg_.*bf16", Instruction("wgmma bf16", WGMMA_BF16)),
    (r"^wg_(drb|gemm).*f16", Instruction("wgmma f16", WGMMA_F16)),
    (r"^wg_(drb_layer|gemm)_3x_", Instruction("wgmma tf32", WGMMA_TF32, 3)),
    (r"^wg_(drb_layer|gemm)_1x_", Instruction("wgmma tf32", WGMMA_TF32)),
    (r"^(gemm|conv)_3x_n", Instruction("mma.sync tf32", MMA_SYNC_TF32, 3, WGMMA_TF32)),
    (r"^(gemm|conv)_1x_n", Instruction("mma.sync tf32", MMA_SYNC_TF32, 1, WGMMA_TF32)),
)


def instruction_of(
    kernel: str, gmma: float | None = None, hmma: float | None = None, tensor_cycles: float | None = None
) -> Instruction | None:
    """The tensor-core instruction a kernel's products run on; None for a kernel without any.

    xmesh's kernels by name; others (cuDNN's convolutions, which take float32 with tensor-op math)
    by the tensor-pipe counters, as TF32 (wgmma or mma.sync by the instruction counters; "tensor op"
    where only the pipe's cycles were collected)."""
    for pattern, instruction in _OWN_KERNELS:
        if re.search(pattern, kernel):
            return instruction
    if gmma:
        return Instruction("wgmma tf32", WGMMA_TF32)
    if hmma:
        return Instruction("mma.sync tf32", MMA_SYNC_TF32, 1, WGMMA_TF32)
    if tensor_cycles and gmma is None and hmma is None:
        return Instruction("tensor op tf32", WGMMA_TF32)
    return None


# ---------------------------------------------------------------------------- per-kernel figures
@dataclass
class KernelStats:
    """The launches of one kernel within one stage, summed (time, bytes, counters) or time-weighted."""

    stage: str
    kernel: str
    calls: int = 0
    ns: float = 0.0
    dram_bytes: float = 0.0
    sums: dict = field(default_factory=lambda: defaultdict(float))
    weighted: dict = field(default_factory=lambda: defaultdict(float))
    weight: dict = field(default_factory=lambda: defaultdict(float))
    flop: float = 0.0
    instruction: Instruction | None = None
    busiest_ns: float = 0.0  # sum over launches of time x their busiest unit's share of its peak
    busiest_seen_ns: float = 0.0  # the time of the launches that reported SM and memory throughput

    def add(self, launch: Launch) -> None:
        v = launch.values
        ns = v[TIME]
        self.calls += 1
        self.ns += ns
        self.dram_bytes += v.get(DRAM_READ, 0.0) + v.get(DRAM_WRITE, 0.0)
        if SM_PCT in v and MEM_PCT in v:
            self.busiest_ns += ns * max(v[SM_PCT], v[MEM_PCT]) / 100.0
            self.busiest_seen_ns += ns
        for name in (TENSOR_CYCLES, GMMA_INST, HMMA_INST):
            if name in v:
                self.sums[name] += v[name]
        for name in (SM_PCT, MEM_PCT, WAVES, *MEMORY_UNITS.values(), *STALLS.values()):
            if name in v:
                self.weighted[name] += v[name] * ns
                self.weight[name] += ns

    def mean(self, name: str) -> float | None:
        """The time-weighted mean of a rate or percentage over the launches that reported it."""
        return self.weighted[name] / self.weight[name] if self.weight.get(name) else None

    @property
    def gbs(self) -> float:
        return self.dram_bytes / self.ns if self.ns else 0.0  # bytes per ns = GB/s

    @property
    def tflops(self) -> float:
        return self.flop / self.ns / 1e3 if self.ns else 0.0  # FLOP per ns / 1e3 = TFLOP/s

    @property
    def flop_floor_ns(self) -> float:
        """The useful FLOP at the tensor pipe's peak for the instruction (0 without FLOP or a tensor-core
        instruction)."""
        return self.flop / self.instruction.floor_peak_tflops / 1e3 if self.flop and self.instruction else 0.0

    @property
    def dram_floor_ns(self) -> float:
        return self.dram_bytes / DRAM_PEAK_GBS

    @property
    def work_floor_ns(self) -> float:
        """What the kernel's work needs at the GPU's peaks: its useful FLOP at the tensor pipe's peak for
        its operands or its DRAM bytes at full bandwidth, whichever takes longer (a floor for any kernel
        doing this work)."""
        return max(self.flop_floor_ns, self.dram_floor_ns)

    @property
    def work_floor_by(self) -> str:
        return "tensor" if self.flop_floor_ns >= self.dram_floor_ns else "DRAM"

    @property
    def unit_floor_ns(self) -> float | None:
        """The time if the busiest unit that Nsight Compute measured (the SM's busiest pipe or issue, or the
        busiest of DRAM, L2 and L1 with shared memory) ran at its peak: a floor for this kernel's own
        design, never under its work floor. Launches without the figures count at their time; None when
        no launch had them."""
        if not self.busiest_seen_ns:
            return None
        return max(self.busiest_ns + self.ns - self.busiest_seen_ns, self.work_floor_ns)

    @property
    def tensor_work(self) -> float:
        """Tensor-pipe cycles scaled to 16-bit useful products (0 without the counter or an instruction)."""
        cycles = self.sums.get(TENSOR_CYCLES, 0.0)
        return cycles / self.instruction.pipe_cost if cycles and self.instruction else 0.0


def summarise(launches: list[Launch], flop_per_call: dict[str, float] | None = None) -> list[KernelStats]:
    """One ``KernelStats`` per (stage, kernel), with each stage's FLOP attributed (``attribute_flops``)."""
    stats: dict[tuple[str, str], KernelStats] = {}
    for launch in launches:
        key = (launch.stage, launch.kernel)
        if key not in stats:
            stats[key] = KernelStats(launch.stage, launch.kernel)
        stats[key].add(launch)
    for s in stats.values():
        s.instruction = instruction_of(
            s.kernel, s.sums.get(GMMA_INST), s.sums.get(HMMA_INST), s.sums.get(TENSOR_CYCLES)
        )
    attribute_flops(list(stats.values()), flop_per_call or {})
    return list(stats.values())


def attribute_flops(stats: list[KernelStats], flop_per_call: dict[str, float]) -> None:
    """Give each stage's FLOP (one call of the stage) to its kernels.

    In proportion to their tensor-pipe work (``sm__pipe_tensor_cycles_active`` over the instruction's
    cycles per useful FLOP: x3 for the three-product forms, x2 for TF32), but never more than a
    kernel's pipe could do in its time (``Instruction.floor_peak_tflops``): what a kernel cannot hold
    goes to the stage's other kernels with tensor-pipe work, in the same proportion (pipe cycles per
    FLOP differ between cuDNN's wgmma and xmesh's mma.sync kernels); where no kernel of the stage
    shows tensor-pipe cycles (or the counter was not collected), all to the stage's longest kernel
    that has a tensor-core instruction, else to its longest kernel."""
    by_stage = defaultdict(list)
    for s in stats:
        s.flop = 0.0
        by_stage[s.stage].append(s)
    for stage, members in by_stage.items():
        flop = flop_per_call.get(stage, 0.0)
        if not flop:
            continue
        unfilled = [s for s in members if s.tensor_work > 0]
        if not unfilled:
            tensor = [s for s in members if s.instruction is not None]
            max(tensor or members, key=lambda s: s.ns).flop = flop
            continue
        left = flop
        while unfilled and left > 0:
            work = sum(s.tensor_work for s in unfilled)
            full = []
            for s in unfilled:
                s.flop += left * s.tensor_work / work
                capacity = s.instruction.floor_peak_tflops * 1e3 * s.ns  # FLOP its pipe can do in its time
                if s.flop > capacity:
                    full.append((s, s.flop - capacity))
                    s.flop = capacity
            left = sum(excess for _, excess in full)
            unfilled = [s for s in unfilled if all(s is not f for f, _ in full)]
        if left > 0:  # more than every kernel's pipe could do: the count or the counters are off; shown as is
            max(members, key=lambda s: s.ns).flop += left


# ---------------------------------------------------------------------------- the limiter
LATENCY_BELOW, HIGH_FROM, BALANCED_WITHIN = 60.0, 80.0, 10.0  # the SpeedOfLight section's bottleneck rule


def dominant_stall(s: KernelStats) -> tuple[str, float] | None:
    means = {reason: s.mean(name) for reason, name in STALLS.items()}
    means = {reason: value for reason, value in means.items() if value is not None}
    if not means:
        return None
    reason = max(means, key=means.get)
    return reason, means[reason]


def limiter(s: KernelStats) -> str:
    """What Nsight Compute's SpeedOfLight figures say bounds the kernel.

    Either throughput at or above 80% of peak: that unit (SM, or the busiest memory unit). Both below
    60%: latency ("small grid" under one wave), with the dominant warp stall. In between: the side
    10 points above the other, else balanced. The dominant stall (cycles per issued instruction) is
    added wherever it was collected."""
    sm, mem = s.mean(SM_PCT), s.mean(MEM_PCT)
    if sm is None or mem is None:
        return "-"
    units = {unit: s.mean(name) for unit, name in MEMORY_UNITS.items()}
    units = {unit: value for unit, value in units.items() if value is not None}
    memory = max(units, key=units.get) if units else "memory"
    waves = s.mean(WAVES)
    if max(sm, mem) >= HIGH_FROM:
        verdict = f"SM throughput {sm:.0f}%" if sm >= mem else f"{memory} throughput {mem:.0f}%"
    elif sm < LATENCY_BELOW and mem < LATENCY_BELOW:
        verdict = f"small grid ({waves:.2f} waves)" if waves is not None and waves < 1 else "latency"
    elif abs(sm - mem) >= BALANCED_WITHIN:
        verdict = f"SM-heavy ({sm:.0f}%)" if sm > mem else f"{memory}-heavy ({mem:.0f}%)"
    else:
        verdict = "balanced"
    stall = dominant_stall(s)
    return f"{verdict}; stall {stall[0]} {stall[1]:.1f}" if stall else verdict


# ---------------------------------------------------------------------------- the report
@dataclass
class ModeReport:
    """A mode's per-kernel figures: ``total_ns`` is every profiled launch's GPU time."""

    title: str
    stats: list[KernelStats]
    total_ns: float
    batch: int | None
    flop_per_call: dict[str, float]

    def share(self, s: KernelStats) -> float:
        return s.ns / self.total_ns if self.total_ns else 0.0

    def roofline_rows(self, cut: float = SHARE_CUT) -> list[KernelStats]:
        """The kernels at or above ``cut`` of the mode's time, longest first."""
        return sorted((s for s in self.stats if self.share(s) >= cut), key=lambda s: -s.ns)

    def stage_totals(self) -> list[tuple[str, int, float, float, float, float]]:
        """(stage, launches, ns, FLOP, work floor ns, unit floor ns) in the profiled order; '?' (outside
        every range) last if present."""
        out = []
        for stage in (*PROFILED_STAGES, "?"):
            members = [s for s in self.stats if s.stage == stage]
            if members or stage != "?":
                out.append(
                    (
                        stage,
                        sum(s.calls for s in members),
                        sum(s.ns for s in members),
                        self.flop_per_call.get(stage, 0.0),
                        *floors(members),
                    )
                )
        return out


def floors(stats: list[KernelStats]) -> tuple[float, float]:
    """(work floor, unit floor) of these kernels together, in ns: each kernel's summed; a kernel without the
    throughput figures counts at its time in the unit floor."""
    unit = [s.unit_floor_ns for s in stats]
    return (sum(s.work_floor_ns for s in stats), sum(s.ns if u is None else u for s, u in zip(stats, unit)))


def load_mode(csv_path, meta: dict | None = None) -> ModeReport:
    meta = meta or {}
    launches = read_launches(csv_path)
    flop_per_call = meta.get("flop_per_call", {})
    stats = summarise(launches, flop_per_call)
    title = (
        f"{meta['precision']}, batch {meta['batch']}" + (f", {meta['device']}" if meta.get("device") else "")
        if "precision" in meta
        else Path(csv_path).stem
    )
    return ModeReport(title, stats, sum(s.ns for s in stats), meta.get("batch"), flop_per_call)


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def format_mode(mode: ModeReport, cut: float = SHARE_CUT) -> str:
    """The mode's roofline table (kernels >= ``cut`` of its time) and per-stage totals, as markdown."""
    total_ms = mode.total_ns / 1e6
    lines = [f"### {mode.title}", ""]
    per_sample = f" ({total_ms / mode.batch:.3f} ms a sample)" if mode.batch else ""
    lines.append(f"GPU time of the profiled kernels: {total_ms:.3f} ms{per_sample}.")
    lines += [
        "",
        "| kernel | stage | calls | ms a call | share | TFLOP/s | instruction (peak TFLOP/s) | of peak "
        "| DRAM MB a call | GB/s (of 3,350) | SM % | memory % | limiter | work floor ms a call (x off) "
        "| unit floor ms a call (x off) |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |",
    ]
    rows = mode.roofline_rows(cut)
    for s in rows:
        ins = s.instruction
        tflops = s.tflops if s.flop else None
        of_peak = tflops / ins.useful_peak_tflops if tflops and ins else None
        name = s.kernel if len(s.kernel) <= 60 else s.kernel[:57] + "..."
        lines.append(
            f"| `{name}` | {s.stage} | {s.calls} | {s.ns / s.calls / 1e6:.3f} | {mode.share(s):.1%} "
            f"| {_cell(tflops, '.1f')} | {ins.label() if ins else '-'} | {_cell(of_peak, '.0%')} "
            f"| {s.dram_bytes / s.calls / 1e6:.1f} | {s.gbs:.0f} ({s.gbs / DRAM_PEAK_GBS:.0%}) "
            f"| {_cell(s.mean(SM_PCT), '.0f')} | {_cell(s.mean(MEM_PCT), '.0f')} | {limiter(s)} "
            f"| {_floor_cell(s.work_floor_ns, s, s.work_floor_by + ' ')} | {_floor_cell(s.unit_floor_ns, s)} |"
        )
    shown = {id(s) for s in rows}
    rest = [s for s in mode.stats if id(s) not in shown]
    lines += ["", f"Below {cut:.0%}: {len(rest)} kernel rows, {sum(mode.share(s) for s in rest):.1%} of the time.", ""]
    lines += [
        "| stage | launches | GPU ms | share | GFLOP | TFLOP/s | work floor ms | unit floor ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for stage, launches, ns, flop, work, unit in mode.stage_totals():
        share = ns / mode.total_ns if mode.total_ns else 0.0
        rate = f"{flop / ns / 1e3:.1f}" if flop and ns else "-"
        lines.append(
            f"| {stage} | {launches} | {ns / 1e6:.3f} | {share:.1%} | {flop / 1e9:.1f} | {rate} "
            f"| {work / 1e6:.3f} | {unit / 1e6:.3f} |"
        )
    flop = sum(mode.flop_per_call.values())
    rate = f"{flop / mode.total_ns / 1e3:.1f}" if flop and mode.total_ns else "-"
    work, unit = floors(mode.stats)
    lines.append(
        f"| all | {sum(s.calls for s in mode.stats)} | {total_ms:.3f} | 100% | {flop / 1e9:.1f} | {rate} "
        f"| {work / 1e6:.3f} | {unit / 1e6:.3f} |"
    )
    lines += [
        "",
        "At the floors, every kernel of the mode: "
        + _at_floor("work", work, mode)
        + "; "
        + _at_floor("unit", unit, mode)
        + ".",
    ]
    return "\n".join(lines) + "\n"


def _floor_cell(floor_ns: float | None, s: KernelStats, label: str = "") -> str:
    if floor_ns is None:
        return "-"
    off = f"{s.ns / floor_ns:.2f}x" if floor_ns else "-"
    return f"{floor_ns / s.calls / 1e6:.3f} {label}({off})"


def _at_floor(name: str, floor_ns: float, mode: ModeReport) -> str:
    """'work floor X ms (Y x off[, Z samples/s])' of the whole mode."""
    off = f"{mode.total_ns / floor_ns:.2f}x off" if floor_ns else "-"
    rate = f", {mode.batch / floor_ns * 1e9:,.0f} samples/s" if mode.batch and floor_ns else ""
    return f"{name} floor {floor_ns / 1e6:.3f} ms ({off}{rate})"


def report(csv_path, meta_path=None, cut: float = SHARE_CUT) -> str:
    meta = json.loads(Path(meta_path).read_text()) if meta_path else None
    return format_mode(load_mode(csv_path, meta), cut)


# ---------------------------------------------------------------------------- running ncu
def find_ncu() -> str:
    ncu = os.environ.get("NCU") or shutil.which("ncu")
    if not ncu:
        raise SystemExit("kernel_profile: ncu (Nsight Compute) is not on the PATH; set NCU=/path/to/ncu")
    return ncu


def child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def run_bounded(cmd: list[str], timeout: float, stdout, stderr) -> tuple[int | None, float]:
    """Run ``cmd`` in its own process group; past ``timeout`` seconds end that group. Returns
    (exit status or None on timeout, seconds)."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=stdout, stderr=stderr, env=child_env(), cwd=ROOT, start_new_session=True)
    try:
        rc = proc.wait(timeout=max(timeout, 1.0))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        rc = None
    return rc, time.monotonic() - start


_PROBE_PROGRAM = (
    "import cupy; x = cupy.arange(4096, dtype=cupy.float32); "
    "float((x * 2).sum()); cupy.cuda.runtime.deviceSynchronize()"
)


def _probe(ncu: str, metrics: list[str], flags: tuple[str, ...], log) -> bool:
    cmd = [ncu, *flags, "--launch-count", "1", "--metrics", ",".join(metrics), sys.executable, "-c", _PROBE_PROGRAM]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, env=child_env(), cwd=ROOT, timeout=120)
    except subprocess.TimeoutExpired:
        log.write(f"$ {' '.join(cmd)}\n-> timed out after 120 s\n")
        return False
    text = out.stdout + out.stderr
    ok = (
        out.returncode == 0 and "==ERROR==" not in text and sum(line.startswith('"') for line in text.splitlines()) >= 3
    )
    log.write(f"$ {' '.join(cmd)}\n-> {'ok' if ok else 'failed'} (exit {out.returncode})\n{text[-3000:]}\n")
    return ok


def probe_metrics(ncu: str, log) -> tuple[list[str], tuple[str, ...], list[str]]:
    """The metrics and flags this ncu accepts, found on a one-kernel program (a few seconds each):
    all at once, else the core set and each optional group on its own. Returns (metrics, flags,
    notes on what was left out); exits when even the core set fails."""
    wanted = [*CORE_METRICS, *(m for group in OPTIONAL_METRICS.values() for m in group)]
    flags = NCU_FLAGS + UNITS_FLAGS
    if _probe(ncu, wanted, flags, log):
        return wanted, flags, []
    notes = []
    if not _probe(ncu, list(CORE_METRICS), flags, log):
        flags = NCU_FLAGS
        notes.append("ncu refused --print-units base: values are read with the units row's scale")
        if not _probe(ncu, list(CORE_METRICS), flags, log):
            raise SystemExit(
                "kernel_profile: ncu could not collect the core metrics on a one-kernel program; "
                "see probe.log (counter permissions: ERR_NVGPUCTRPERM?)"
            )
    metrics = list(CORE_METRICS)
    for name, group in OPTIONAL_METRICS.items():
        if _probe(ncu, [*CORE_METRICS, *group], flags, log):
            metrics += group
        else:
            notes.append(f"left out ({name}): {', '.join(group)}")
    return metrics, flags, notes


def run_modes(names: list[str], out: Path, budget: float) -> int:
    """Profile each mode in turn under ncu within ``budget`` seconds; write the CSVs and tables to ``out``."""
    ncu = find_ncu()
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + budget
    version = subprocess.run([ncu, "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    with open(out / "probe.log", "w") as log:
        metrics, flags, notes = probe_metrics(ncu, log)
    sections, failed = [], 0
    for i, name in enumerate(names):
        precision, batch = MODES[name]
        csv_path, meta_path, log_path = out / f"{name}.csv", out / f"{name}.json", out / f"{name}.log"
        timeout = (deadline - time.monotonic()) / (len(names) - i)  # a fair share; time left over rolls on
        cmd = [
            ncu,
            *flags,
            "--profile-from-start",
            "off",
            "--metrics",
            ",".join(metrics),
            sys.executable,
            str(Path(__file__).resolve()),
            str(batch),
            precision,
            "--meta",
            str(meta_path),
        ]
        with open(csv_path, "w") as stdout, open(log_path, "w") as stderr:
            stderr.write("$ " + " ".join(cmd) + "\n")
            stderr.flush()
            rc, seconds = run_bounded(cmd, timeout, stdout, stderr)
        status = f"{name}: {'timed out after' if rc is None else f'exit {rc},'} {seconds:.0f} s (limit {timeout:.0f} s)"
        print(status, flush=True)
        try:
            table = report(csv_path, meta_path if meta_path.exists() else None)
        except (ValueError, OSError) as err:
            failed += 1
            sections.append(f"### {name}\n\nno table: {err} ({status}; see {log_path.name})\n")
            continue
        write_text(out / f"{name}.md", table)
        sections.append(table)
    head = [
        "## Per-kernel roofline (Nsight Compute)",
        "",
        f"`python3 scripts/kernel_profile.py --modes {' '.join(names)}`; "
        f"{version[-1] if version else 'ncu'}; flags {' '.join(flags)} --profile-from-start off.",
        f"Metrics: {', '.join(metrics)}.",
    ]
    head += [f"Note: {note}." for note in notes]
    text = "\n".join(head) + "\n\n" + "\n".join(sections)
    write_text(out / "roofline.md", text)
    print(text)
    return 1 if failed else 0


# ---------------------------------------------------------------------------- command line
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("batch", nargs="?", type=int, help="the profiled program: batch size")
    parser.add_argument("precision", nargs="?", default="fp32", help="the profiled program: precision mode")
    parser.add_argument("--meta", help="the profiled program writes, or --report reads, this JSON (batch, FLOP)")
    parser.add_argument("--report", metavar="CSV", help="print the tables of an ncu --csv --page raw output")
    parser.add_argument(
        "--modes",
        nargs="*",
        choices=sorted(MODES),
        metavar="MODE",
        help=f"profile these modes under ncu (default: {' '.join(MODES)})",
    )
    parser.add_argument("--out", type=Path, help="--modes: output folder (default: $OUT/profile, else ./profile)")
    parser.add_argument("--budget", type=float, default=540.0, help="--modes: seconds for all modes (default 540)")
    args = parser.parse_args(argv)
    if args.modes is not None:
        out = args.out or Path(os.environ.get("OUT") or ".") / "profile"
        return run_modes(args.modes or list(MODES), out, args.budget)
    if args.report:
        print(report(args.report, args.meta), end="")
        return 0
    if args.batch is None:
        parser.error("give a batch size (the profiled program), --report CSV or --modes")
    profile(args.batch, args.precision, args.meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
