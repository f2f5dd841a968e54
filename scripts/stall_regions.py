"""Where a warp-specialised kernel's warps spend their time, from Nsight Compute's per-instruction samples.

Reads the source page of one profiled launch (SASS, with the SourceCounters section) and splits its
warp-state samples by role: the MMA warpgroups' K loop (from their ``setmaxnreg`` increase to their last
``wgmma.wait_group 0``), their epilogue (from there to the producer's ``setmaxnreg`` decrease), and the
producer warpgroup (the rest). Each region's share of all samples and its leading stall reasons, then
the instructions with the most samples. A sample is a warp caught at an instruction, so a region's
share is the share of the warps' time spent there. For kernels/wgmma_drb16_chain.cu::

    ncu --kernel-name regex:wg_drb_chain --launch-skip 1 --launch-count 1 --section WarpStateStats \\
        --section SourceCounters --import-source no -o chain -f python3 scripts/chain_bench.py --repeat 1 --batch 16
    ncu --import chain.ncu-rep --page source --csv --print-source sass > chain_source.csv
    python3 scripts/stall_regions.py chain_source.csv
"""

from __future__ import annotations

import argparse
import csv

SAMPLES = "Warp Stall Sampling (All Samples)"


def _number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def read_source(path: str) -> tuple[list[str], list[list[str]]]:
    """The header and instruction rows of an ``ncu --page source --csv`` file (the kernel-name line skipped)."""
    with open(path, newline="") as f:
        rows = [row for row in csv.reader(f) if row]
    start = next(i for i, row in enumerate(rows) if row[:2] == ["Address", "Source"])
    return rows[start], rows[start + 1 :]


def regions(code: list[str]) -> dict[str, tuple[int, int]]:
    """Instruction index ranges of the MMA K loop, the MMA epilogue and the producer."""
    grow = next(i for i, c in enumerate(code) if "USETMAXREG.TRY_ALLOC" in c)
    shrink = next(i for i, c in enumerate(code) if "USETMAXREG.DEALLOC" in c)
    last_wait = max(i for i, c in enumerate(code[:shrink]) if "WARPGROUP.DEPBAR.LE gsb0, 0x0" in c)
    if grow > shrink:  # the producer's branch came first
        raise SystemExit("stall_regions: expected the MMA warpgroups' branch before the producer's")
    return {
        "before the branches": (0, grow),
        "MMA K loop": (grow, last_wait + 1),
        "MMA epilogue": (last_wait + 1, shrink),
        "producer": (shrink, len(code)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    parser.add_argument("--top", type=int, default=12, help="instructions listed (default 12)")
    args = parser.parse_args()
    header, rows = read_source(args.csv)
    at = header.index(SAMPLES)
    reasons = [(h, header.index(h)) for h in header if h.startswith("stall_") and "Not Issued" not in h]
    samples = [_number(row[at]) for row in rows]
    total = sum(samples) or 1.0
    print(f"{len(rows)} instructions, {total:.0f} samples")
    for name, (a, b) in regions([row[1] for row in rows]).items():
        share = sum(samples[a:b]) / total
        lead = sorted(((sum(_number(r[i]) for r in rows[a:b]) / total, h[6:]) for h, i in reasons), reverse=True)[:4]
        print(f"{name:20s} {share:6.1%}  " + ", ".join(f"{reason} {part:.1%}" for part, reason in lead))
    print("\ninstructions with the most samples:")
    for i in sorted(range(len(rows)), key=lambda i: -samples[i])[: args.top]:
        lead = max(((_number(rows[i][j]), h[6:]) for h, j in reasons), default=(0, ""))
        print(f"{i:6d} {samples[i] / total:6.1%}  {rows[i][1].strip()[:64]:64s} {lead[1]}")


if __name__ == "__main__":
    main()
