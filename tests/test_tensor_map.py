"""Tensor-map arguments are checked before the driver is asked (xmesh/backends/tensor_map.py); the
maps themselves are exercised on the GPU by the chained layers' tests (tests/test_drb16_chain.py)."""

import pytest

from xmesh.backends import tensor_map


@pytest.mark.parametrize(
    "address,strides,box,match",
    [
        (0x1008, (688, 688 * 50), (64, 4, 43), "16-byte"),  # address not 16-byte aligned
        (0x1000, (680, 680 * 50), (64, 4, 43), "16-byte"),  # rows 340 elements apart
        (0x1000, (688, 688 * 50), (128, 4, 43), "128 bytes"),  # a box row of 256 bytes
        (0x1000, (688,), (64, 4, 43), "2 strides"),  # a stride missing
    ],
)
def test_bad_layouts_are_refused_with_the_reason(address, strides, box, match):
    with pytest.raises(ValueError, match=match):
        tensor_map.tiled(address, (339, 50, 86), strides, box, element_bytes=2)


def test_the_drivers_encoding_is_passed_on_whole(monkeypatch):
    """tiled() hands the driver a 64-byte aligned room, the sizes, strides and box as given, and returns
    the 128 bytes the driver wrote there as the kernels' parameter (byte for byte)."""
    import ctypes

    seen = {}

    def encode(at, data_type, rank, address, dims, strides, box, element_strides, *modes):
        seen.update(
            at=at,
            data_type=data_type,
            rank=rank,
            address=address,
            dims=list(dims[:rank]),
            strides=list(strides[: rank - 1]),
            box=list(box[:rank]),
            modes=modes,
        )
        ctypes.memmove(at, bytes(range(128)), 128)
        return 0

    monkeypatch.setattr(tensor_map, "_encode_tiled", lambda: encode)
    param = tensor_map.tiled(0x1000, (339, 50, 86), (688, 688 * 50), (64, 4, 43), element_bytes=2)
    assert seen["at"] % 64 == 0 and seen["rank"] == 3 and seen["address"] == 0x1000
    assert seen["dims"] == [339, 50, 86] and seen["strides"] == [688, 688 * 50] and seen["box"] == [64, 4, 43]
    assert seen["data_type"] == tensor_map.DATA_UINT16
    assert seen["modes"] == (
        tensor_map.INTERLEAVE_NONE,
        tensor_map.SWIZZLE_128B,
        tensor_map.L2_PROMOTION_256B,
        tensor_map.OOB_FILL_ZERO,
    )
    assert param.dtype == tensor_map.TENSOR_MAP_DTYPE and param.tobytes() == bytes(range(128))


def test_a_driver_error_is_named_with_the_layout(monkeypatch):
    monkeypatch.setattr(tensor_map, "_encode_tiled", lambda: lambda *args: 1)
    with pytest.raises(RuntimeError, match=r"CUresult 1.*\(339, 50, 86\)"):
        tensor_map.tiled(0x1000, (339, 50, 86), (688, 688 * 50), (64, 4, 43), element_bytes=2)


def test_a_driver_without_tensor_maps_is_named(monkeypatch):
    def no_driver(name):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(tensor_map.ctypes, "CDLL", no_driver)
    tensor_map._encode_tiled.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="cuTensorMapEncodeTiled.*CUDA 12 or newer driver"):
            tensor_map.tiled(0x1000, (339, 50, 86), (688, 688 * 50), (64, 4, 43), element_bytes=2)
    finally:
        tensor_map._encode_tiled.cache_clear()
