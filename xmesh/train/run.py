"""A training run over a list, epoch by epoch, in an output folder it can always be resumed from.

The data order is the original's: the list shuffled by a legacy ``RandomState(seed)`` (the original
seeds NumPy with 123) before the first epoch and again at the end of each, in place. A step takes the
next ``batch_size`` samples of the order, loaded in processes while the step before computes (loading
threads would hold the interpreter's lock that the step's kernel launches need, and lengthen the step:
docs/training.md). After the step at the end of every epoch, and after every ``checkpoint_every``-th
step, the whole state is saved (:mod:`xmesh.train.checkpoints`); then, at an epoch's end, the weights
are scored on the validation list through the evaluation pipeline and the curves redrawn. A run started
again on the same folder continues from its newest checkpoint (the caller has checked that it is the
same run: :mod:`xmesh.results.run_identity`); on NumPy its weights then equal an uninterrupted run's
bit for bit. At the end the folder holds ``weights.npz`` (every variable by official name: the trained
stage's and the other stage's as given) and the trained stage's TensorFlow checkpoint, named as the
original saves it (``meshnetmvp2m.ckpt-EPOCHS`` or ``meshnet.ckpt-EPOCHS``).
"""

from __future__ import annotations

import functools
import multiprocessing
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..dataset import DEFAULT_VIEWS
from ..errors import InputError
from ..evaluate import evaluate_dataset
from ..io.atomic import atomic_output
from ..io.tf_checkpoint_writer import write_checkpoint
from ..pipeline.loading import default_workers, init_loader_process, start_pool
from . import checkpoints, logs
from .checkpoints import TrainState
from .data import Sample, TrainingSet
from .starts import Stage1Model, StartMeshes
from .trainer import NonFiniteLossError, Trainer

WEIGHTS_FILE = "weights.npz"
VAL_FOLDER = "val"
TF_NAMES = {1: "meshnetmvp2m", 2: "meshnet"}
LOADERS_MOST = 4  # loading processes at most: enough to load a step's samples while the step before computes


@dataclass
class Validation:
    """The validation list and how to score it (the evaluation pipeline's options)."""

    list_file: str
    images_root: str
    gt_root: str
    views: Sequence[int] = DEFAULT_VIEWS
    batch_size: int | None = None
    metric_backend: str = "auto"
    view_quirk: bool = True

    def score(self, stage: int, weights: dict, template, backend: str, out_dir: Path) -> dict:
        """``evaluate_dataset``'s summary of these weights: stage 1's coarse mesh, or the whole network."""
        from ..reconstruct import Reconstructor

        if stage == 1:
            model = Stage1Model(weights, template, backend, self.view_quirk)
        else:
            model = Reconstructor(weights, template=template, backend=backend, view_quirk=self.view_quirk)
        return evaluate_dataset(
            model,
            self.list_file,
            self.images_root,
            self.gt_root,
            out_dir,
            batch_size=self.batch_size,
            metric_backend=self.metric_backend,
            progress=False,
            views=self.views,
        )


def _fresh_state(trainer: Trainer, count: int, seed: int) -> TrainState:
    data_rng = np.random.RandomState(seed)
    order = list(range(count))
    data_rng.shuffle(order)
    return TrainState(
        stage=trainer.stage,
        weights={},
        adam={},
        step=0,
        epoch=0,
        position=0,
        order=order,
        data_rng=checkpoints.random_state_to_json(data_rng),
        draw_rng=trainer.draw_rng.bit_generator.state,
    )


def _snapshot(trainer: Trainer, state: TrainState, data_rng: np.random.RandomState) -> TrainState:
    state.weights = trainer.trained_weights()
    state.adam = trainer.adam_arrays()
    state.draw_rng = trainer.draw_rng.bit_generator.state
    state.data_rng = checkpoints.random_state_to_json(data_rng)
    return state


def _restore(trainer: Trainer, state: TrainState) -> np.random.RandomState:
    missing = [n for n in trainer.trained if n not in state.weights]
    if missing:
        raise InputError(
            f"the checkpoint of step {state.step} lacks {len(missing)} variable(s) of stage "
            f"{trainer.stage}, e.g. {missing[0]}; start afresh with --overwrite"
        )
    trainer.restore(state.weights, state.adam, state.draw_rng)
    return checkpoints.random_state_from_json(state.data_rng)


def write_outputs(out_dir: Path, trainer: Trainer, epochs_done: int) -> dict:
    """``weights.npz`` (every variable) and the trained stage's TF checkpoint; their paths."""
    weights_path = Path(out_dir) / WEIGHTS_FILE
    with atomic_output(weights_path, "wb", "trained weights") as handle:
        np.savez(handle, **trainer.host_weights())
    prefix = write_checkpoint(
        Path(out_dir) / f"{TF_NAMES[trainer.stage]}.ckpt-{epochs_done}", trainer.trained_weights()
    )
    return {"weights": weights_path, "tf_checkpoint": prefix}


_loading: tuple = ()  # in a loading process: its (TrainingSet, StartMeshes or None)


def _start_loading(data: TrainingSet, starts: StartMeshes | None) -> None:
    """A loading process's start (or, where the pool is threads, this process's)."""
    global _loading
    if multiprocessing.parent_process() is not None:
        init_loader_process()
    _loading = (data, starts)


def _load(index: int) -> Sample:
    """Sample ``index`` of the run's list, with its starting mesh for stage 2 (in a loading process)."""
    data, starts = _loading
    sample = data.load(index)
    if starts is not None:
        sample.start = starts.load(sample.id)
    return sample


class _Loader:
    """The samples of the coming steps, loaded in processes two steps ahead of the compute (so the next
    step's are there while a step runs, for :meth:`Trainer.step`'s ``following``)."""

    def __init__(self, data: TrainingSet, starts: StartMeshes | None, gpu: bool):
        workers = min(LOADERS_MOST, default_workers(gpu)[0])
        self.pool = start_pool(workers, initializer=_start_loading, initargs=(data, starts))
        self.pending: dict[tuple, list] = {}

    def ahead(self, indices: Sequence[int]) -> None:
        key = tuple(indices)
        if key and key not in self.pending:
            self.pending[key] = [self.pool.submit(_load, i) for i in key]

    def take(self, indices: Sequence[int]) -> list[Sample]:
        self.ahead(indices)
        return [f.result() for f in self.pending.pop(tuple(indices))]

    def ready(self, indices: Sequence[int]) -> list[Sample] | None:
        """The samples of ``indices`` if they are loaded, without waiting; else None."""
        futures = self.pending.get(tuple(indices))
        if not futures or not all(f.done() and f.exception() is None for f in futures):
            return None
        return [f.result() for f in futures]

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


def _progress(total: int, initial: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(
        total=total,
        initial=initial,
        desc="xmesh train",
        unit="sample",
        file=sys.stderr,
        disable=True if not enabled else None,
        dynamic_ncols=True,
        smoothing=0.05,
    )


def train(
    trainer: Trainer,
    data: TrainingSet,
    out_dir,
    epochs: int,
    batch_size: int = 1,
    checkpoint_every: int | None = None,
    seed: int = 123,
    starts: StartMeshes | None = None,
    validation: Validation | None = None,
    progress: bool = True,
) -> dict:
    """Train ``trainer`` on ``data`` for ``epochs`` epochs in ``out_dir`` (resuming its newest checkpoint);
    see the module docstring. Returns the run's figures."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    count = len(data)
    saved = checkpoints.latest(out_dir)
    if saved is not None:
        if saved.stage != trainer.stage:
            raise InputError(
                f"--out {out_dir}: its checkpoints are of stage {saved.stage}, and this run trains "
                f"stage {trainer.stage}; give another --out, or --overwrite to start afresh"
            )
        state = saved
        data_rng = _restore(trainer, state)
    else:
        state = _fresh_state(trainer, count, seed)
        data_rng = checkpoints.random_state_from_json(state.data_rng)
    log = logs.StepLog(out_dir, state.step)
    plotting = logs.have_matplotlib()
    figures = {
        "resumed_from_step": state.step if saved is not None else None,
        "steps": 0,
        "seconds": 0.0,
        "validation": [],
    }

    def validate(epoch: int) -> None:
        # the step's graphs give their memory to the evaluation (a batch of 32's holds about 70 GiB)
        trainer.drop_graphs()
        trainer.device.release_memory()
        summary = validation.score(
            trainer.stage,
            trainer.host_weights(),
            trainer.template,
            trainer.backend,
            out_dir / VAL_FOLDER / f"epoch-{epoch:03d}",
        )
        row = logs.append_validation(out_dir, epoch, state.step, summary)
        figures["validation"].append(row)

    if validation is not None and state.epoch_end and state.epoch not in logs.validated_epochs(out_dir):
        validate(state.epoch)  # killed between the epoch's checkpoint and its validation
    loader = _Loader(data, starts, gpu=trainer.backend != "numpy")
    bar = _progress(epochs * count, min(state.epoch * count + state.position, epochs * count), progress)
    started = last_end = time.perf_counter()
    try:
        while state.epoch < epochs:
            batch = state.order[state.position : state.position + batch_size]
            following = state.order[state.position + len(batch) : state.position + len(batch) + batch_size]
            after = state.order[
                state.position + len(batch) + len(following) : state.position + len(batch) + 2 * len(following)
            ]
            samples = loader.take(batch)
            loader.ahead(following)
            loader.ahead(after)
            draws_before = trainer.draw_rng.bit_generator.state
            t0 = time.perf_counter()
            try:
                # asked once the device works on this step: the first step's capture gives the
                # loader time to finish the second step's samples
                result = trainer.step(samples, state.step + 1, following=functools.partial(loader.ready, following))
            except NonFiniteLossError:  # the weights are the last good ones: keep the state before this step
                if not checkpoints.path_for(out_dir, state.step).exists() and state.step > 0:
                    trainer.draw_rng.bit_generator.state = draws_before
                    checkpoints.save(out_dir, _snapshot(trainer, state, data_rng))
                raise
            seconds = time.perf_counter() - t0
            state.step += 1
            state.position += len(batch)
            now = time.perf_counter()
            log.append(
                state.step,
                state.epoch + 1,
                [str(s.id) for s in samples],
                result.loss,
                result.terms,
                seconds,
                now - last_end,
            )
            last_end = now
            bar.set_postfix(loss=f"{result.loss:.4g}", refresh=False)
            bar.update(len(batch))
            figures["steps"] += 1
            state.epoch_end = state.position >= count
            if state.epoch_end:
                state.epoch += 1
                state.position = 0
                data_rng.shuffle(state.order)
            if state.epoch_end or (checkpoint_every and state.step % checkpoint_every == 0):
                checkpoints.save(out_dir, _snapshot(trainer, state, data_rng))
            if state.epoch_end:
                if validation is not None:
                    validate(state.epoch)
                if plotting:
                    logs.plot_curves(out_dir)
    finally:
        figures["seconds"] = time.perf_counter() - started
        bar.close()
        log.close()
        loader.close()
    figures.update(step=state.step, epoch=state.epoch)
    figures.update(write_outputs(out_dir, trainer, state.epoch))
    if plotting:
        figures["picture"] = logs.plot_curves(out_dir)
    return figures
