"""Building and loading xmesh's own CUDA kernels (``kernels/*.cu``, installed as package data ``xmesh.kernels``).

Each kernel is built on its own: NVRTC gets the whole file with ``XM_SELECT`` and ``XM_WANT_<name>``
defined (``kernels/kernel_select.cuh``), so it generates code for that kernel alone, and a call pays
for the kernels it runs, not for every kernel of the files they live in. A build is a
:class:`KernelBuild`: file, kernel, compiler options, target (``None``: the device's own ``sm_XY``,
as CuPy's ``RawModule`` would pick; or an explicit one such as ``sm_90a``, where Hopper's wgmma
instructions exist) and a generated prelude put before the file.

:func:`prepare` builds many kernels at once, in threads (NVRTC compiles separate programs
concurrently and CuPy's binding releases the GIL while it compiles); when any is not in the disk
cache it prints one line to stderr and a progress bar. :func:`get_function` and
:func:`get_arch_function` return one kernel, building it on demand if no :func:`prepare` did. Binaries
are kept in ``kernel_cache``'s folder, keyed on everything that decides their bits. A kernel whose
file needs a CUDA header (``cuda_fp16.h``) is built through ``cupy.RawModule`` instead, which knows
where CuPy's CUDA headers are. A compile failure raises :class:`~xmesh.errors.KernelCompileError`
naming the kernel and carrying the compiler's log.
"""

from __future__ import annotations

import importlib.resources
import os
import re
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..errors import BackendUnavailableError, KernelCompileError, MissingFileError
from . import kernel_cache

#: Options CuPy's RawModule adds to every build for the device's own target; the kernels built for it
#: keep them so that they compute the same bits as when CuPy built them.
CUPY_DEFAULT_OPTIONS = ("-ftz=true", "--device-as-default-execution-space")


def require_cupy():
    """The ``cupy`` module, or a :class:`BackendUnavailableError` that says what to install."""
    try:
        import cupy
    except ImportError as exc:
        raise BackendUnavailableError(
            "backend='cupy' needs CuPy, which is not installed: run `pip install cupy-cuda12x` "
            '(CUDA 12; `pip install cupy-cuda13x` for CUDA 13) or `pip install "xmesh-p2mpp[cupy]"` on a '
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
            f"the CUDA kernel source {path} is missing: reinstall xmesh-p2mpp (the package data "
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


#: A kernel's definition in kernels/*.cu: ``XM_KERNEL(name)`` or a line that calls a kernel-defining
#: macro with the kernel's name first (``XG_KERNEL(gemm_3x_n64_v, ...)``).
_DEFINITION = re.compile(r"XM_KERNEL\(([a-z]\w*)\)|^[ \t]*[A-Z][A-Z0-9_]*_KERNEL\(([a-z]\w*)\s*,", re.MULTILINE)


def defined_kernels(filename: str) -> set:
    """The names of the kernels ``kernels/filename`` defines (read from its text, no compiler)."""
    code = re.sub(r"//[^\n]*", "", kernel_source(filename))
    return {a or b for a, b in _DEFINITION.findall(code)}


def selection(names) -> str:
    """The defines that make a build of a file generate code for ``names`` alone (kernel_select.cuh)."""
    return "#define XM_SELECT 1\n" + "".join(f"#define XM_WANT_{name} ~, 1\n" for name in sorted(names))


@dataclass(frozen=True)
class KernelBuild:
    """One kernel's build: ``kernels/file``'s kernel ``name`` with compiler ``options``, for ``arch``
    (None: the device's own target) with ``prelude`` (generated source) before the file."""

    file: str
    name: str
    options: tuple = ("-std=c++17",)
    arch: str | None = None
    prelude: str = ""

    def source(self) -> str:
        return selection([self.name]) + self.prelude + kernel_source(self.file)


class _NeedsCudaHeaders(Exception):
    """NVRTC could not open a CUDA header (no include folders are given on the direct route)."""


_lock = threading.RLock()
_loaded: dict = {}  # (KernelBuild, device id) -> a module that holds the kernel
_requested: set = set()  # every KernelBuild a get_*function call asked for in this process
_built_on_demand: set = set()  # those no prepare() had been given before they were asked for
_planned: set = set()  # every KernelBuild given to prepare()
_pending: dict = {}  # (KernelBuild, compute capability) -> Future of its binary


def _nvrtc():
    from cupy_backends.cuda.libs import nvrtc

    return nvrtc


def compiler_version() -> tuple:
    return tuple(_nvrtc().getVersion())


def device_target(compute_capability: str) -> tuple:
    """(arch option, binary kind) for a device of ``compute_capability`` (e.g. "90"): its ``sm_XY``
    cubin where this NVRTC knows the architecture, else PTX of the newest one it knows below it (the
    driver compiles that for the device), as CuPy does."""
    cc = int(compute_capability)
    try:
        supported = [int(a) for a in _nvrtc().getSupportedArchs()]
    except AttributeError:  # an NVRTC binding without the query: assume it knows the device
        supported = [cc]
    if cc in supported:
        return f"sm_{cc}", "cubin"
    older = [a for a in supported if a <= cc]
    if not older:
        raise KernelCompileError(
            f"this NVRTC (version {compiler_version()}) cannot build for compute capability "
            f"{cc // 10}.{cc % 10}: install a CuPy built for a newer CUDA"
        )
    return f"compute_{max(older)}", "ptx"


def _build_options(build: KernelBuild, compute_capability: str) -> tuple:
    """The target and the whole option list of ``build`` on a device of ``compute_capability``."""
    if build.arch is not None:
        return build.arch, (f"-arch={build.arch}",) + tuple(build.options)
    arch, _ = device_target(compute_capability)
    return arch, (f"-arch={arch}",) + tuple(build.options) + CUPY_DEFAULT_OPTIONS


def _nvrtc_compile(build: KernelBuild, source: str, options: tuple) -> bytes:
    """NVRTC's binary of ``source``: a cubin for an ``-arch=sm_*`` option, else PTX (bytes)."""
    nvrtc = _nvrtc()
    program = nvrtc.createProgram(source, build.file, (), ())
    try:
        try:
            nvrtc.compileProgram(program, options)
        except nvrtc.NVRTCError as exc:
            log = nvrtc.getProgramLog(program)
            if "cannot open source file" in log or "could not open source file" in log:
                raise _NeedsCudaHeaders(log) from exc
            raise KernelCompileError(
                f"the CUDA kernel {build.name} ({build.file}, options {list(options)}) failed to compile: {exc}; "
                f"compiler log:\n{log}"
            ) from exc
        if any(o.startswith("-arch=sm_") for o in options):
            return nvrtc.getCUBIN(program)
        return nvrtc.getPTX(program).encode("utf-8") + b"\0"
    finally:
        nvrtc.destroyProgram(program)


def _binary(build: KernelBuild, compute_capability: str):
    """The cached or freshly compiled binary of ``build`` (None where the file needs CUDA headers:
    then CuPy builds it), and whether it was compiled now."""
    arch, options = _build_options(build, compute_capability)
    source = build.source()
    compiled = []

    def compile_now():
        compiled.append(True)
        return _nvrtc_compile(build, source, options)

    try:
        binary = kernel_cache.cached_cubin(
            f"{Path(build.file).stem}-{build.name}", source, arch, options, compiler_version(), compile_now
        )
    except _NeedsCudaHeaders:
        return None, True
    return binary, bool(compiled)


def _load(build: KernelBuild, binary):
    """A module holding ``build``'s kernel on the current device: from ``binary``, or built by CuPy."""
    cupy = require_cupy()
    if binary is None:
        module = cupy.RawModule(code=build.source(), options=tuple(build.options))
        try:
            module.compile()
        except cupy.cuda.compiler.CompileException as exc:
            raise KernelCompileError(
                f"the CUDA kernel {build.name} ({build.file}, options {list(build.options)}) "
                f"failed to compile; compiler log:\n{exc}"
            ) from exc
        return module
    module = cupy.cuda.function.Module()
    module.load(binary)
    return module


def _is_cached(build: KernelBuild, compute_capability: str) -> bool:
    folder = kernel_cache.cache_folder()
    if folder is None:
        return False
    arch, options = _build_options(build, compute_capability)
    key = kernel_cache.cubin_key(build.source(), arch, options, compiler_version())
    return (
        kernel_cache.read_cubin(
            kernel_cache.cubin_path(folder, f"{Path(build.file).stem}-{build.name}", arch, key), warn=False
        )
        is not None
    )


def _announce(count: int, target: str, say: bool = True):
    """The one line said before a process first compiles kernels (``say``), and a progress bar (tqdm,
    where installed and stderr is a terminal) to update once per kernel."""
    folder = kernel_cache.cache_folder()
    where = f"cached in {folder}" if folder is not None else "not cached: XMESH_KERNEL_CACHE_DIR is empty"
    if say:
        print(
            f"xmesh: compiling {count} GPU kernel{'s' if count != 1 else ''} for {target} "
            f"(first use on this machine; {where})",
            file=sys.stderr,
            flush=True,
        )
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=count, unit="kernel", file=sys.stderr, disable=None, leave=False)


_executor = None
_announced = False


def _pool() -> ThreadPoolExecutor:
    global _executor
    with _lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=os.cpu_count() or 4, thread_name_prefix="xmesh-nvrtc")
        return _executor


def prepare(builds, wait: bool = True) -> int:
    """Build every kernel of ``builds`` (KernelBuild) for the current device: the ones the disk cache
    lacks are compiled in threads (one per CPU core). With ``wait`` they are all loaded before this
    returns; without, the compilations go on in the background and each kernel waits for its own
    where it is first used (so the caller's other work, e.g. CuPy's own first-use compilations,
    overlaps them). Returns how many are compiled."""
    global _announced
    cupy = require_cupy()
    device = cupy.cuda.Device()
    cc = str(device.compute_capability)
    with _lock:
        todo = [b for b in dict.fromkeys(builds) if (b, device.id) not in _loaded and (b, cc) not in _pending]
        _planned.update(todo)
    if not todo:
        return 0
    missing = [b for b in todo if not _is_cached(b, cc)]
    bar = None
    if missing:
        with _lock:
            first, _announced = not _announced, True
        bar = _announce(len(missing), ", ".join(sorted({_build_options(b, cc)[0] for b in missing})), say=first)
    left = [len(missing)]

    def build_one(build):
        try:
            return _binary(build, cc)[0]
        finally:
            if bar is not None:
                with _lock:
                    bar.update(1)
                    left[0] -= 1
                    if not left[0]:
                        bar.close()

    pool = _pool()
    with _lock:
        for build in missing:
            _pending[(build, cc)] = pool.submit(build_one, build)
    if wait:
        for build in todo:
            _load_on(build, device.id, cc)
    return len(missing)


def load(builds) -> None:
    """Load every kernel of ``builds`` on the current device now: from an earlier load, its background
    compilation (:func:`prepare` without ``wait``), the disk cache or a compilation here."""
    cupy = require_cupy()
    device = cupy.cuda.Device()
    cc = str(device.compute_capability)
    for build in dict.fromkeys(builds):
        _load_on(build, device.id, cc)


def _load_on(build: KernelBuild, device_id: int, cc: str):
    """``build``'s module on the current device: loaded before, or from its background compilation,
    the disk cache or a compilation now."""
    with _lock:
        module = _loaded.get((build, device_id))
        future = _pending.get((build, cc))
    if module is not None:
        return module
    binary = future.result() if future is not None else _binary(build, cc)[0]
    module = _load(build, binary)
    with _lock:
        module = _loaded.setdefault((build, device_id), module)
        _pending.pop((build, cc), None)
    return module


def _module(build: KernelBuild):
    cupy = require_cupy()
    device = cupy.cuda.Device()
    with _lock:
        _requested.add(build)
        if build not in _planned:
            _built_on_demand.add(build)
    return _load_on(build, device.id, str(device.compute_capability))


#: CUfunction_attribute CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8


class Kernel:
    """A kernel loaded from a binary, called as a ``cupy.RawKernel`` is: ``kernel(grid, block, args,
    shared_mem=...)``, with RawKernel's ``max_dynamic_shared_size_bytes`` (the opt-in above 48 KB)."""

    def __init__(self, function, module):
        self.function, self.module, self.ptr = function, module, function.ptr

    def __call__(self, grid, block, args, *, shared_mem: int = 0, stream=None):
        self.function(grid, block, args, shared_mem=shared_mem, stream=stream)

    @property
    def max_dynamic_shared_size_bytes(self) -> int:
        from cupy_backends.cuda.api import driver

        return driver.funcGetAttribute(_MAX_DYNAMIC_SHARED_SIZE_BYTES, self.ptr)

    @max_dynamic_shared_size_bytes.setter
    def max_dynamic_shared_size_bytes(self, value: int) -> None:
        from cupy_backends.cuda.api import driver

        driver.funcSetAttribute(self.ptr, _MAX_DYNAMIC_SHARED_SIZE_BYTES, int(value))


def _function(build: KernelBuild):
    cupy = require_cupy()
    module = _module(build)
    try:
        function = module.get_function(build.name)
        return function if isinstance(module, cupy.RawModule) else Kernel(function, module)
    except cupy.cuda.driver.CUDADriverError as exc:
        raise KernelCompileError(
            f"the CUDA kernel {build.name} is not in {build.file} "
            f"(options {list(build.options)}, {build.arch or 'device target'}): {exc}"
        ) from exc


def get_function(filename: str, name: str, options: tuple = ()):
    """Kernel ``name`` of ``kernels/filename`` built for the current device's own target."""
    return _function(KernelBuild(filename, name, tuple(options)))


def get_arch_function(filename: str, name: str, arch: str, options: tuple = (), prelude: str = ""):
    """Kernel ``name`` of ``kernels/filename`` built for ``arch`` (e.g. ``"sm_90a"``) with ``prelude``
    (generated source) put before the file."""
    return _function(KernelBuild(filename, name, tuple(options), arch, prelude))


def requested_builds() -> set:
    """Every build a get_function / get_arch_function call asked for in this process."""
    with _lock:
        return set(_requested)


def builds_made_on_demand() -> set:
    """The builds asked for that no :func:`prepare` had been given (each then built alone, on demand)."""
    with _lock:
        return set(_built_on_demand)


def forget_loaded() -> None:
    """Drop the modules loaded in this process and the request records (tests: a fresh process's view)."""
    for future in list(_pending.values()):
        future.exception()
    with _lock:
        _pending.clear()
        _planned.clear()
        _loaded.clear()
        _requested.clear()
        _built_on_demand.clear()
