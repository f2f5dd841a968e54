"""Write outputs atomically: a temporary file beside the target, then ``os.replace``.

An interrupted write leaves either the old file or the new one, never half of one. The temporary
file is created as ``open`` creates any new file (mode 0666 less the umask, and a folder's default
ACL), not with ``tempfile.mkstemp``'s 0600, so the result is as readable as any other new file there.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import IO


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", encoding: str | None = None) -> Iterator[IO]:
    """Open a temporary file in ``path``'s folder; on success flush, fsync and rename it onto ``path``."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_write: mode must be 'w' or 'wb', not {mode!r}")
    target = Path(path)
    folder = target.parent if str(target.parent) else Path(".")
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = _new_temporary(folder, target.name)
    try:
        if mode == "w":
            handle = os.fdopen(fd, mode, encoding=encoding or "utf-8", newline="")
        else:
            handle = os.fdopen(fd, mode)
        with handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _new_temporary(folder: Path, name: str) -> tuple[int, str]:
    """A new hidden file ``.{name}.{random}.tmp`` in ``folder``, opened for writing: (descriptor, path)."""
    while True:
        tmp = os.path.join(folder, f".{name}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666), tmp
        except FileExistsError:
            continue


def os_error_reason(exc: OSError) -> str:
    """A short reason for an OS error on an output path, for messages."""
    if isinstance(exc, (FileExistsError, NotADirectoryError)):
        return "a part of its folder path is a file, not a folder"
    return str(exc.strerror or exc)


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike, mode: str, what: str) -> Iterator[IO]:
    """``atomic_write`` whose OS errors about the path itself (a folder, a folder that cannot be
    made, a rename that fails) become an InputError naming the file; errors raised while the body
    writes (e.g. a full disk) propagate unchanged."""
    from ..errors import InputError, XmeshError

    target = Path(path)
    if target.is_dir():
        raise InputError(f"{what} output {str(target)!r} is a folder; expected the path of a file to write")
    in_body = False
    try:
        with atomic_write(target, mode) as handle:
            try:
                yield handle
            except BaseException:
                in_body = True
                raise
    except OSError as exc:
        if in_body or isinstance(exc, XmeshError):
            raise
        raise InputError(
            f"cannot write the {what} file {str(target)!r} ({os_error_reason(exc)}); expected a writable file path "
            "in an existing or creatable folder (the previous file, if any, is unchanged)"
        ) from None
