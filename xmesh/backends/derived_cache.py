"""Values derived once from long-lived arrays: a layer's weights prepared for a kernel, a support's
CUDA source, a filter in a library's layout. The arrays live as long as the model, so a backend looks
the derived value up by the arrays' identities instead of comparing values on every call."""

from __future__ import annotations

from collections.abc import Callable


class DerivedCache:
    """``get(objects, tag, make)``: ``make()``'s value for these objects (by identity) and this tag,
    made at the first call and kept. Each entry holds its objects, so no new object can take over one
    of their ids while the entry lives; a hit is still checked against them by identity."""

    def __init__(self) -> None:
        self._entries: dict = {}

    def get(self, objects: tuple, tag, make: Callable[[], object]):
        key = (tag,) + tuple(id(o) for o in objects)
        hit = self._entries.get(key)
        if hit is None or any(held is not o for held, o in zip(hit[0], objects)):
            hit = (tuple(objects), make())
            self._entries[key] = hit
        return hit[1]

    def __len__(self) -> int:
        return len(self._entries)
