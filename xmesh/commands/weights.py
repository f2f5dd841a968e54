"""xmesh weights add PATH|ZIP|URL: check the official release and keep one verified copy for ``--weights official``."""

from __future__ import annotations

import sys


def add_parser(sub) -> None:
    p = sub.add_parser(
        "weights",
        help="the official weights: 'xmesh weights add' checks the release and stores it for --weights official",
    )
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = actions.add_parser(
        "add",
        help="check the official release (its unpacked folder, its zip or an http(s) URL) "
        "tensor by tensor and store one verified copy in the cache folder",
    )
    add.add_argument(
        "source",
        help="the authors' release: its zip, the folder it unpacks to, or an http(s) URL of "
        "the zip (downloaded with a progress bar, resumed if interrupted)",
    )
    add.add_argument("--no-progress", action="store_true", help="no progress bars")
    add.set_defaults(run=run)


def run(args) -> int:
    from ..io.official_weights import add_official_weights

    folder = add_official_weights(args.source, progress=not args.no_progress)
    print(
        f"xmesh weights: stored the verified official weights in {folder}; use them with --weights official "
        '(or weights="official" in Python)',
        file=sys.stderr,
    )
    return 0
