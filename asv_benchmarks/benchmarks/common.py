"""What every benchmark class shares: the parameter grid, skips, and the workload from xmesh.benchmarking.

The timing code itself lives in ``xmesh.benchmarking`` (``xmesh bench`` runs the same code); this
module only adapts it to asv. A combination that cannot run here raises ``NotImplementedError`` in
``setup``, which asv records as skipped (n/a): CuPy without a CUDA device, NumPy at batch sizes
beyond ``NUMPY_MAX_BATCH`` (a NumPy sample takes seconds), the golden data absent, or a commit
older than ``xmesh.benchmarking`` (so ``asv run`` over a commit range skips those cleanly).
"""

from __future__ import annotations

import os
from pathlib import Path

# ../shared beside the repository (asv runs benchmarks from a temporary folder, and a commit built
# into asv's virtualenv does not know where the source tree is).
ROOT = Path(__file__).resolve().parents[2]
os.environ.setdefault("XMESH_SHARED", str(ROOT.parent / "shared"))

BACKENDS = ["numpy", "cupy"]
BATCH_SIZES = [1, 16, 64]
NUMPY_MAX_BATCH = 1


def benchmarking():
    """``xmesh.benchmarking`` of the xmesh under test; skip when that commit predates it."""
    try:
        from xmesh import benchmarking as module
    except ImportError as exc:
        raise NotImplementedError(f"this xmesh has no xmesh.benchmarking ({exc})") from exc
    return module


def require(backend: str, batch: int | None = None) -> None:
    """Raise NotImplementedError (asv: skipped) when ``backend`` cannot run ``batch`` here."""
    if backend == "numpy" and batch is not None and batch > NUMPY_MAX_BATCH:
        raise NotImplementedError(f"numpy is benchmarked only up to batch {NUMPY_MAX_BATCH}")
    from xmesh.backends import get_backend
    from xmesh.errors import BackendUnavailableError

    try:
        get_backend(backend)
    except BackendUnavailableError as exc:
        raise NotImplementedError(str(exc)) from exc


def build_inputs() -> dict:
    """Host weights, template and one sample's inputs; built once per class by asv's setup_cache."""
    bm = benchmarking()
    template, template_source = bm.default_template()
    images, cameras, input_source = bm.default_inputs()
    return {
        "weights": bm.synthetic_weights(bm.WEIGHTS_SEED),
        "template": template,
        "images": images,
        "cameras": cameras,
        "template_source": template_source,
        "input_source": input_source,
    }


class Benchmark:
    """Base of the classes over (backend, batch); ``prepare`` lists the stages the class times."""

    params = [BACKENDS, BATCH_SIZES]
    param_names = ["backend", "batch"]
    prepare: tuple = ()
    timeout = 600
    # A NumPy call takes 5 ms .. 3 s: asv picks `number`; the samples are capped so that a full run
    # stays at a few minutes. The first NumPy calls in a fresh process run up to 5x slower (first
    # touch of the large work arrays), hence 2 s of untimed warm-up calls before sampling.
    repeat = (1, 5, 10.0)
    warmup_time = 2.0
    processes = 1

    def setup_cache(self):
        return build_inputs()

    def setup(self, inputs, backend, batch):
        require(backend, batch)
        bm = benchmarking()
        self.work = bm.Workload(
            backend,
            batch,
            weights=inputs["weights"],
            template=inputs["template"],
            images=inputs["images"],
            cameras=inputs["cameras"],
        )
        self.work.prepare(*self.prepare)
