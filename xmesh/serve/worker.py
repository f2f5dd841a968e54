"""The LitServe API of ``xmesh serve``: one worker process per device, each with its own
:class:`~xmesh.Reconstructor`; the requests LitServe gathers run as one batch.

Requests reach a worker already checked and prepared (:mod:`xmesh.serve.upload`), so one batch
holds only valid samples. A batch runs in two halves (:mod:`xmesh.serve.inflight`): ``launch``
stacks its views, starts their upload and queues one ``Reconstructor.run`` on them (which splits a
batch that runs out of GPU memory), ``collect`` waits for its results; the worker's loop
(:class:`~xmesh.serve.batching.PrefetchingBatchLoop`) launches the next batch before it collects
the last. Should a batch fail anyway, its samples run one by one, so a failure stays with its own
request. A worker answers each request with its vertices (the server process formats the mesh).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import litserve as ls
import numpy as np

from xmesh.errors import DeviceOutOfMemoryError
from xmesh.io.images import images_to_unit
from xmesh.serve.batching import PrefetchingBatchLoop
from xmesh.serve.inflight import batches_for

log = logging.getLogger("xmesh.serve")


@dataclass(frozen=True)
class ModelSettings:
    """What each worker builds its Reconstructor from (picklable: workers are spawned processes)."""

    weights: Any
    template: Any = None
    backend: str = "numpy"
    precision: str = "fp32"
    view_quirk: bool = True

    def build(self):
        from xmesh.reconstruct import Reconstructor

        return Reconstructor(
            self.weights,
            template=self.template,
            backend=self.backend,
            precision=self.precision,
            view_quirk=self.view_quirk,
        )


def select_device(device: str) -> None:
    """Make LitServe's ``cuda:N`` the only GPU this process sees, before CuPy touches CUDA: N counts
    the GPUs the server saw (its CUDA_VISIBLE_DEVICES, if set)."""
    if not device.startswith("cuda:"):
        return
    index = int(device.split(":", 1)[1])
    visible = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    os.environ["CUDA_VISIBLE_DEVICES"] = visible[index] if visible else str(index)


def failure(exc: BaseException) -> dict:
    """A request's answer when its reconstruction failed: 503 when memory ran out, else 500."""
    if isinstance(exc, DeviceOutOfMemoryError):
        return {"error": f"the device ran out of memory even for this one sample ({exc}); retry later", "status": 503}
    log.exception("reconstruction failed", exc_info=exc)
    return {"error": f"the reconstruction failed ({type(exc).__name__}: {exc})", "status": 500}


@dataclass
class Launched:
    """A batch handed to the device: its samples and the job to collect, or the error that stopped its launch."""

    samples: list
    job: Any = None
    error: BaseException | None = None


class ReconstructAPI(ls.LitAPI):
    """Batches of :class:`~xmesh.serve.upload.Sample` -> per sample {"coarse", "refined", "batch", "ms",
    "stamps"} (or {"error", "status"}); "stamps" holds the sample's arrival in the worker and the times
    its batch began on the device and had its results on the host (``time.monotonic()``).
    ``launch`` and ``collect`` are the two halves of ``predict``, which the worker's loop calls apart."""

    def __init__(self, settings: ModelSettings, max_batch_size: int, batch_timeout: float, api_path: str):
        super().__init__(
            max_batch_size=max_batch_size, batch_timeout=batch_timeout, api_path=api_path, loop=PrefetchingBatchLoop()
        )
        self.settings = settings

    def setup(self, device) -> None:
        select_device(str(device))
        self.model = self.settings.build()

    @property
    def batches(self):
        """The model's two halves (:func:`xmesh.serve.inflight.batches_for`), made at first use."""
        if getattr(self, "_batches", None) is None:
            self._batches = batches_for(self.model)
        return self._batches

    def decode_request(self, request):
        return request

    def batch(self, inputs):
        return list(inputs)

    def launch(self, samples) -> Launched:
        """Start the batch on the device; returns before its network has run."""
        try:
            return Launched(samples, self.batches.launch(self._views(samples), np.stack([s.rows for s in samples])))
        except Exception as exc:  # noqa: BLE001 - answered by collect
            return Launched(samples, error=exc)

    def collect(self, launched: Launched) -> list[dict]:
        """The answers of a launched batch, once its results are on the host; a failed batch runs again
        sample by sample."""
        samples = launched.samples
        try:
            if launched.error is not None:
                raise launched.error
            result = self.batches.collect(launched.job)
        except Exception as exc:  # noqa: BLE001 - every request gets an answer; the worker keeps serving
            if len(samples) == 1:
                return [failure(exc)]
            return [self.predict([sample])[0] for sample in samples]
        start, end = result.start, result.end
        return [
            {
                "coarse": result.coarse[b],
                "refined": result.refined[b],
                "batch": len(samples),
                "ms": (end - start) * 1000.0,
                "stamps": {"received": sample.stamps.get("received", start), "start": start, "end": end},
            }
            for b, sample in enumerate(samples)
        ]

    def predict(self, samples) -> list[dict]:
        return self.collect(self.launch(samples))

    @staticmethod
    def _views(samples) -> list[np.ndarray]:
        """Each sample's views as the network's input goes to the device: 8-bit views as they are (they
        become float32 there), else every sample's as float32."""
        views = [s.images for s in samples]
        if all(v.dtype == np.uint8 for v in views):
            return views
        return [images_to_unit(np, v) for v in views]

    def unbatch(self, output):
        return output

    def encode_response(self, output):
        return output
