"""Loading xmesh's own CUDA kernels (``kernels/*.cu``, installed as package data ``xmesh.kernels``).

``get_function(file, name)`` compiles ``file`` once per (device, options) with ``cupy.RawModule`` and
returns the kernel ``name``; a compile failure raises :class:`~xmesh.errors.KernelCompileError`
naming the kernel and carrying the compiler's log. ``get_arch_function(file, name, arch)`` does the
same for an explicit target such as ``sm_90a`` (Hopper's wgmma instructions exist only there, and
CuPy's RawModule always compiles for the plain ``sm_XY`` of the device) with NVRTC, keeping the cubin
in ``kernel_cache``'s folder so that the next process loads it instead of compiling it again.
"""
from __future__ import annotations

import functools
import importlib.resources
import re
from pathlib import Path

from ..errors import BackendUnavailableError, KernelCompileError, MissingFileError
from . import kernel_cache


def require_cupy():
    """The ``cupy`` module, or a :class:`BackendUnavailableError` that says what to install."""
    try:
        import cupy
    except ImportError as exc:
        raise BackendUnavailableError(
            "backend='cupy' needs CuPy, which is not installed: run `pip install cupy-cuda12x` "
            "(CUDA 12; `pip install cupy-cuda13x` for CUDA 13) or `pip install xmesh[cupy]` on a "
            "machine with an NVIDIA GPU, or use backend='numpy'"
        ) from exc
    return cupy


def kernel_path(filename: str):
    """Where ``filename`` lives: the installed package data ``xmesh.kernels``, or, when xmesh is
    imported straight from a source checkout (where ``kernels/`` sits beside ``xmesh/``), that folder."""
    try:
        return importlib.resources.files("xmesh.kernels").joinpath(filename)
    except ModuleNotFoundError:
        return Path(__file__).resolve().parents[2] / "kernels" / filename


#: ``#include "name.cuh"``: a header of our own (kernels/*.cuh), put in place by kernel_source
_LOCAL_INCLUDE = re.compile(r'^[ \t]*#include[ \t]+"([A-Za-z0-9_]+\.cuh)"[ \t]*$', re.MULTILINE)


def _read_kernel_file(filename: str) -> str:
    path = kernel_path(filename)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise MissingFileError(
            f"the CUDA kernel source {path} is missing: reinstall xmesh (the package data "
            f"xmesh/kernels/*.cu and *.cuh must be installed)"
        ) from exc


def kernel_source(filename: str, _included: set | None = None) -> str:
    """The text of ``kernels/filename`` with each ``#include "name.cuh"`` of a header of ours replaced
    by that header's text (expanded the same way, each header once: NVRTC gets one self-contained
    source and needs no include path)."""
    included = set() if _included is None else _included

    def expand(match):
        header = match.group(1)
        if header in included:
            return f"// {header}: included above"
        included.add(header)
        return f"// ---- {header}\n{kernel_source(header, included)}\n// ---- end of {header}"

    return _LOCAL_INCLUDE.sub(expand, _read_kernel_file(filename))


@functools.lru_cache(maxsize=None)
def _module(filename: str, options: tuple, device: int):
    cupy = require_cupy()
    module = cupy.RawModule(code=kernel_source(filename), options=options)
    module.compile()
    return module


def get_function(filename: str, name: str, options: tuple = ()):
    """Kernel ``name`` of ``kernels/filename``, compiled on first use for the current device."""
    cupy = require_cupy()
    try:
        module = _module(filename, tuple(options), cupy.cuda.Device().id)
    except cupy.cuda.compiler.CompileException as exc:
        raise KernelCompileError(
            f"the CUDA kernel {name} ({filename}, options {list(options)}) failed to compile; compiler log:\n{exc}"
        ) from exc
    try:
        return module.get_function(name)
    except cupy.cuda.driver.CUDADriverError as exc:
        raise KernelCompileError(f"the CUDA kernel {name} is not in {filename} (options {list(options)}): {exc}") from exc


def _nvrtc_cubin(filename: str, source: str, arch: str, options: tuple) -> bytes:
    from cupy_backends.cuda.libs import nvrtc

    program = nvrtc.createProgram(source, filename, (), ())
    try:
        try:
            nvrtc.compileProgram(program, (f"-arch={arch}",) + options)
        except nvrtc.NVRTCError as exc:
            raise KernelCompileError(
                f"{filename} failed to compile for {arch} (options {list(options)}): {exc}; compiler log:\n"
                f"{nvrtc.getProgramLog(program)}"
            ) from exc
        return nvrtc.getCUBIN(program)
    finally:
        nvrtc.destroyProgram(program)


@functools.lru_cache(maxsize=None)
def _arch_module(filename: str, arch: str, options: tuple, device: int, prelude: str = ""):
    cupy = require_cupy()
    from cupy_backends.cuda.libs import nvrtc

    source = prelude + kernel_source(filename)
    cubin = kernel_cache.cached_cubin(filename, source, arch, options, tuple(nvrtc.getVersion()),
                                      lambda: _nvrtc_cubin(filename, source, arch, options))
    module = cupy.cuda.function.Module()
    module.load(cubin)
    return module


def get_arch_function(filename: str, name: str, arch: str, options: tuple = (), prelude: str = ""):
    """Kernel ``name`` of ``kernels/filename`` compiled with NVRTC for ``arch`` (e.g. ``"sm_90a"``),
    once per (device, arch, options, prelude); ``prelude``: generated source put before the file."""
    cupy = require_cupy()
    module = _arch_module(filename, arch, tuple(options), cupy.cuda.Device().id, prelude)
    try:
        return module.get_function(name)
    except cupy.cuda.driver.CUDADriverError as exc:
        raise KernelCompileError(f"the CUDA kernel {name} is not in {filename} ({arch}): {exc}") from exc
