"""The array backend shim: one model, NumPy on the CPU or CuPy on an NVIDIA GPU.

``get_backend(name)`` returns a :class:`~xmesh.backends.base.Backend`: its ``xp`` is the array
namespace (array-api-compat's wrapper of NumPy or CuPy), and it carries the few operations the
model needs beyond the array API (sparse x dense products, 'SAME' convolutions) plus optional fast
paths for the projections and the local graph convolution. Model code never imports NumPy or CuPy.
"""

from __future__ import annotations

from ..errors import BackendUnavailableError, InputError
from .base import Backend

BACKENDS = ("numpy", "cupy")
_cache: dict[tuple, Backend] = {}


def get_backend(name: str | Backend = "numpy", **options) -> Backend:
    """The backend called ``name`` ("numpy" or "cupy"); fails at once, saying what to install, if it cannot run."""
    if isinstance(name, Backend):
        return name
    if not isinstance(name, str) or name.lower() not in BACKENDS:
        raise InputError(f"backend={name!r}: unknown backend; choose one of {', '.join(BACKENDS)}")
    key = (name.lower(), tuple(sorted(options.items())))
    if key not in _cache:
        if key[0] == "numpy":
            from .numpy_backend import NumpyBackend

            _cache[key] = NumpyBackend(**options)
        else:
            from .cupy_backend import CupyBackend

            _cache[key] = CupyBackend(**options)
    return _cache[key]


def available_backends() -> list[str]:
    """The names of the backends that can run on this machine."""
    names = []
    for name in BACKENDS:
        try:
            get_backend(name)
        except BackendUnavailableError:
            continue
        names.append(name)
    return names


__all__ = ["Backend", "get_backend", "available_backends", "BACKENDS"]
