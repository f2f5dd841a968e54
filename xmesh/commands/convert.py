"""xmesh convert CKPT_PREFIX OUT.npz: a TensorFlow checkpoint -> an .npz, without TensorFlow."""
from __future__ import annotations

import sys


def add_parser(sub) -> None:
    p = sub.add_parser("convert", help="convert a TensorFlow V2 checkpoint to .npz (no TensorFlow needed)")
    p.add_argument("checkpoint", help="checkpoint prefix (e.g. meshnet.ckpt-10), its .index file, or its folder")
    p.add_argument("out", help="output .npz (written atomically)")
    p.set_defaults(run=run)


def run(args) -> int:
    from ..io.checkpoint import convert, read_index
    from ..io.writable import check_writable_file
    from .common import output_errors

    count = len(read_index(args.checkpoint))
    check_writable_file(args.out, "output")
    with output_errors(f"{args.out}: writing the .npz"):
        path = convert(args.checkpoint, args.out)
    print(f"wrote {path}: {count} variables", file=sys.stderr)
    return 0
