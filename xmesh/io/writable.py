"""Check that an output can be written before the work that produces it starts.

Each check makes and removes a temporary entry where the output will go (or, where the folder does
not exist yet, in the nearest folder that does), so a read-only mount, an immutable folder, /proc or
a path through a file fails at once, with one error naming the option and the path.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ..errors import UnwritableOutputError
from .atomic import os_error_reason

PROBE_PREFIX = ".xmesh-write-check-"


def _refuse(what: str, path: Path, reason: str) -> UnwritableOutputError:
    return UnwritableOutputError(
        f"{what} {path}: cannot be written ({reason}); nothing was computed; give a path in a folder you can write to"
    )


def _nearest_existing(folder: Path) -> Path:
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def _probe(folder: Path, what: str, shown: Path) -> None:
    """Make and remove a file in ``folder``, or where it is missing a folder in the nearest one that exists."""
    existing = _nearest_existing(folder.absolute())
    if not existing.is_dir():
        raise _refuse(what, shown, f"{existing} is a file, not a folder")
    try:
        if existing == folder.absolute():
            fd, probe = tempfile.mkstemp(prefix=PROBE_PREFIX, dir=existing)
            os.close(fd)
            os.unlink(probe)
        else:
            os.rmdir(tempfile.mkdtemp(prefix=PROBE_PREFIX, dir=existing))
    except FileNotFoundError:  # e.g. /proc: the folder is there but takes no new entries
        raise _refuse(what, shown, f"{existing} takes no new files") from None
    except OSError as exc:
        raise _refuse(what, shown, os_error_reason(exc)) from None


def check_writable_folder(folder: str | os.PathLike, what: str = "--out") -> Path:
    """``folder`` exists and takes a new file, or can be made: else UnwritableOutputError naming
    ``what`` (e.g. the option) and the path. Nothing is left behind. Returns the folder as a Path."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise _refuse(what, folder, "it is a file, not a folder")
    _probe(folder, what, folder)
    return folder


def check_writable_file(path: str | os.PathLike, what: str = "--out") -> Path:
    """A file can be written at ``path`` (atomically: a temporary beside it, then a rename): else
    UnwritableOutputError naming ``what`` and the path. Returns the path as a Path."""
    path = Path(path)
    if path.is_dir():
        raise _refuse(what, path, "it is a folder; expected the path of a file")
    _probe(path.parent, what, path)
    return path
