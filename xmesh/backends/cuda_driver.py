"""CUDA's driver started in a thread, beside the rest of a process's start.

``cuInit`` opens the GPUs the process sees: 0.1-0.35 s for one H200 on the machines measured, up
to a second with four visible, and processes that call it at once get through it largely one after
another (``scripts/cuda_start.py``). Called through ctypes, which lets go of the interpreter lock,
it runs while the process imports its modules and lists its dataset; CuPy's first call then finds
the driver started. Nothing here makes a CUDA context.
"""

from __future__ import annotations

import ctypes
import threading

LIBRARY = "libcuda.so.1"


def _init() -> None:
    try:
        ctypes.CDLL(LIBRARY).cuInit(0)
    except (OSError, AttributeError):  # no driver: CuPy's own start says so, in its words
        pass


def start_driver() -> threading.Thread:
    """Call ``cuInit`` in a daemon thread now; returns the thread. Without a driver it does nothing."""
    thread = threading.Thread(target=_init, name="xmesh-cuda-init", daemon=True)
    thread.start()
    return thread
