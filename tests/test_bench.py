"""xmesh.benchmarking, `xmesh bench` and the asv suite in asv_benchmarks/ (the same timing code)."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tolerance import assert_mostly_within
from xmesh import benchmarking as bm
from xmesh.cli import main

ROOT = Path(__file__).resolve().parents[1]
CHEAP = ["graph_block_1", "graph_projection"]


@pytest.fixture(scope="module")
def work():
    return bm.Workload("numpy", 1)


def test_workload_times_a_cheap_stage(work):
    times = work.time("graph_block_1", repeat=2, warmup=0)
    assert len(times) == 2 and all(0 < t < 30 for t in times)


def test_stage_segments_chain_to_run_stage1(work):
    """The per-block loop of xmesh.benchmarking runs exactly what network.run_stage1 runs."""
    ours = work.stage1_states["blocks"]
    ref = work.stage1()
    assert [b.shape for b in ours] == [(1, 156, 3), (1, 618, 3), (1, 2466, 3)]
    # the same operations, though perhaps under another BLAS thread count (the fixture ran earlier):
    # the golden tolerance
    for a, b in zip(ours, ref):
        assert_mostly_within(a, b)
    # a block timed on its own reproduces the same coordinates
    assert_mostly_within(work.graph_block_1()[1], ref[0])


def test_flop_count_matches_model_md(work):
    flop = work.flop
    assert set(flop) >= {"cnn_stage1", "cnn_stage2", "graph_block_3", "drb_1", "drb_2", "total"}
    assert 200e9 < flop["total"] < 280e9  # MODEL.md: ~250 GFLOP per sample
    assert (flop["drb_1"] + flop["drb_2"]) / flop["total"] > 0.8  # "nine tenths in the two DRBs"


def test_run_bench_report_is_sane():
    report = bm.run_bench("numpy", [1], repeat=2, warmup=0, stages=CHEAP)
    json.dumps(report)  # JSON-ready
    (entry,) = report["results"]
    assert entry["backend"] == "numpy" and entry["batch"] == 1
    assert set(entry["stages"]) == set(CHEAP)
    for stats in entry["stages"].values():
        assert 0 < stats["min_ms"] <= stats["median_ms"] and stats["per_sample_ms"] == stats["median_ms"]
        assert len(stats["times_ms"]) == 2
    assert "gflop_per_s" in entry["stages"]["graph_block_1"]
    assert "total_ms" not in entry  # total was not asked for
    assert "graph_block_1" in bm.format_table(report)


def test_run_bench_reports_every_call_against_the_planned_count():
    seen = []
    bm.run_bench("numpy", [1], repeat=2, warmup=1, stages=CHEAP, progress=lambda *call: seen.append(call))
    planned = len(CHEAP) * (2 + 1)
    assert {p for _, _, p in seen} == {planned}
    done = [d for _, d, _ in seen]
    assert done == sorted(done) and done[0] == 0 and done[-1] == planned
    assert [w for w, d, _ in seen if d in (0, 3)][:2] == [f"numpy batch 1: {CHEAP[0]}", f"numpy batch 1: {CHEAP[0]}"]
    assert seen[-1][0] == f"numpy batch 1: {CHEAP[1]}"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_cli_shows_a_bar_with_the_time_left_on_a_terminal_and_lines_elsewhere(monkeypatch, capsys):
    argv = ["bench", "--backend", "numpy", "--stages", *CHEAP, "--repeat", "1", "--warmup", "0", "--batch-sizes", "1"]
    assert main(argv) == 0
    assert capsys.readouterr().err.splitlines() == [f"xmesh bench: numpy batch 1: {stage}" for stage in CHEAP]
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(argv) == 0
    assert re.search(r"graph_projection: 100%.* 2/2 \[\d\d:\d\d<\d\d:\d\d", terminal.getvalue()), terminal.getvalue()


def test_unknown_stage_is_refused():
    from xmesh.errors import InputError

    with pytest.raises(InputError, match="stage"):
        bm.run_bench("numpy", [1], stages=["nope"])


def test_cli_json(capsys):
    rc = main(["bench", "--backend", "numpy", "--json", "--repeat", "1", "--warmup", "0", "--batch-sizes", "1"])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    (entry,) = report["results"]
    assert set(entry["stages"]) == set(bm.STAGES)
    assert entry["total_ms"] > 0 and entry["samples_per_s"] > 0 and entry["gflop_per_s"] > 0
    assert report["flop_per_sample"]["total"] > 0


def test_cli_table(capsys):
    assert main(["bench", "--backend", "numpy", "--repeat", "1", "--warmup", "0", "--stages", "graph_block_1"]) == 0
    out = capsys.readouterr().out
    assert "graph_block_1" in out and "numpy b=1" in out


def test_cli_unavailable_backend_says_why(capsys):
    from xmesh.backends import available_backends

    if "cupy" in available_backends():
        pytest.skip("cupy runs here")
    assert main(["bench", "--backend", "cupy", "--repeat", "1"]) == 2
    assert "cupy" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("asv") is None, reason="asv is not installed")
def test_asv_suite_imports_and_checks():
    proc = subprocess.run(
        ["asv", "check", "--python=same"], cwd=ROOT / "asv_benchmarks", capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "No problems found" in proc.stdout + proc.stderr


def test_asv_suite_uses_the_shared_code():
    sys.path.insert(0, str(ROOT / "asv_benchmarks"))
    try:
        from benchmarks import bench_stages, common
    finally:
        sys.path.remove(str(ROOT / "asv_benchmarks"))
    assert common.benchmarking() is bm
    timed = {
        name[len("time_") :]
        for cls in (bench_stages.CNN, bench_stages.GraphStage1, bench_stages.DeformationReasoning, bench_stages.Stages)
        for name in vars(cls)
        if name.startswith("time_")
    }
    assert timed == set(bm.STAGES)


def test_precision_is_refused_for_numpy_alone(capsys):
    """--precision is the GPU backend's mode: asking it of numpy alone is an error that says so."""
    assert main(["bench", "--backend", "numpy", "--precision", "tf32", "--repeat", "1"]) == 2
    assert "GPU backend" in capsys.readouterr().err


def test_table_names_a_speed_mode():
    stats = {"total": {"median_ms": 10.0, "per_sample_ms": 0.625}}
    report = {
        "stages": ["total"],
        "inputs": "x",
        "template": "x",
        "weights": "x",
        "repeat": 1,
        "warmup": 0,
        "results": [
            {"backend": "cupy", "batch": 16, "precision": "tf32", "device": "GPU", "stages": stats},
            {"backend": "cupy", "batch": 1, "precision": "fp32", "device": "GPU", "stages": stats},
        ],
    }
    table = bm.format_table(report)
    assert "cupy b=16 tf32: GPU" in table and "cupy b=1: GPU" in table and "fp32" not in table
