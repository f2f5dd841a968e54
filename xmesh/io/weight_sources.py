"""What a ``weights`` argument names: files, a dict of arrays, ``"official"`` or ``"synthetic:SEED"``.

``"official"`` (alone, or as the one element of a list) stands for the official checkpoints stored by
``xmesh weights add`` (:mod:`xmesh.io.official_weights`); ``"synthetic:SEED"`` for the synthetic test
recipe (:func:`xmesh.io.weights.synthetic_weights`): random weights of the right shapes, NOT the
trained ones. :func:`resolve_weights` turns them into checkpoint prefixes or arrays; anything else is
left to :func:`~xmesh.io.weights.load_weights`.
"""

from __future__ import annotations

from typing import Any

from xmesh.errors import InputError
from xmesh.io.official_weights import OFFICIAL, official_prefixes, weights_folder
from xmesh.io.weights import synthetic_weights

SYNTHETIC_PREFIX = "synthetic:"


def _single(weights: Any) -> Any:
    """A one-element list or tuple -> its element; anything else as it is."""
    if isinstance(weights, (list, tuple)) and len(weights) == 1:
        return weights[0]
    return weights


def is_synthetic(weights: Any) -> bool:
    """Whether ``weights`` names the synthetic recipe ("synthetic:..." text, or a list of just that)."""
    weights = _single(weights)
    return isinstance(weights, str) and weights.startswith(SYNTHETIC_PREFIX)


def is_official(weights: Any) -> bool:
    """Whether ``weights`` names the stored official checkpoints ("official", or a list of just that)."""
    weights = _single(weights)
    return isinstance(weights, str) and weights == OFFICIAL


def is_named_source(weights: Any) -> bool:
    """Whether ``weights`` is one of the names above rather than a path ("official", "synthetic:SEED")."""
    return is_official(weights) or is_synthetic(weights)


def synthetic_seed(weights: Any, option: str = "weights") -> int | None:
    """The SEED of ``"synthetic:SEED"`` (None for other weights); InputError, naming ``option``, when
    SEED is not a whole number."""
    if not is_synthetic(weights):
        return None
    text = _single(weights)
    seed = text[len(SYNTHETIC_PREFIX) :]
    if not seed.isdigit():
        raise InputError(f"{option} {text!r}: expected {SYNTHETIC_PREFIX}N with a whole number N")
    return int(seed)


def resolve_weights(weights: Any, option: str = "weights") -> Any:
    """``weights`` as :func:`~xmesh.io.weights.load_weights` takes them: ``"official"`` as the stored
    checkpoints' two prefixes (MissingFileError saying where to get them when they were never added),
    ``"synthetic:SEED"`` drawn from the recipe, a one-element list unwrapped, anything else unchanged."""
    if is_official(weights):
        return official_prefixes()
    seed = synthetic_seed(weights, option)
    if seed is not None:
        return synthetic_weights(seed)
    return _single(weights)


def describe_weights(weights: Any) -> str:
    """One line saying which weights a run uses (for its messages and its summary)."""
    if is_synthetic(weights):
        seed = _single(weights)[len(SYNTHETIC_PREFIX) :]
        return f"synthetic weights (recipe seed {seed}; random, NOT the trained Pixel2Mesh++ weights)"
    if is_official(weights):
        return f"the official Pixel2Mesh++ weights (verified copy in {weights_folder()})"
    if isinstance(weights, (list, tuple)):
        return "weights from " + ", ".join(str(w) for w in weights)
    if isinstance(weights, dict):
        return f"weights from a dict of {len(weights)} arrays"
    return f"weights from {weights}"
