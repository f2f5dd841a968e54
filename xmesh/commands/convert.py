"""xmesh convert CKPT_PREFIX OUT.npz: a TensorFlow checkpoint -> an .npz, without TensorFlow."""
from __future__ import annotations

import sys


def add_parser(sub) -> None:
    p = sub.add_parser("convert", help="convert a TensorFlow V2 checkpoint to .npz (no TensorFlow needed)")
    p.add_argument("checkpoint", help="checkpoint prefix (e.g. meshnet.ckpt-10), its .index file, or its folder")
    p.add_argument("out", help="output .npz (written atomically)")
    p.set_defaults(run=run)


def run(args) -> int:
    from ..errors import InputError, XmeshError
    from ..io.atomic import os_error_reason
    from ..io.checkpoint import convert, read_index

    count = len(read_index(args.checkpoint))
    try:
        path = convert(args.checkpoint, args.out)
    except OSError as exc:
        if isinstance(exc, XmeshError):
            raise
        reason = os_error_reason(exc)
        raise InputError(f"{args.out}: writing the .npz failed ({reason}); the previous file, if any, "
                         "is unchanged; expected a writable path with free space") from None
    print(f"wrote {path}: {count} variables", file=sys.stderr)
    return 0
