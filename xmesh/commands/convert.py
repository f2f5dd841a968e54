"""xmesh convert CKPT_PREFIX [CKPT_PREFIX ...] OUT.npz: TensorFlow checkpoints -> one .npz, without TensorFlow."""

from __future__ import annotations

import sys


def add_parser(sub) -> None:
    p = sub.add_parser("convert", help="convert TensorFlow V2 checkpoints to one .npz (no TensorFlow needed)")
    p.add_argument(
        "checkpoints",
        nargs="+",
        metavar="checkpoint",
        help="checkpoint prefix (e.g. meshnet.ckpt-10), its .index file, or its folder; give both official "
        "checkpoints (meshnetmvp2m.ckpt-50 meshnet.ckpt-10), or 'official' for the copy stored by "
        "'xmesh weights add', for one file with both stages",
    )
    p.add_argument("out", help="output .npz (written atomically)")
    p.set_defaults(run=run)


def run(args) -> int:
    from ..io.checkpoint import convert, read_index
    from ..io.weight_sources import is_official, resolve_weights
    from ..io.writable import check_writable_file
    from .common import output_errors

    checkpoints = resolve_weights(args.checkpoints, "checkpoint") if is_official(args.checkpoints) else args.checkpoints
    count = sum(len(read_index(checkpoint)) for checkpoint in checkpoints)
    check_writable_file(args.out, "output")
    with output_errors(f"{args.out}: writing the .npz"):
        path = convert(checkpoints, args.out)
    print(f"wrote {path}: {count} variables from {len(checkpoints)} checkpoint(s)", file=sys.stderr)
    return 0
