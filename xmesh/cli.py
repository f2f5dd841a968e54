"""The ``xmesh`` command line. Each subcommand lives in ``xmesh/commands/<name>.py``."""
from __future__ import annotations

import argparse
import importlib
import sys
import warnings

from .errors import XmeshError
from .pipeline import startup

COMMANDS = ("reconstruct", "convert", "demo", "render", "eval", "ground-truth", "bench", "serve")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="xmesh", description="Pixel2Mesh++ mesh reconstruction without a deep-learning framework")
    parser.add_argument("--version", action="version", version=f"xmesh {importlib.import_module('xmesh').__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"xmesh.commands.{name.replace('-', '_')}").add_parser(sub)
    return parser


def main(argv=None) -> int:
    startup.begin()
    parser = build_parser()
    args = parser.parse_args(argv)
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
        print(f"xmesh {args.command}: interrupted; finished outputs are complete, nothing was left half-written", file=sys.stderr)
        return 130
    finally:
        startup.end()   # a later library call in this process starts its own clock


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
