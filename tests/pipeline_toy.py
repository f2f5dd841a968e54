"""A stand-in network for tests of the dataset pipeline's plumbing (resume, timing, writing), which
do not depend on what the network computes: cheap, and deterministic in its inputs."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import numpy as np

from xmesh.backends import get_backend
from xmesh.template_gen import generate_template


class ToyReconstructor:
    """``run`` returns the template's last-level vertices scaled by each sample's mean image value and
    shifted by its first camera's distance, after sleeping ``delay`` seconds."""

    def __init__(self, delay: float = 0.0):
        self.backend = get_backend("numpy")
        template = generate_template()
        self.faces = np.asarray(template.faces_triangle[-1], dtype=np.int64)
        count = int(self.faces.max()) + 1
        angles = np.linspace(0.0, 2 * np.pi, count, endpoint=False)
        self.base = np.stack([np.cos(angles), np.sin(angles), np.cos(3 * angles)], axis=1).astype(np.float32) * 0.2
        self.delay = delay

    def run(self, images, cameras):
        time.sleep(self.delay)
        scale = np.asarray(images, dtype=np.float64).mean(axis=(1, 2, 3, 4))
        verts = (self.base[None] * scale[:, None, None] + 0.01 * cameras[:, 0, 3][:, None, None]).astype(np.float32)
        return verts, verts


@dataclass(frozen=True)
class ToySpec:
    """Builds the toy on a cluster worker (the role xmesh.cluster.ModelSpec plays for the network)."""

    delay: float = 0.0
    backend: str = "numpy"

    def build(self) -> ToyReconstructor:
        return ToyReconstructor(self.delay)


@dataclass(frozen=True)
class GatedSpec:
    """The toy, built at once by the first worker to build it and by every other one only once the
    file ``folder/gate`` exists (each build claims ``folder/claim``; the first to make it goes on)."""

    folder: str
    backend: str = "numpy"

    def build(self) -> ToyReconstructor:
        import os

        try:
            os.close(os.open(os.path.join(self.folder, "claim"), os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            deadline = time.monotonic() + 120
            while not os.path.exists(os.path.join(self.folder, "gate")) and time.monotonic() < deadline:
                time.sleep(0.02)
        return ToyReconstructor()


def main(argv: list[str]) -> None:
    """``python pipeline_toy.py LIST ROOT OUT [CLUSTER]``: evaluate with the toy network, saving meshes;
    with CLUSTER (e.g. local:2) on that Dask cluster, one batch per shard."""
    from xmesh.evaluate import evaluate_dataset

    list_file, root, out = argv[:3]
    if len(argv) > 3:
        from xmesh.cluster import open_client

        with open_client(argv[3]) as client:
            evaluate_dataset(
                ToySpec(delay=0.25),
                list_file,
                root,
                f"{root}/gt",
                out,
                batch_size=2,
                workers=1,
                progress=False,
                save_meshes=True,
                save_ground=True,
                client=client,
                shard_batches=1,
            )
        return
    evaluate_dataset(
        ToyReconstructor(delay=0.25),
        list_file,
        root,
        f"{root}/gt",
        out,
        batch_size=2,
        workers=2,
        progress=False,
        save_meshes=True,
        save_ground=True,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
