"""scripts/stall_regions.py on the CPU: a source page in Nsight Compute's CSV form split by warp role."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def stall_regions():
    spec = importlib.util.spec_from_file_location("stall_regions", ROOT / "scripts" / "stall_regions.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CODE = [  # instruction, samples, barrier samples
    ("MOV R1, c[0x0][0x28]", 1, 0),
    ("USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0x90", 0, 0),
    ("HGMMA.64x192x16.F32 R24, gdesc[UR20], R24", 50, 45),
    ("WARPGROUP.DEPBAR.LE gsb0, 0x1", 5, 5),
    ("WARPGROUP.DEPBAR.LE gsb0, 0x0", 4, 4),
    ("FADD R5, R41, R5", 10, 0),
    ("STS.128 [R3], R4", 6, 0),
    ("USETMAXREG.DEALLOC.CTAPOOL 0x50", 0, 0),
    ("FFMA R45, R26, R28, R45", 20, 0),
    ("BAR.SYNC.DEFER_BLOCKING 0x5, 0x200", 4, 4),
]


def write_page(path: Path) -> None:
    header = [
        "Address",
        "Source",
        "Warp Stall Sampling (All Samples)",
        "Instructions Executed",
        "stall_barrier",
        "stall_wait",
        "stall_barrier (Not Issued)",
    ]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Kernel Name", "wg_drb_chain_score_f16"])
        w.writerow(header)
        for k, (code, samples, barrier) in enumerate(CODE):
            w.writerow([hex(0x1000 + 16 * k), f"      {code}", f"{samples:,}", "1,000", barrier, samples - barrier, 0])


def test_the_regions_follow_the_branches_and_the_last_wgmma_wait(stall_regions, tmp_path):
    write_page(tmp_path / "page.csv")
    header, rows = stall_regions.read_source(str(tmp_path / "page.csv"))
    assert header[:2] == ["Address", "Source"] and len(rows) == len(CODE)
    found = stall_regions.regions([row[1] for row in rows])
    assert found == {"before the branches": (0, 1), "MMA K loop": (1, 5), "MMA epilogue": (5, 7), "producer": (7, 10)}
    assert [b - a for a, b in found.values()] and sum(b - a for a, b in found.values()) == len(CODE)


def test_the_printed_shares_add_up(stall_regions, tmp_path, capsys, monkeypatch):
    write_page(tmp_path / "page.csv")
    monkeypatch.setattr("sys.argv", ["stall_regions.py", str(tmp_path / "page.csv"), "--top", "2"])
    stall_regions.main()
    out = capsys.readouterr().out
    total = sum(s for _, s, _ in CODE)
    assert f"{total} samples" in out
    assert f"{'MMA K loop':20s} {59 / total:6.1%}  barrier {54 / total:.1%}" in out
    assert f"{'MMA epilogue':20s} {16 / total:6.1%}" in out and f"{'producer':20s} {24 / total:6.1%}" in out
    assert "HGMMA.64x192x16.F32" in out.split("instructions with the most samples:")[1].splitlines()[1]
