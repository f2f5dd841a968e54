"""Finding a CUDA library for ctypes (cuDNN, cuBLAS): a file an environment variable names (``0``: none),
else the copies already mapped into this process, those of CUDA's Python wheel, then the loader's
search by soname; the first that loads and passes the caller's check is taken."""

from __future__ import annotations

import ctypes
import glob
import importlib
import os
from collections.abc import Callable, Sequence


def _mapped(stem: str) -> list[str]:
    """Files of ``stem`` (e.g. ``libcublas.so``) mapped into this process (Linux)."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            return sorted({line.split()[-1] for line in maps if f"/{stem}" in line})
    except OSError:
        return []


def candidate_paths(env: str, stem: str, wheel: str, sonames: Sequence[str], mapped: bool = False) -> list[str]:
    """Where to look, in order: ``$env`` alone where set ([] for ``0``); else, with ``mapped``, the files
    of ``stem`` already in this process, then ``stem.*`` in the lib folder of the ``wheel`` package
    (``nvidia.cudnn``), then ``sonames``."""
    named = os.environ.get(env, "")
    if named:
        return [] if named == "0" else [named]
    paths = _mapped(stem) if mapped else []
    try:
        package = importlib.import_module(wheel)
        for root in package.__path__:
            paths += sorted(glob.glob(os.path.join(root, "lib", f"{stem}.*")))
    except ImportError:
        pass
    return paths + list(sonames)


def load_first(paths: Sequence[str], usable: Callable[[ctypes.CDLL], bool]):
    """The first of ``paths`` that loads and that ``usable`` accepts, as a ctypes handle; None if none."""
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        if usable(lib):
            return lib
    return None
