"""The on-disk cache of the kernel binaries NVRTC builds (``cuda_kernels``: one file per kernel build).

Without it every new process would compile its kernels again before its first sample.

A cubin is stored under a key made of everything that decides its bits: the whole source text
(the generated prelude included), the architecture, the compiler options and NVRTC's version. The
file holds a digest of the cubin, so a damaged file is noticed, compiled again and replaced.

Folder: ``$XMESH_KERNEL_CACHE_DIR``, else ``$XDG_CACHE_HOME/xmesh/kernels``, else
``~/.cache/xmesh/kernels``. Set ``XMESH_KERNEL_CACHE_DIR`` to an empty string to keep compiled
kernels in memory only. Writes are atomic (a temporary file, then a rename), so processes that
compile the same kernel at once both succeed and leave one whole file. A folder that cannot be written costs a
warning, once per process, and the kernels are compiled per process as before.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from collections.abc import Callable
from pathlib import Path

from ..io.atomic import atomic_write

#: bump when the key or the file layout changes, so that old files are never read as new ones
FORMAT = 1
_MAGIC = b"xmesh-cubin"
_warned_folders: set[str] = set()


def cache_folder() -> Path | None:
    """Where cubins are kept, or None where ``XMESH_KERNEL_CACHE_DIR`` is set empty (no disk cache)."""
    chosen = os.environ.get("XMESH_KERNEL_CACHE_DIR")
    if chosen is not None:
        return Path(chosen).expanduser() if chosen.strip() else None
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "xmesh" / "kernels"


def cubin_key(source: str, arch: str, options: tuple, compiler_version: tuple) -> str:
    """A hex digest of everything that decides the cubin's bits."""
    digest = hashlib.sha256()
    for part in (f"format {FORMAT}", arch, repr(tuple(options)), repr(tuple(compiler_version)), source):
        data = part.encode("utf-8")
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


def cubin_path(folder: Path, filename: str, arch: str, key: str) -> Path:
    """The cache file of one build: the source file's stem and the architecture, for people who look."""
    return folder / f"{Path(filename).stem}-{arch}-{key[:40]}.cubin"


def _pack(cubin: bytes) -> bytes:
    return _MAGIC + b" " + hashlib.sha256(cubin).hexdigest().encode("ascii") + b"\n" + cubin


def _unpack(data: bytes) -> bytes | None:
    """The cubin of a cache file, or None if the file is not one whole cache file."""
    header, sep, cubin = data.partition(b"\n")
    parts = header.split(b" ")
    if not sep or len(parts) != 2 or parts[0] != _MAGIC:
        return None
    return cubin if hashlib.sha256(cubin).hexdigest().encode("ascii") == parts[1] else None


def read_cubin(path: Path, warn: bool = True) -> bytes | None:
    """The cubin stored at ``path``, or None if there is none or it is damaged (a damaged one costs a
    warning with ``warn``: it is then compiled again and replaced)."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    cubin = _unpack(data)
    if cubin is None and warn:
        warnings.warn(
            f"xmesh: the kernel cache file {path} is damaged (truncated or changed since it was "
            f"written); compiling the kernel again and replacing the file",
            RuntimeWarning,
            stacklevel=3,
        )
    return cubin


def write_cubin(path: Path, cubin: bytes) -> bool:
    """Store ``cubin`` at ``path`` atomically; False (with a warning, once per folder) if it cannot be."""
    try:
        with atomic_write(path, "wb") as handle:
            handle.write(_pack(cubin))
        return True
    except OSError as exc:
        folder = str(path.parent)
        if folder not in _warned_folders:
            _warned_folders.add(folder)
            warnings.warn(
                f"xmesh could not write its kernel cache in {folder} ({exc.strerror or exc}); the GPU "
                f"kernels will be compiled again in every process. Set XMESH_KERNEL_CACHE_DIR to a "
                f"writable folder (or to an empty string to turn the disk cache off and this warning with it)",
                RuntimeWarning,
                stacklevel=3,
            )
        return False


def cached_cubin(
    filename: str, source: str, arch: str, options: tuple, compiler_version: tuple, compile_cubin: Callable[[], bytes]
) -> bytes:
    """The cubin of ``source`` built for ``arch``: from the disk cache where it holds a whole copy,
    else ``compile_cubin()``, stored for the next process."""
    folder = cache_folder()
    if folder is None:
        return compile_cubin()
    path = cubin_path(folder, filename, arch, cubin_key(source, arch, options, compiler_version))
    cubin = read_cubin(path)
    if cubin is None:
        cubin = compile_cubin()
        write_cubin(path, cubin)
    return cubin
