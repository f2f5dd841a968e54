"""scripts/chain_bench.py's arithmetic on the CPU: the K slices a tile runs, its shared-memory traffic
and the two floors it prints beside the chained kernel's time."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load_script():
    spec = importlib.util.spec_from_file_location("chain_bench", ROOT / "scripts" / "chain_bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cb = _load_script()


def test_slices_and_shared_traffic_of_a_tile():
    assert cb.tile_slices(339) == 11 + 24 and cb.tile_slices(192) == 6 + 24
    parts = cb.shared_bytes_per_tile(339)
    # a 32-column slice: each of 3 MMA warpgroups reads 64 rows of Z and of the input (4 KB each) and
    # both 192 x 32 W pieces (12 KB each); the bulk copy writes those two pieces once
    assert parts["wgmma A"] == 35 * 3 * 2 * 4096 and parts["wgmma B"] == 35 * 3 * 2 * 12288
    assert parts["W copies in"] == 35 * 2 * 12288
    assert parts["X copies in"] == 11 * 176 * 64
    # 4 warps x (43 loads + 43 stores) a slice, each a whole 128-byte cycle of the shared memory
    assert parts["producer"] == 35 * 4 * 86 * 128
    # x1..x4 (172 rows x 192 columns x 2 bytes) stored, x1 and x3 read again
    assert parts["epilogues"] == 6 * 172 * 192 * 2


def test_floors_scale_with_the_tiles_each_multiprocessor_runs():
    tensor, shared = cb.floors_ms(64, 132, 1.98e9)
    tiles = 64 * 617 / 132
    flop = 35 * 2 * 2 * 192 * 192 * 32 * tiles
    assert tensor == pytest.approx(flop / (989e12 / (132 * 1.83e9)) / 1.98e9 * 1e3)
    assert shared == pytest.approx(tiles * sum(cb.shared_bytes_per_tile().values()) / 128 / 1.98e9 * 1e3)
    assert shared > tensor  # this design moves more through shared memory than its products take
    assert cb.floors_ms(128, 132, 1.98e9) == pytest.approx((2 * tensor, 2 * shared))
    assert cb.floors_ms(64, 132, 0.99e9) == pytest.approx((2 * tensor, 2 * shared))


def test_supports_that_take_the_producer_apart():
    real = np.arange(43 * 43, dtype=float).reshape(43, 43)
    assert cb.support("real", real) is real
    assert np.array_equal(cb.support("identity", real), np.eye(43))
    assert not cb.support("zero", real).any() and cb.support("zero", real).shape == (43, 43)
