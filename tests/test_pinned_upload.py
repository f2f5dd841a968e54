"""Host -> device uploads through pinned staging slots (xmesh/backends/pinned_upload.py).

The CPU tests run the uploader's chunking and slot ring against a stand-in for the CUDA runtime whose
copies are plain ``memmove``s (so they check which rows land where, at which pitch, in which dtype);
the GPU tests check the real copies, including a slot ring that must wait for the device before it
refills a slot."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from conftest import requires_cuda
from xmesh.backends.pinned_upload import PinnedUploader


class _Runtime:
    memcpyHostToDevice = 1

    def __init__(self):
        self.copies = []

    def memcpy2DAsync(self, dst, dpitch, src, spitch, width, height, kind, stream):
        assert kind == self.memcpyHostToDevice and width <= dpitch and width <= spitch
        self.copies.append((height, width))
        for row in range(height):
            ctypes.memmove(dst + row * dpitch, src + row * spitch, width)


class _Event:
    def record(self, stream):
        pass

    def synchronize(self):
        pass


class _FakeCupy:
    """Just what PinnedUploader uses of CuPy, with host memory standing in for the device's."""

    def __init__(self):
        runtime = _Runtime()
        self.cuda = type("cuda", (), {"runtime": runtime, "Event": staticmethod(lambda disable_timing: _Event())})


class _HostUploader(PinnedUploader):
    def _pinned_bytes(self, size):
        return np.zeros(size, dtype=np.uint8)


class _Stream:
    ptr = 0


@pytest.mark.parametrize("rows, slot_rows, slots", [(1, 1, 2), (3, 1, 4), (13, 2, 3), (64, 6, 4), (7, 100, 2)])
def test_rows_land_at_their_pitch_through_the_slot_ring(rows, slot_rows, slots):
    rng = np.random.default_rng(rows)
    source = rng.normal(size=(rows, 3, 5, 7)).astype(np.float64)  # converted to float32 on the way
    strided = source[:, 1:3]  # two of three "views", not contiguous
    row_bytes = 2 * 5 * 7 * 4
    fake = _FakeCupy()
    up = _HostUploader(fake, slot_bytes=slot_rows * row_bytes, slots=slots, threads=3, min_bytes=0)
    device = np.full((rows, 3, 5, 7), np.nan, dtype=np.float32)
    up.copy_rows(device.ctypes.data + 5 * 7 * 4, 3 * 5 * 7 * 4, strided, _Stream())
    np.testing.assert_array_equal(device[:, 1:3], strided.astype(np.float32))
    assert np.isnan(device[:, 0]).all()  # the view outside the run is untouched
    heights = [h for h, _ in fake.cuda.runtime.copies]
    assert sum(heights) == rows and max(heights) <= slot_rows
    assert len(heights) >= min(rows, slots)  # every slot takes part when there are rows enough


def test_small_or_oversized_rows_go_straight_from_the_source():
    fake = _FakeCupy()
    up = _HostUploader(fake, slot_bytes=64, slots=2, min_bytes=1 << 20)
    source = np.arange(24, dtype=np.int32).reshape(4, 6)
    device = np.zeros((4, 6), dtype=np.float32)
    up.copy_rows(device.ctypes.data, 24, source, _Stream())
    np.testing.assert_array_equal(device, source.astype(np.float32))
    assert fake.cuda.runtime.copies == [(4, 24)] and up._pinned is None  # one copy, no slots made


@requires_cuda
@pytest.mark.parametrize("slot_rows, slots", [(1, 2), (3, 3), (16, 4)])
def test_a_slot_is_refilled_only_after_the_device_read_it(cp, slot_rows, slots):
    """The stream is busy with a long chain of kernels when the copies are queued, so the DMAs wait
    behind it; a worker that refilled a slot before its DMA ran would corrupt an earlier chunk."""
    rng = np.random.default_rng(slots)
    host = rng.uniform(0, 1, (40, 3, 32, 32, 3)).astype(np.float32)
    expected = host.copy()
    row_bytes = 3 * 32 * 32 * 3 * 4
    up = PinnedUploader(cp, slot_bytes=slot_rows * row_bytes, slots=slots, threads=3, min_bytes=0)
    device = cp.zeros(host.shape, dtype=cp.float32)
    busy = cp.zeros(1 << 24, dtype=cp.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        for _ in range(60):
            busy = cp.sin(busy) + 1.0
        up.copy_rows(device.data.ptr, row_bytes, host, stream)
    host[:] = -1.0  # the caller may reuse its array once copy_rows returns
    stream.synchronize()
    np.testing.assert_array_equal(device.get(), expected)


@requires_cuda
def test_backend_copy_into_uploads_large_host_arrays_exactly(cp, gb):
    host = np.random.default_rng(5).uniform(0, 1, (30, 224, 224, 3)).astype(np.float32)  # 18 MB: pinned path
    device = cp.zeros(host.shape, dtype=cp.float32)
    gb.copy_into(device, host.reshape(10, 3, 224, 224, 3))
    np.testing.assert_array_equal(device.get(), host)
    with pytest.raises(ValueError, match="do not fit"):
        gb.copy_into(device[:3], host)
