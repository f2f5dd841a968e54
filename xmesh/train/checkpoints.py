"""A training run's checkpoints: everything the next step depends on, in one file written atomically.

``checkpoints/step-NNNNNNNN.npz`` holds the trained stage's weights (``weights/NAME``), Adam's state
(``adam/...``: the moments, the beta powers, the step count, the settings) and, as JSON in ``state``,
the step, the epoch, how far the epoch's data order has been consumed, that order, the data order's
generator (the original's legacy ``RandomState``) and the generator of the loss's own sampling draws.
The file is whole or absent (:func:`xmesh.io.atomic.atomic_output`), so the newest one is always a
state to resume from; a checkpoint that does not end an epoch is removed once a newer one is on disk.
"""

from __future__ import annotations

import json
import re
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import FileFormatError
from ..io.atomic import atomic_output

FOLDER = "checkpoints"
_NAME = re.compile(r"^step-(\d{8})\.npz$")


@dataclass
class TrainState:
    """A run's state between two steps. ``position``: samples of ``order`` consumed in ``epoch``
    (0-based, epochs completed); ``adam``: :meth:`xmesh.train.adam.AdamState.arrays`; ``epoch_end``:
    this state ends an epoch."""

    stage: int
    weights: dict[str, np.ndarray]
    adam: dict[str, np.ndarray]
    step: int
    epoch: int
    position: int
    order: list[int]
    data_rng: dict
    draw_rng: dict
    epoch_end: bool = False


def random_state_to_json(state: np.random.RandomState) -> dict:
    name, keys, pos, has_gauss, gauss = state.get_state(legacy=True)
    return {
        "bit_generator": name,
        "key": [int(k) for k in keys],
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(gauss),
    }


def random_state_from_json(data: dict) -> np.random.RandomState:
    state = np.random.RandomState()
    state.set_state(
        (
            data["bit_generator"],
            np.asarray(data["key"], dtype=np.uint32),
            data["pos"],
            data["has_gauss"],
            data["cached_gaussian"],
        )
    )
    return state


def path_for(out_dir: Path, step: int) -> Path:
    return Path(out_dir) / FOLDER / f"step-{step:08d}.npz"


def save(out_dir: Path, state: TrainState) -> Path:
    """Write ``state`` as the newest checkpoint, then remove older ones that do not end an epoch."""
    meta = {
        "stage": state.stage,
        "step": state.step,
        "epoch": state.epoch,
        "position": state.position,
        "order": [int(i) for i in state.order],
        "data_rng": state.data_rng,
        "draw_rng": state.draw_rng,
        "epoch_end": state.epoch_end,
    }
    arrays = {"state": np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)}
    for kind, values in (("weights", state.weights), ("adam", state.adam)):
        arrays.update({f"{kind}/{name}": np.asarray(value) for name, value in values.items()})
    path = path_for(out_dir, state.step)
    with atomic_output(path, "wb", "training checkpoint") as handle:
        np.savez(handle, **arrays)
    for older, step in listed(out_dir):
        if step < state.step and not _ends_epoch(older):
            older.unlink(missing_ok=True)
    return path


def listed(out_dir: Path) -> list[tuple[Path, int]]:
    """The checkpoints in ``out_dir/checkpoints``, oldest first, with their step numbers."""
    folder = Path(out_dir) / FOLDER
    if not folder.is_dir():
        return []
    found = [(p, int(m.group(1))) for p in folder.iterdir() if (m := _NAME.match(p.name))]
    return sorted(found, key=lambda item: item[1])


def _ends_epoch(path: Path) -> bool:
    try:
        return bool(_read_meta(path).get("epoch_end"))
    except FileFormatError:
        return False


def _read_meta(path: Path) -> dict:
    try:
        with np.load(path, allow_pickle=False) as npz:
            return json.loads(npz["state"].tobytes().decode("utf-8"))
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, zlib.error, EOFError) as exc:
        raise FileFormatError(
            f"{path}: not a training checkpoint xmesh wrote ({type(exc).__name__}: {exc}); "
            "remove it, or start afresh with --overwrite"
        ) from None


def load(path: Path) -> TrainState:
    meta = _read_meta(path)
    parts: dict[str, dict[str, np.ndarray]] = {"weights": {}, "adam": {}}
    with np.load(path, allow_pickle=False) as npz:
        for key in npz.files:
            kind, _, name = key.partition("/")
            if kind in parts:
                parts[kind][name] = npz[key]
    return TrainState(
        stage=meta["stage"],
        weights=parts["weights"],
        adam=parts["adam"],
        step=meta["step"],
        epoch=meta["epoch"],
        position=meta["position"],
        order=meta["order"],
        data_rng=meta["data_rng"],
        draw_rng=meta["draw_rng"],
        epoch_end=meta["epoch_end"],
    )


def latest(out_dir: Path) -> TrainState | None:
    """The newest checkpoint's state, or None when the run has none."""
    found = listed(out_dir)
    return load(found[-1][0]) if found else None
