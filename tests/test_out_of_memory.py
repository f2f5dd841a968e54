"""Out of memory in a batched call: the batch is split and retried; one sample that does not fit is reported."""

from __future__ import annotations

import numpy as np
import pytest

import xmesh
from xmesh.errors import DeviceOutOfMemoryError
from xmesh.io.weights import synthetic_weights


@pytest.fixture(scope="module")
def model():
    return xmesh.Reconstructor(synthetic_weights(1))


def fake_network(fits: int, calls: list):
    """A stand-in for one network call that needs memory for at most ``fits`` samples."""

    def run_once(images, cameras, trace):
        calls.append(len(cameras))
        if len(cameras) > fits:
            raise MemoryError(f"simulated: {len(cameras)} samples do not fit")
        key = np.asarray(images, np.float32).reshape(len(cameras), -1)[:, :3]  # per-sample values: order check
        coarse = np.repeat(key[:, None, :], 5, axis=1)
        return coarse, coarse + cameras[:, :1, :3]

    return run_once


def test_batch_is_split_until_it_fits_and_order_is_kept(model, monkeypatch):
    calls: list = []
    monkeypatch.setattr(model, "_run_once", fake_network(fits=2, calls=calls))
    monkeypatch.setattr(model, "max_batch", None)
    rng = np.random.default_rng(0)
    images = rng.random((7, 3, 4, 4, 3), dtype=np.float32)
    cameras = rng.random((7, 3, 5)).astype(np.float32)
    coarse, refined = model.run(images, cameras)
    expected = images.reshape(7, -1)[:, :3]
    np.testing.assert_array_equal(coarse[:, 0], expected)
    np.testing.assert_array_equal(refined[:, 0], expected + cameras[:, 0, :3])
    assert calls[0] == 7 and max(c for c in calls if c <= 2) == 2
    assert model.max_batch == 2  # remembered: the next call goes straight to chunks of 2
    calls.clear()
    model.run(images[:5], cameras[:5])
    assert calls == [2, 2, 1]


def test_one_sample_that_does_not_fit_is_reported(model, monkeypatch):
    monkeypatch.setattr(model, "_run_once", fake_network(fits=0, calls=[]))
    monkeypatch.setattr(model, "max_batch", None)
    images = np.zeros((2, 3, 4, 4, 3), np.float32)
    cameras = np.ones((2, 3, 5), np.float32)
    with pytest.raises(DeviceOutOfMemoryError, match="even one sample does not fit.*backend='numpy'"):
        model.run(images, cameras)


def test_other_errors_are_not_retried(model, monkeypatch):
    calls: list = []

    def broken(images, cameras, trace):
        calls.append(len(cameras))
        raise ValueError("not a memory problem")

    monkeypatch.setattr(model, "_run_once", broken)
    with pytest.raises(ValueError, match="not a memory problem"):
        model.run(np.zeros((4, 3, 4, 4, 3), np.float32), np.ones((4, 3, 5), np.float32))
    assert calls == [4]


def test_a_capture_out_of_memory_leaves_that_batch_size_eager(model, monkeypatch):
    """A CUDA graph capture that runs out of memory does not fail the call or split the batch: the
    call runs eagerly, and that batch size is not captured again."""
    import importlib

    rec = importlib.import_module("xmesh.reconstruct")  # the module (xmesh.reconstruct is also a function)

    captures: list = []
    eager: list = []

    def capture(batch, images, cameras):
        captures.append(batch)
        raise MemoryError("simulated: no room for the graphs")

    def run_eagerly(backend, stage1, stage2, host, tf, view_quirk):
        eager.append(len(host))
        return np.zeros((len(host), 5, 3)), np.ones((len(host), 5, 3))

    monkeypatch.setattr(model, "graphs", True)
    monkeypatch.setattr(model, "max_batch", None)
    monkeypatch.setattr(model, "_room_for_graphs", lambda batch: True)
    monkeypatch.setattr(model, "_capture", capture)
    monkeypatch.setattr(rec.DeviceTransforms, "from_cameras", staticmethod(lambda backend, cameras: None))
    monkeypatch.setattr(rec.network, "run_network_from_host", run_eagerly)
    images, cameras = np.zeros((2, 3, 224, 224, 3), np.float32), np.ones((2, 3, 5), np.float32)
    for _ in range(4):
        coarse, refined = model.run(images, cameras)
        np.testing.assert_array_equal(refined, np.ones((2, 5, 3)))
    assert captures == [2]  # the second call tried once
    assert model.graph_bytes() == {}  # and holds no graph
    assert eager == [2, 2, 2, 2]  # every call ran, whole
    assert model.max_batch is None
