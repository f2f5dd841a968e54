"""Write outputs atomically: a temporary file beside the target, then ``os.replace``.

An interrupted write leaves either the old file or the new one, never half of one.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import IO, Iterator


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
