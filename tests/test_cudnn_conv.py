"""Which convolutions the CuPy backend sends to cuDNN, and how the library is found (CPU; the GPU
results are in test_cupy_backend.py::test_large_convolutions_of_the_speed_modes_go_to_cudnn)."""

from __future__ import annotations

import pytest

from xmesh.backends import cudnn_conv
from xmesh.backends.cudnn_conv import CudnnConv
from xmesh.backends.plan import CUDNN_MIN_FLOP as CONV_MIN_FLOP
from xmesh.backends.plan import conv_on_cudnn


def test_xmesh_cudnn_0_turns_it_off(monkeypatch):
    monkeypatch.setenv("XMESH_CUDNN", "0")
    assert cudnn_conv._library_paths() == []
    assert cudnn_conv.load_library() is None


def test_a_named_library_that_is_missing_leaves_the_backend_without_cudnn(monkeypatch, tmp_path):
    monkeypatch.setenv("XMESH_CUDNN", str(tmp_path / "libcudnn.so.9"))
    assert cudnn_conv.load_library() is None
    assert CudnnConv.create(cupy=None) is None


def _flop(x_shape, w_shape):
    n, h, w, cin = x_shape
    k, _, _, cout = w_shape
    return 2.0 * n * h * w * cout * k * k * cin


@pytest.mark.parametrize(
    "x_shape,w_shape,stride,taken",
    [
        ((192, 112, 112, 32), (3, 3, 32, 32), 1, True),  # stage 2 at 64 samples
        ((64, 7, 7, 512), (3, 3, 512, 512), 1, True),  # stage 1's last layers at 64 samples
        ((192, 224, 224, 16), (3, 3, 16, 32), 2, False),  # strided: TF's uneven 'SAME' padding
        ((64, 28, 28, 128), (5, 5, 128, 256), 2, False),
        ((192, 56, 56, 64), (2, 2, 64, 64), 1, False),  # even kernel: no symmetric 'SAME' padding
        ((3, 112, 112, 32), (3, 3, 32, 32), 1, False),  # one sample's views: our kernel was as fast
        ((16, 224, 224, 16), (3, 3, 16, 16), 1, False),  # stage 1 at 16 samples, 3.7 GFLOP
    ],
)
def test_only_large_stride_1_odd_square_convolutions_go_to_cudnn(x_shape, w_shape, stride, taken):
    assert conv_on_cudnn(x_shape, w_shape, stride) is taken
    if stride == 1 and w_shape[0] % 2:
        assert (_flop(x_shape, w_shape) >= CONV_MIN_FLOP) is taken
