"""CUDA's driver started in a thread: without a driver (or with a library that is not CUDA's) the
thread ends quietly, leaving the error to CuPy's own start."""

import threading

import pytest

from xmesh.backends import cuda_driver


@pytest.mark.parametrize("library", ["libxmesh-no-such-library.so", "libc.so.6"])
def test_a_missing_driver_or_a_library_without_cuinit_ends_the_thread_quietly(monkeypatch, library):
    failures = []
    monkeypatch.setattr(threading, "excepthook", failures.append)
    monkeypatch.setattr(cuda_driver, "LIBRARY", library)
    thread = cuda_driver.start_driver()
    thread.join(timeout=10)
    assert not thread.is_alive() and thread.daemon
    assert failures == []
