"""The one family of errors xmesh raises on bad input, bad files and missing backends.

Every message names the file or argument, what was wrong and what is expected, so a user can act
on it without reading a traceback. Subclasses also derive from the built-in type that fits
(ValueError, OSError, ...) so generic ``except`` clauses keep working.
"""

from __future__ import annotations

import os
import sys

INTERRUPTED_WHILE_STARTING = "xmesh: interrupted while starting; nothing was written"

SHOWN = 3  # the items a message lists before "and N more"


def first_few(items, shown: int = SHOWN) -> str:
    """The first ``shown`` of ``items``, comma-separated, and how many more there are: one line for any count."""
    items = [str(item) for item in items]
    head = ", ".join(items[:shown])
    return head if len(items) <= shown else f"{head} and {len(items) - shown} more"


class XmeshError(Exception):
    """Base class of every error xmesh raises on purpose."""


class InputError(XmeshError, ValueError):
    """An argument (array, camera row, option) is of the wrong shape, type or range."""


class FileFormatError(XmeshError, ValueError):
    """A file exists but its content is not what its format requires."""


class ChecksumError(FileFormatError):
    """Stored data does not match its recorded checksum (a corrupt file)."""


class UnsafePickleError(FileFormatError):
    """A pickle asked for a class or callable outside the allow-list; nothing was executed."""


class MissingFileError(XmeshError, FileNotFoundError):
    """A file the caller named (or one it implies, e.g. a checkpoint shard) does not exist."""


class WeightsError(XmeshError, ValueError):
    """Model weights are missing variables, or hold them with the wrong shape or dtype."""


class BackendUnavailableError(XmeshError, RuntimeError):
    """The requested array backend cannot run here (package missing, no GPU)."""


class KernelCompileError(XmeshError, RuntimeError):
    """A CUDA kernel failed to compile; the message names the kernel and the compiler's log."""


class DeviceOutOfMemoryError(XmeshError, MemoryError):
    """Even the smallest batch does not fit in GPU memory."""


class MissingExtraError(XmeshError, ImportError):
    """An optional feature needs a package of one of xmesh's extras that is not installed."""


class UnwritableOutputError(XmeshError, PermissionError):
    """An output file or folder cannot be written (a read-only or special file system, no permission,
    a part of its path that is a file); found before any work is done."""


def started_as_the_command() -> bool:
    """Whether this process is the xmesh command (its script, or ``python -m xmesh`` while the package is
    found or run) or a process the command started with multiprocessing (which sets ``sys.argv`` to the
    command's)."""
    argv0 = sys.argv[0] if sys.argv else ""
    return argv0 == "-m" or os.path.basename(argv0) == "xmesh" or argv0.endswith(os.path.join("xmesh", "__main__.py"))


def interrupted_while_starting() -> None:
    """The xmesh command's answer to Ctrl+C before its subcommand runs: one line and exit status 130; in a
    process the command started (a spawned worker importing xmesh) the status alone, the command says it."""
    if "--multiprocessing-fork" not in getattr(sys, "orig_argv", ()):
        print(INTERRUPTED_WHILE_STARTING, file=sys.stderr)
    raise SystemExit(130) from None
