"""Tensor-map arguments are checked before the driver is asked (xmesh/backends/tensor_map.py); the
maps themselves are exercised on the GPU by the chained layers' tests (tests/test_drb16_chain.py)."""
import pytest

from xmesh.backends import tensor_map


@pytest.mark.parametrize("address,strides,box,match", [
    (0x1008, (688, 688 * 50), (64, 4, 43), "16-byte"),            # address not 16-byte aligned
    (0x1000, (680, 680 * 50), (64, 4, 43), "16-byte"),            # rows 340 elements apart
    (0x1000, (688, 688 * 50), (128, 4, 43), "128 bytes"),         # a box row of 256 bytes
    (0x1000, (688,), (64, 4, 43), "2 strides"),                   # a stride missing
])
def test_bad_layouts_are_refused_with_the_reason(address, strides, box, match):
    with pytest.raises(ValueError, match=match):
        tensor_map.tiled(address, (339, 50, 86), strides, box, element_bytes=2)


def test_the_parameter_is_the_drivers_128_bytes():
    assert tensor_map.TENSOR_MAP_DTYPE.itemsize == 128


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
