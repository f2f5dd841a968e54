"""glibc heap settings for a process that allocates batch-sized arrays over and over.

Dask's nanny starts its workers with ``MALLOC_TRIM_THRESHOLD_`` set (to hand freed memory back to
the OS at once), and their children inherit it. Setting it also turns off glibc's adaptive mmap
threshold, so every array over 128 KiB (a batch's images are 29 MB) becomes a fresh mmap, faulted
in and zeroed each time. :func:`keep_batch_memory` restores a heap that reuses such blocks. Where
the batch loop runs in a thread (a cluster worker's), ``one_arena`` also keeps every thread on the
main heap: a thread's own arena (heaps of 64 MB) maps batch-sized blocks afresh far more often.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MMAP_THRESHOLD = 32 << 20  # glibc's largest: blocks up to 32 MB come from the reusable heap
TRIM_THRESHOLD = 256 << 20  # free memory kept at the heap's top before it is returned


def keep_batch_memory(one_arena: bool = False) -> bool:
    """Where ``MALLOC_TRIM_THRESHOLD_`` is set (a Dask worker or its children) and the C library is
    glibc, raise the mmap and trim thresholds for this process (and with ``one_arena`` allocate
    every thread's memory from the main heap); True if they were set."""
    if "MALLOC_TRIM_THRESHOLD_" not in os.environ:
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):  # not glibc (musl, macOS): nothing to set
        return False
    done = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return done and (not one_arena or bool(mallopt(M_ARENA_MAX, 1)))
