"""The ``xmesh`` command line. Each subcommand lives in ``xmesh/commands/<name>.py``."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings

from .errors import INTERRUPTED_WHILE_STARTING, XmeshError
from .pipeline import startup

COMMANDS = ("reconstruct", "convert", "demo", "render", "eval", "ground-truth", "bench", "serve", "weights", "train")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="xmesh", description="Pixel2Mesh++ mesh reconstruction without a deep-learning framework"
    )
    parser.add_argument("--version", action="version", version=f"xmesh {importlib.import_module('xmesh').__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"xmesh.commands.{name.replace('-', '_')}").add_parser(sub)
    return parser


QUICK_EXIT = ("eval", "reconstruct")  # commands whose every output, pool and cluster is closed when they return
_ran: list[str] = []  # the command main() ran last


def main(argv=None) -> int:
    try:
        startup.begin()
        parser = build_parser()  # imports every command's module: Ctrl+C may come meanwhile
        args = parser.parse_args(argv)
    except KeyboardInterrupt:
        startup.end()
        print(INTERRUPTED_WHILE_STARTING, file=sys.stderr)
        return 130
    except BaseException:  # argparse's exit (--help, --version, a usage error): no clock left for a later call
        startup.end()
        raise
    _ran.append(args.command)

    def one_line(message, category, filename, lineno, file=None, line=None):
        print(f"xmesh {args.command}: warning: {message}", file=sys.stderr, flush=True)

    try:
        with warnings.catch_warnings():
            warnings.showwarning = one_line
            return int(args.run(args) or 0)
    except XmeshError as exc:
        print(f"xmesh {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            f"xmesh {args.command}: interrupted; finished outputs are complete, nothing was left half-written",
            file=sys.stderr,
        )
        return 130
    finally:
        startup.end()  # a later library call in this process starts its own clock


def command() -> None:
    """The ``xmesh`` command: :func:`main`, then the process's exit with its status. After the
    commands of :data:`QUICK_EXIT` every output is written, synced and closed and every pool and
    cluster shut down, so the process ends at once, without the interpreter's clean-up (a few
    tenths of a second with NumPy, numba, CuPy or Dask loaded, freeing what the system frees anyway)."""
    status = main()
    if _ran and _ran[-1] in QUICK_EXIT:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a reader that went away, or a closed stream
                pass
        os._exit(status)
    sys.exit(status)


if __name__ == "__main__":  # pragma: no cover
    command()
