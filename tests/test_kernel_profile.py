"""scripts/kernel_profile.py on the CPU: reading Nsight Compute's raw CSV, the roofline figures, the
3% cut, FLOP attribution, the limiter, the per-stage FLOP counts, and the --modes driver against a
stand-in ncu."""

from __future__ import annotations

import importlib.util
import json
import stat
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load_script():
    spec = importlib.util.spec_from_file_location("kernel_profile", ROOT / "scripts" / "kernel_profile.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


kp = _load_script()

NVTX = "thread Domain:Push/Pop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg"
LEADING = [
    "ID",
    "Process ID",
    "Process Name",
    "Host Name",
    NVTX,
    "Kernel Name",
    "Context",
    "Stream",
    "Block Size",
    "Grid Size",
    "Device",
    "CC",
]
STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
UNITS = {
    "dram__bytes_read.sum": "byte",
    "dram__bytes_write.sum": "byte",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "%",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": "%",
    "gpu__time_duration.sum": "nsecond",
    "l1tex__throughput.avg.pct_of_peak_sustained_elapsed": "%",
    "launch__waves_per_multiprocessor": "",
    "lts__throughput.avg.pct_of_peak_sustained_elapsed": "%",
    "sm__inst_executed_pipe_tensor_op_gmma.sum": "inst",
    "sm__inst_executed_pipe_tensor_op_hmma.sum": "inst",
    "sm__pipe_tensor_cycles_active.sum": "cycle",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "%",
    STALL.format("barrier"): "",
    STALL.format("long_scoreboard"): "",
    STALL.format("wait"): "",
}
METRICS = sorted(UNITS)  # ncu writes the metric columns in name order

CUDNN = "sm90_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x32_kernel"
CUDNN_LABEL = f"{CUDNN}<float>"  # the launch's name without "void " and its parameters
# (stage, kernel, {metric: cell}) of each launch; cells as ncu writes them, thousands separators included
LAUNCHES = [
    (
        "drb_1",
        "wg_drb_chain_score_f16",
        {
            "gpu__time_duration.sum": "2,000,000",
            "dram__bytes_read.sum": "1,500,000,000",
            "dram__bytes_write.sum": "500,000,000",
            "sm__throughput.avg.pct_of_peak_sustained_elapsed": "45.5",
            "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": "30.2",
            "launch__waves_per_multiprocessor": "1",
            "sm__pipe_tensor_cycles_active.sum": "3,000,000",
            "sm__inst_executed_pipe_tensor_op_gmma.sum": "1,000",
            "sm__inst_executed_pipe_tensor_op_hmma.sum": "0",
            STALL.format("barrier"): "3.5",
            STALL.format("long_scoreboard"): "1",
            STALL.format("wait"): "2",
        },
    ),
    (
        "drb_1",
        "local_projection_tiled_o16",
        {
            "gpu__time_duration.sum": "1,000,000",
            "dram__bytes_read.sum": "100,000,000",
            "dram__bytes_write.sum": "2,000,000,000",
            "sm__throughput.avg.pct_of_peak_sustained_elapsed": "20",
            "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": "85",
            "dram__throughput.avg.pct_of_peak_sustained_elapsed": "85",
            "lts__throughput.avg.pct_of_peak_sustained_elapsed": "40",
            "l1tex__throughput.avg.pct_of_peak_sustained_elapsed": "30",
            "sm__pipe_tensor_cycles_active.sum": "0",
        },
    ),
    (
        "cnn_stage2",
        f"void {CUDNN}<float>(Params)",
        {
            "gpu__time_duration.sum": "400,000",
            "dram__bytes_read.sum": "40,000,000",
            "dram__bytes_write.sum": "0",
            "sm__throughput.avg.pct_of_peak_sustained_elapsed": "70",
            "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": "40",
            "sm__pipe_tensor_cycles_active.sum": "4,000,000",
            "sm__inst_executed_pipe_tensor_op_gmma.sum": "500",
        },
    ),
    (
        "cnn_stage2",
        "conv_1x_n64",
        {
            "gpu__time_duration.sum": "200,000",
            "dram__bytes_read.sum": "10,000,000",
            "dram__bytes_write.sum": "10,000,000",
            "sm__throughput.avg.pct_of_peak_sustained_elapsed": "30",
            "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": "28",
            "launch__waves_per_multiprocessor": "0.5",
            "sm__pipe_tensor_cycles_active.sum": "1,000,000",
            "sm__inst_executed_pipe_tensor_op_hmma.sum": "200",
        },
    ),
    *[
        (
            "graph_block_3",
            "csr_gconv",
            {
                "gpu__time_duration.sum": "50,000",
                "dram__bytes_read.sum": "1,000,000",
                "dram__bytes_write.sum": "1,000,000",
                "sm__throughput.avg.pct_of_peak_sustained_elapsed": "65",
                "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": "62",
            },
        )
    ]
    * 3,
    *[
        (
            "graph_block_3",
            "gemm_1x_n64_v",
            {
                "gpu__time_duration.sum": "55,000",
                "dram__bytes_read.sum": "n/a",
                "dram__bytes_write.sum": "",
                "sm__pipe_tensor_cycles_active.sum": "1,000",
                "sm__inst_executed_pipe_tensor_op_hmma.sum": "50",
            },
        )
    ]
    * 2,
]
TOTAL_NS = 2_000_000 + 1_000_000 + 400_000 + 200_000 + 3 * 50_000 + 2 * 55_000  # 3,860,000
META = {
    "precision": "fp16",
    "batch": 2,
    "device": "NVIDIA H100 80GB HBM3",
    "flop_per_call": {"drb_1": 1.2e12, "cnn_stage2": 1.5e11, "graph_block_3": 3.3e9},
}


def _cell(text: str) -> str:
    return '"' + text.replace('"', '""') + '"'


def write_csv(path: Path, launches=LAUNCHES, prelude=("==PROF== Connected to process 1234 (python3)",)) -> Path:
    lines = list(prelude)
    lines.append(",".join(_cell(c) for c in LEADING + METRICS))
    lines.append(",".join(_cell(c) for c in [""] * len(LEADING) + [UNITS[m] for m in METRICS]))
    for i, (stage, kernel, cells) in enumerate(launches):
        lead = [
            str(i),
            "1234",
            "python3",
            "127.0.0.1",
            f"<default domain>:{stage}:none:none:none:none:none:none",
            kernel,
            "1",
            "7",
            "(384, 1, 1)",
            "(132, 1, 1)",
            "0",
            "9.0",
        ]
        lines.append(",".join(_cell(c) for c in lead + [cells.get(m, "") for m in METRICS]))
    lines.append("==PROF== Disconnected from process 1234")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def mode(tmp_path):
    return kp.load_mode(write_csv(tmp_path / "prof.csv"), META)


def _stats(mode, kernel):
    return next(s for s in mode.stats if s.kernel == kernel)


def test_units_and_separators():
    assert kp.to_base("1,234.5", "usecond") == pytest.approx(1_234_500)
    assert kp.to_base("2", "msecond") == 2e6
    assert kp.to_base("1.5", "Mbyte") == 1.5e6
    assert kp.to_base("3,000", "byte") == 3000
    assert kp.to_base("n/a", "byte") is None and kp.to_base("", "%") is None


def test_kernel_labels_and_instructions():
    assert kp.kernel_label("void cutlass::Kernel2<gemm<(int)1, 64>>(Params)") == "cutlass::Kernel2<gemm<(int)1, 64>>"
    assert kp.kernel_label("wg_drb_layer_3xf16") == "wg_drb_layer_3xf16"
    named = {
        k: kp.instruction_of(k)
        for k in (
            "wg_drb_chain_score_bf16",
            "wg_drb_layer_f16_h16",
            "wg_gemm_3x_v",
            "gemm_3x_n128_v",
            "gconv_epilogue_f16",
            "skinny_gemm16",
        )
    }
    assert {k: i and (i.name, i.products) for k, i in named.items()} == {
        "wg_drb_chain_score_bf16": ("wgmma bf16", 1),
        "wg_drb_layer_f16_h16": ("wgmma f16", 1),
        "wg_gemm_3x_v": ("wgmma tf32", 3),
        "gemm_3x_n128_v": ("mma.sync tf32", 3),
        "gconv_epilogue_f16": None,
        "skinny_gemm16": None,
    }
    assert kp.instruction_of("lib_kernel", gmma=0.0, hmma=0.0, tensor_cycles=0.0) is None
    assert kp.instruction_of("lib_kernel", tensor_cycles=10.0).name == "tensor op tf32"  # no instruction counters


def test_launches_read_with_their_stage_and_kernel(tmp_path):
    launches = kp.read_launches(write_csv(tmp_path / "prof.csv"))
    assert len(launches) == len(LAUNCHES)
    assert [(launch.stage, launch.kernel) for launch in launches[:3]] == [
        ("drb_1", "wg_drb_chain_score_f16"),
        ("drb_1", "local_projection_tiled_o16"),
        ("cnn_stage2", CUDNN_LABEL),
    ]
    assert launches[0].values["dram__bytes_read.sum"] == 1.5e9
    assert "dram__bytes_read.sum" not in launches[-1].values  # n/a and empty cells are absent, not 0


def test_times_shares_bandwidth_and_flop_rates(mode):
    assert mode.total_ns == TOTAL_NS
    chain = _stats(mode, "wg_drb_chain_score_f16")
    assert chain.calls == 1 and chain.ns == 2e6
    assert mode.share(chain) == pytest.approx(2e6 / TOTAL_NS)
    assert chain.gbs == pytest.approx(2e9 / 2e-3 / 1e9)  # 2 GB in 2 ms: 1000 GB/s
    assert chain.flop == pytest.approx(1.2e12)  # the projection has no tensor-pipe work
    assert chain.tflops == pytest.approx(1.2e12 / 2e-3 / 1e12)  # 600 TFLOP/s
    assert chain.instruction.name == "wgmma f16" and chain.instruction.useful_peak_tflops == pytest.approx(989.4)
    csr = _stats(mode, "csr_gconv")
    assert csr.calls == 3 and csr.ns == 150_000 and csr.flop == 0
    assert csr.mean(kp.SM_PCT) == pytest.approx(65)


def test_flop_split_by_tensor_pipe_work(mode):
    cudnn, conv = _stats(mode, CUDNN_LABEL), _stats(mode, "conv_1x_n64")
    # both TF32 (2 pipe cycles per 16-bit product): work 4e6 : 1e6 cycles
    assert cudnn.flop == pytest.approx(1.5e11 * 0.8) and conv.flop == pytest.approx(1.5e11 * 0.2)
    assert cudnn.instruction.name == "wgmma tf32"  # by its gmma counter
    assert conv.instruction.name == "mma.sync tf32"  # by name
    assert cudnn.tflops / cudnn.instruction.useful_peak_tflops == pytest.approx(300 / 494.7)
    assert _stats(mode, "gemm_1x_n64_v").flop == pytest.approx(3.3e9)


def test_flop_without_tensor_counters_goes_to_the_longest_tensor_kernel():
    def launch(stage, kernel, ns):
        return kp.Launch(stage, kernel, {kp.TIME: ns})

    stats = kp.summarise(
        [
            launch("drb_2", "local_projection_tiled_o16", 5e6),
            launch("drb_2", "wg_drb_layer_3xf16", 1e6),
            launch("drb_2", "wg_drb_layer_3xf16", 1e6),
            launch("cnn_stage1", "conv_direct_x4", 2e5),
            launch("cnn_stage1", "im2col_nhwc", 1e5),
        ],
        {"drb_2": 9e11, "cnn_stage1": 4e10},
    )
    flop = {s.kernel: s.flop for s in stats}
    assert flop == {
        "local_projection_tiled_o16": 0,
        "wg_drb_layer_3xf16": 9e11,
        "conv_direct_x4": 4e10,
        "im2col_nhwc": 0,
    }
    three = next(s for s in stats if s.kernel == "wg_drb_layer_3xf16").instruction
    assert three.products == 3 and three.useful_peak_tflops == pytest.approx(989.4 / 3)


def test_no_kernel_gets_more_flop_than_its_pipe_could_do():
    def launch(kernel, ns, cycles):
        return kp.Launch("cnn_stage1", kernel, {kp.TIME: ns, kp.TENSOR_CYCLES: cycles, kp.GMMA_INST: 1.0})

    # by pipe cycles the library kernel would get 9/10 of 1e12 FLOP in 1 ms: 900 TFLOP/s, over TF32's 494.7
    stats = kp.summarise([launch("cudnn_conv", 1e6, 9e6), launch("conv_1x_n64", 4e6, 1e6)], {"cnn_stage1": 1e12})
    flop = {s.kernel: s.flop for s in stats}
    assert flop["cudnn_conv"] == pytest.approx(494.7e9)  # its pipe's peak for 1 ms
    assert flop["conv_1x_n64"] == pytest.approx(1e12 - 494.7e9)  # the rest, within its 4 ms
    assert all(s.work_floor_ns <= s.ns for s in stats)
    # more than every pipe could do: shown as is, on the longest kernel
    stats = kp.summarise([launch("cudnn_conv", 1e6, 1e6)], {"cnn_stage1": 1e12})
    assert stats[0].flop == pytest.approx(1e12)


def test_the_three_percent_cut_and_order(mode):
    rows = [s.kernel for s in mode.roofline_rows()]
    assert rows == ["wg_drb_chain_score_f16", "local_projection_tiled_o16", CUDNN_LABEL, "conv_1x_n64", "csr_gconv"]
    assert mode.share(_stats(mode, "csr_gconv")) > 0.03 > mode.share(_stats(mode, "gemm_1x_n64_v"))


def test_limiters(mode):
    assert kp.limiter(_stats(mode, "wg_drb_chain_score_f16")) == "latency; stall barrier 3.5"
    assert kp.limiter(_stats(mode, "local_projection_tiled_o16")) == "DRAM throughput 85%"
    assert kp.limiter(_stats(mode, CUDNN_LABEL)) == "SM-heavy (70%)"
    assert kp.limiter(_stats(mode, "conv_1x_n64")) == "small grid (0.50 waves)"
    assert kp.limiter(_stats(mode, "csr_gconv")) == "balanced"
    assert kp.limiter(_stats(mode, "gemm_1x_n64_v")) == "-"


def test_floors(mode):
    chain = _stats(mode, "wg_drb_chain_score_f16")
    # 1.2e12 FLOP at 989.4 TFLOP/s against 2 GB at 3,350 GB/s: the tensor cores bound its work
    assert chain.work_floor_ns == pytest.approx(1.2e12 / 989.4e3) and chain.work_floor_by == "tensor"
    # its busiest unit (SM, 45.5%) would finish sooner than its work allows: the work floor stands
    assert chain.unit_floor_ns == pytest.approx(chain.work_floor_ns)
    projection = _stats(mode, "local_projection_tiled_o16")
    assert projection.work_floor_ns == pytest.approx(2.1e9 / 3350) and projection.work_floor_by == "DRAM"
    assert projection.unit_floor_ns == pytest.approx(0.85e6)  # memory at 85% for 1 ms
    csr = _stats(mode, "csr_gconv")  # three launches, SM at 65%
    assert csr.unit_floor_ns == pytest.approx(0.65 * 150_000)
    gemm = _stats(mode, "gemm_1x_n64_v")  # no DRAM, no throughput figures
    # mma.sync's own peak is an estimate (half of wgmma's): its floor takes the TF32 pipe's peak
    assert gemm.work_floor_ns == pytest.approx(3.3e9 / 494.7e3) and gemm.unit_floor_ns is None
    assert gemm.instruction.useful_peak_tflops == pytest.approx(494.7 / 2)
    work, unit = kp.floors(mode.stats)
    assert work == pytest.approx(sum(s.work_floor_ns for s in mode.stats))
    assert unit == pytest.approx(sum(s.unit_floor_ns or s.ns for s in mode.stats))  # the gemm at its time
    assert work < unit < mode.total_ns


def test_report_tables(tmp_path, capsys):
    csv_path = write_csv(tmp_path / "prof.csv")
    meta_path = tmp_path / "prof.json"
    meta_path.write_text(json.dumps(META))
    assert kp.main(["--report", str(csv_path), "--meta", str(meta_path)]) == 0
    text = capsys.readouterr().out
    chain = next(line for line in text.splitlines() if line.startswith("| `wg_drb_chain_score_f16`"))
    cells = [c.strip() for c in chain.strip("|").split("|")]
    assert cells[1:] == [
        "drb_1",
        "1",
        "2.000",
        f"{2e6 / TOTAL_NS:.1%}",
        "600.0",
        "wgmma f16 (989)",
        "61%",
        "2000.0",
        "1000 (30%)",
        "46",
        "30",
        "latency; stall barrier 3.5",
        "1.213 tensor (1.65x)",
        "1.213 (1.65x)",
    ]
    assert "gemm_1x_n64_v" not in text.split("Below 3%")[0]
    assert f"Below 3%: 1 kernel rows, {110_000 / TOTAL_NS:.1%} of the time." in text
    assert f"| all | 9 | {TOTAL_NS / 1e6:.3f} | 100% | {(1.2e12 + 1.5e11 + 3.3e9) / 1e9:.1f} |" in text
    work, unit = kp.floors(kp.load_mode(csv_path, META).stats)
    assert f"work floor {work / 1e6:.3f} ms ({TOTAL_NS / work:.2f}x off, {2 / work * 1e9:,.0f} samples/s)" in text
    assert f"unit floor {unit / 1e6:.3f} ms ({TOTAL_NS / unit:.2f}x off" in text
    assert "| drb_1 | 2 | 3.000 |" in text and "| local_projection" not in text.split("| stage |")[1]
    assert f"GPU time of the profiled kernels: {TOTAL_NS / 1e6:.3f} ms ({TOTAL_NS / 2e6:.3f} ms a sample)" in text


def test_stage_flops_add_up_to_the_benchmarks_total():
    from xmesh.benchmarking import Workload

    work = Workload("numpy", 1)
    per_stage = kp.stage_flops(work.flop)
    assert set(per_stage) == set(kp.PROFILED_STAGES)
    assert sum(per_stage.values()) == pytest.approx(work.flop["total"], rel=1e-12)
    assert per_stage["drb_1"] > 0 and per_stage["graph_projection"] == 0


FAKE_NCU = r'''#!{python}
"""A stand-in for ncu: --version, one-kernel probes, and profiled runs that print a recorded CSV."""
import json, sys, time
args = sys.argv[1:]
if args == ["--version"]:
    print("NVIDIA (R) Nsight Compute Command Line Profiler\nVersion 2025.3.1.0 (stand-in)")
    sys.exit(0)
metrics = args[args.index("--metrics") + 1].split(",")
if any("stalled" in m for m in metrics):
    print('==ERROR== Failed to find metric ' + next(m for m in metrics if "stalled" in m))
    sys.exit(1)
if "-c" in args:   # a probe
    print('"ID","Kernel Name","gpu__time_duration.sum"\n"","","nsecond"\n"0","cupy_multiply","1,000"')
    sys.exit(0)
program = args[args.index("--metrics") + 2:]
batch, precision = program[2], program[3]
if batch == "1":
    time.sleep(30)   # a mode that overruns its share
meta = {{"precision": precision, "batch": int(batch), "flop_per_call": {{"drb_1": 1.2e12}}}}
open(program[program.index("--meta") + 1], "w").write(json.dumps(meta))
sys.stdout.write(open({csv!r}).read())
'''


def test_modes_driver_with_a_stand_in_ncu(tmp_path, monkeypatch, capsys):
    recorded = write_csv(tmp_path / "recorded.csv")
    ncu = tmp_path / "ncu"
    ncu.write_text(FAKE_NCU.format(python=sys.executable, csv=str(recorded)))
    ncu.chmod(ncu.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("NCU", str(ncu))
    out = tmp_path / "out"
    rc = kp.main(["--modes", "fp16-b64", "fp32-b1", "--out", str(out), "--budget", "4"])
    text = capsys.readouterr().out
    assert rc == 1  # fp32-b1 ran out of time
    assert "fp32-b1: timed out after" in text
    assert (out / "fp16-b64.md").is_file() and not (out / "fp32-b1.md").exists()
    roofline = (out / "roofline.md").read_text()
    assert "### fp16, batch 64" in roofline and "| `wg_drb_chain_score_f16` | drb_1 |" in roofline
    assert "left out (warp stalls)" in roofline and "Version 2025.3.1.0" in roofline
    assert "--print-units base" in (out / "fp16-b64.log").read_text()
    probe = (out / "probe.log").read_text()
    assert "-> failed" in probe and "-> ok" in probe
