"""The LitServe API of ``xmesh serve``: one worker process per device, each with its own
:class:`~xmesh.Reconstructor`; the requests LitServe gathers run as one batch.

Requests reach a worker already checked and prepared (:mod:`xmesh.serve.upload`), so one batch
holds only valid samples. The batch runs as ``Reconstructor.reconstruct_batch`` runs it: one
``Reconstructor.run`` on the stacked images and cameras, which splits a batch that runs out of
GPU memory. Should a batch fail anyway, its samples run one by one, so a failure stays with its own
request. A worker answers each request with its vertices (the server process formats the mesh).
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import litserve as ls
import numpy as np

from xmesh.errors import DeviceOutOfMemoryError
from xmesh.io.images import images_to_unit
from xmesh.serve.batching import PrefetchingBatchLoop

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

        return Reconstructor(self.weights, template=self.template, backend=self.backend, precision=self.precision,
                             view_quirk=self.view_quirk)


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
        return {"error": f"the device ran out of memory even for this one sample ({exc}); retry later",
                "status": 503}
    log.exception("reconstruction failed", exc_info=exc)
    return {"error": f"the reconstruction failed ({type(exc).__name__}: {exc})", "status": 500}


class ReconstructAPI(ls.LitAPI):
    """Batches of :class:`~xmesh.serve.upload.Sample` -> per sample {"coarse", "refined", "batch", "ms",
    "stamps"} (or {"error", "status"}); "stamps" holds the sample's arrival in the worker and the batch's
    start and end (``time.monotonic()``)."""

    def __init__(self, settings: ModelSettings, max_batch_size: int, batch_timeout: float, api_path: str):
        super().__init__(max_batch_size=max_batch_size, batch_timeout=batch_timeout, api_path=api_path,
                         loop=PrefetchingBatchLoop())
        self.settings = settings

    def setup(self, device) -> None:
        select_device(str(device))
        self.model = self.settings.build()

    def decode_request(self, request):
        return request

    def batch(self, inputs):
        return list(inputs)

    def predict(self, samples) -> list[dict]:
        start = time.monotonic()
        try:
            coarse, refined = self.model.run(self._images(samples), np.stack([s.rows for s in samples]))
            coarse, refined = self.model.backend.to_numpy(coarse), self.model.backend.to_numpy(refined)
        except Exception as exc:  # noqa: BLE001 - every request gets an answer; the worker keeps serving
            if len(samples) == 1:
                return [failure(exc)]
            return [self.predict([sample])[0] for sample in samples]
        end = time.monotonic()
        return [{"coarse": coarse[b], "refined": refined[b], "batch": len(samples), "ms": (end - start) * 1000.0,
                 "stamps": {"received": sample.stamps.get("received", start), "start": start, "end": end}}
                for b, sample in enumerate(samples)]

    def _images(self, samples):
        """The batch's network input: 8-bit views go to the device as they are and become float32 there."""
        views = [s.images for s in samples]
        if all(v.dtype == np.uint8 for v in views):
            backend = self.model.backend
            return images_to_unit(backend.xp, backend.asarray(np.stack(views), dtype=np.uint8))
        return np.stack([images_to_unit(np, v) for v in views])

    def unbatch(self, output):
        return output

    def encode_response(self, output):
        return output
