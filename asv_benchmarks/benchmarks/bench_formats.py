"""Writing the reconstructed mesh (2466 vertices, 4928 faces) as each file format ``xmesh serve``
answers with and ``xmesh reconstruct`` writes: OBJ text, binary PLY, binary glTF."""

from __future__ import annotations

import numpy as np


class MeshEncoding:
    params = [["obj", "ply", "glb"]]
    param_names = ["fmt"]

    def setup(self, fmt):
        from xmesh.mesh import Mesh
        from xmesh.template_gen import generate_template

        faces = np.asarray(generate_template().faces_triangle[-1], dtype=np.int64)
        vertices = np.random.default_rng(0).normal(size=(int(faces.max()) + 1, 3)).astype(np.float32) * 0.2
        self.mesh = Mesh(vertices, faces)

    def time_encode(self, fmt):
        self.mesh.encode(fmt)
