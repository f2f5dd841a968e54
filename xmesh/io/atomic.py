"""Write outputs atomically: a temporary file beside the target, then ``os.replace``.

An interrupted write leaves either the old file or the new one, never half of one.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
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
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
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
