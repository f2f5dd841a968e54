"""xmesh bench (placeholder module; the evaluation command is being written)."""


def add_parser(sub) -> None:
    sub.add_parser("bench", help="time the stages")
