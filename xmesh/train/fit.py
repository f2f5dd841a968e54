"""``fit``: a whole training run from files, as ``xmesh train`` runs it.

Everything that can be known wrong is checked before any compute, each with one line naming the file
or option: the output folder can be written; the weights hold every variable the run needs (the trained
stage's, and stage 1's where stage 2's starting meshes are computed or validated); every listed sample
has its renderings, cameras and ground truth (and, from a folder, its starting mesh); the run folder, if
it holds a run, holds this same run (``run.json``, :mod:`xmesh.results.run_identity`: the weights' and
template's fingerprints, the list's digest and the settings that change the result). Then stage 2's
starting meshes are computed once if not given, and the training runs (``xmesh.train.run.train``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..dataset import DEFAULT_VIEWS, list_samples
from ..errors import InputError, WeightsError
from ..io.weight_sources import describe_weights, resolve_weights
from ..io.weights import STAGE_PREFIXES, expected_variables, load_weights, weights_fingerprint
from ..io.writable import check_writable_folder
from ..reconstruct import resolve_template
from ..results.run_identity import RUN_JSON, RunIdentity, check_identity, model_identity, record_identity
from . import checkpoints, logs
from .data import TrainingSet
from .run import TF_NAMES, VAL_FOLDER, WEIGHTS_FILE, Validation, train
from .starts import StartMeshes, compute_starts
from .trainer import Trainer

DEFAULT_EPOCHS = {1: 50, 2: 10}
STARTS_FOLDER = "starts"


def _file_digest(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _whole(value, least: int, option: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise InputError(f"{option} {value!r}: expected a whole number >= {least}")


def _one_line(exc: WeightsError) -> str:
    """A WeightsError's lists in one line: what is missing or wrong, the first few named."""
    missing, shapes = getattr(exc, "missing", []), getattr(exc, "wrong_shape", [])
    dtypes, finite = getattr(exc, "wrong_dtype", []), getattr(exc, "non_finite", [])
    parts = []
    for label, items in (
        ("missing", missing),
        ("with the wrong shape", [n for n, *_ in shapes]),
        ("not floating", [n for n, _ in dtypes]),
        ("with NaN or infinity", [n for n, _ in finite]),
    ):
        if items:
            stages = sorted({s for s in (1, 2) for n in items if n in expected_variables(s)})
            whole = [s for s in stages if set(expected_variables(s)) <= set(items)]
            if whole:
                parts.append(
                    f"{len(items)} {label}: every stage-{whole[0]} variable (is this the other stage's "
                    f"checkpoint? give both stages' weights)"
                )
            else:
                parts.append(f"{len(items)} {label}: {', '.join(items[:3])}{' ...' if len(items) > 3 else ''}")
    return "; ".join(parts) or str(exc).replace("\n", " ")


def load_run_weights(weights: Any, stage: int, needs_stage1: bool) -> dict:
    """The variables the run trains and reads (a WeightsError lists what is missing), plus the other
    stage's where the weights hold it whole (so ``weights.npz`` is a complete model)."""
    source = resolve_weights(weights, option="--weights")
    needed = (1, 2) if needs_stage1 and stage == 2 else (stage,)
    try:
        arrays = load_weights(source, stages=needed)
    except WeightsError as exc:
        raise WeightsError(
            f"--weights: training stage {stage}"
            f"{' (with stage 1 for its starting meshes or validation)' if len(needed) == 2 else ''}"
            f" needs every variable of stage(s) {', '.join(map(str, needed))}: {_one_line(exc)}"
        ) from None
    other = 3 - stage
    if other not in needed:
        try:
            arrays.update(load_weights(source, stages=(other,)))
        except WeightsError:
            pass
    return arrays


def _clear(out: Path) -> None:
    for folder in (checkpoints.FOLDER, VAL_FOLDER, STARTS_FOLDER):
        shutil.rmtree(out / folder, ignore_errors=True)
    logs.remove_outputs(out)
    for path in [
        out / WEIGHTS_FILE,
        out / "checkpoint",
        out / RUN_JSON,
        *out.glob(f"{TF_NAMES[1]}.ckpt-*"),
        *out.glob(f"{TF_NAMES[2]}.ckpt-*"),
    ]:
        path.unlink(missing_ok=True)


def fit(
    stage: int,
    images: str | os.PathLike,
    gt: str | os.PathLike,
    list_file: str | os.PathLike,
    weights: Any,
    out: str | os.PathLike,
    epochs: int | None = None,
    batch_size: int = 1,
    checkpoint_every: int | None = None,
    val_list: str | os.PathLike | None = None,
    val_images=None,
    val_gt=None,
    starts: str | os.PathLike | None = None,
    template: Any = None,
    backend: str = "numpy",
    lr: float = 1e-5,
    seed: int = 123,
    views: Sequence[int] = DEFAULT_VIEWS,
    view_quirk: bool = True,
    cnn_from_stage1: bool = False,
    overwrite: bool = False,
    progress: bool = True,
) -> dict:
    """Train ``stage`` on ``list_file`` into ``out`` (resuming it); see the module docstring and
    ``xmesh.train.run.train`` (whose figures it returns, with ``summary`` and ``wrote`` lines)."""
    if stage not in (1, 2):
        raise InputError(f"--stage {stage!r}: expected 1 (MVP2M) or 2 (the deformation reasoning blocks)")
    epochs = DEFAULT_EPOCHS[stage] if epochs is None else epochs
    _whole(epochs, 1, "--epochs")
    _whole(batch_size, 1, "--batch-size")
    if checkpoint_every is not None:
        _whole(checkpoint_every, 1, "--checkpoint-every")
    if not (lr > 0):
        raise InputError(f"--lr {lr!r}: expected a positive learning rate (the original's is 1e-5)")
    if starts is not None and stage == 1:
        raise InputError("--starts gives stage 2's starting meshes; stage 1 starts from the template")
    out = check_writable_folder(out)
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out}: is a file; expected a folder (made if missing)")
    data = TrainingSet(list_file, images, gt, views)
    data.check()
    validation = None
    if val_list is not None:
        validation = Validation(
            os.fspath(val_list),
            os.fspath(val_images or images),
            os.fspath(val_gt or gt),
            tuple(views),
            view_quirk=view_quirk,
        )
        for _, _, problem in list_samples(val_list, validation.images_root, validation.gt_root, views):
            if problem is not None:
                raise type(problem)(f"--val-list {val_list}: {problem}")
    if cnn_from_stage1 and stage != 2:
        raise InputError("--cnn-from-stage1 starts stage 2's CNN from stage 1's; it applies to --stage 2")
    needs_stage1 = stage == 2 and (starts is None or validation is not None or cnn_from_stage1)
    arrays = load_run_weights(weights, stage, needs_stage1)
    if cnn_from_stage1:  # the original restores stage 2's CNN from the stage-1 run before training
        arrays.update(
            {
                name: arrays[name.replace(STAGE_PREFIXES[2], STAGE_PREFIXES[1], 1)].copy()
                for name in expected_variables(2)
                if "/cnn/" in name
            }
        )
    template_obj = resolve_template(template)
    start_meshes = None
    read = {n: v for n, v in arrays.items() if n in expected_variables(stage) or needs_stage1}
    network = model_identity(
        weights_fingerprint(read),
        template_obj,
        backend,
        "fp32",
        views,
        view_quirk,
        weights_about=describe_weights(weights),
        template_about=None if template is None else os.fspath(template),
    )
    identity = RunIdentity.of(
        {
            **dict(network.fields),
            "stage": stage,
            "list": _file_digest(list_file),
            "batch_size": batch_size,
            "lr": lr,
            "seed": seed,
            "cnn_from_stage1": cnn_from_stage1,
            "starts": None if starts is None else os.path.abspath(starts),
        },
        {**dict(network.about), "list": os.fspath(list_file)},
    )
    check_identity(out, identity, overwrite)
    vertices = int(template_obj.faces_triangle[-1].max()) + 1  # the refined mesh's
    if starts is not None:
        start_meshes = StartMeshes(starts, vertices)
        start_meshes.check(data.ids)
    if overwrite:
        _clear(out)
    record_identity(out, identity)
    if stage == 2 and starts is None:
        folder = out / STARTS_FOLDER
        compute_starts(arrays, template_obj, list_file, images, folder, backend, views, view_quirk, progress=progress)
        start_meshes = StartMeshes(folder, vertices, option="the computed starting meshes in")
    trainer = Trainer(stage, arrays, template_obj, backend, lr=lr, seed=seed)
    figures = train(trainer, data, out, epochs, batch_size, checkpoint_every, seed, start_meshes, validation, progress)
    resumed = figures["resumed_from_step"]
    figures["summary"] = (
        f"stage {stage}, {len(data)} samples, batch size {batch_size}, "
        f"{'resumed at step ' + str(resumed) + ', ' if resumed else ''}{figures['steps']} step(s) "
        f"in {figures['seconds']:.1f} s, now at step {figures['step']}, epoch {figures['epoch']} "
        f"of {epochs}"
    )
    figures["wrote"] = [str(out / logs.TRAIN_LOG), str(out / checkpoints.FOLDER)]
    if figures.get("validation"):
        last = figures["validation"][-1]
        figures["summary"] += f"; validation Chamfer x1000 {float(last['chamfer_x1000']):.4f}"
        figures["wrote"].append(str(out / logs.VAL_LOG))
    figures["wrote"] += [str(figures["weights"]), f"{figures['tf_checkpoint']}.index (TensorFlow checkpoint)"]
    if figures.get("picture"):
        figures["wrote"].append(str(figures["picture"]))
    return figures
