"""xmesh eval (placeholder module; the evaluation command is being written)."""


def add_parser(sub) -> None:
    sub.add_parser("eval", help="evaluate over a ShapeNet-style dataset")
