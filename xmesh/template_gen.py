"""The default mesh template, built procedurally (no download).

Conventions (all read off ``golden/template.dat`` and checked against it in the tests):

* level 0: a UV ellipsoid centred at (0, 0, -0.8) with radii (0.2, 0.2, 0.4): vertex 0 is the pole
  nearer the camera (z = -0.4), then 11 rings at polar angles 15, 30, ..., 165 degrees of 14
  vertices each (azimuth 0, 360/14, ...), then the far pole. Faces: the 14 triangles of the near
  cap, ring by ring two triangles per quad (diagonal from ring k, segment j+1 to ring k+1,
  segment j), the far cap; all with outward normals.
* unpooling: ``pool_idx`` are the level's unique edges (u < v), sorted; the new vertex N + r is the
  midpoint of the r-th edge. Each face (a, b, c) splits into (a, ab, ca), (b, bc, ab),
  (c, ca, bc), (ab, bc, ca), in parent order.
* supports: T0 = I; T1 = 2 L / lambda_max - I with L = I - D^-1/2 A D^-1/2 (the rescaled
  Chebyshev term of Pixel2Mesh's ``chebyshev_polynomials(adj, 1)``), diagonal stored.
* ``faces`` = faces_triangle with the first index repeated as a 4th column; ``lape_idx`` rows are
  the 8 smallest neighbour indices (sorted, padded with -1), the vertex itself, the count kept.
* hypotheses: the origin, then the 12 icosahedron vertices (-1,t,0), (1,t,0), ... and the 30
  edge midpoints (sorted edges), all projected to radius 0.05; their graph is the icosphere's
  120 edges plus the origin joined to all 42, with T0/T1 as above, dense.
"""

from __future__ import annotations

import functools

import numpy as np
import scipy.sparse as sp

from .errors import InputError
from .io.template import Template, template_from_dict

CENTER = (0.0, 0.0, -0.8)
RADII = (0.2, 0.2, 0.4)
RINGS = 11
SEGMENTS = 14
SUBDIVISIONS = 2
HYPOTHESIS_RADIUS = 0.05
LAPE_NEIGHBOURS = 8


def uv_ellipsoid(rings: int = RINGS, segments: int = SEGMENTS, center=CENTER, radii=RADII):
    """(vertices float64 (2 + rings*segments, 3), faces int64 (2*segments*rings, 3)), outward."""
    polar = np.pi * np.arange(1, rings + 1) / (rings + 1)
    azimuth = 2.0 * np.pi * np.arange(segments) / segments
    unit = np.stack(
        [
            np.outer(np.sin(polar), np.cos(azimuth)),
            np.outer(np.sin(polar), np.sin(azimuth)),
            np.outer(np.cos(polar), np.ones(segments)),
        ],
        axis=-1,
    ).reshape(-1, 3)
    unit = np.vstack([[0.0, 0.0, 1.0], unit, [0.0, 0.0, -1.0]])
    vertices = unit * np.asarray(radii, float) + np.asarray(center, float)

    last = 1 + rings * segments
    j = np.arange(segments)
    jn = (j + 1) % segments
    faces = [np.stack([np.zeros(segments, int), 1 + j, 1 + jn], axis=1)]
    for k in range(rings - 1):
        a, b = 1 + k * segments + j, 1 + k * segments + jn
        c, d = a + segments, b + segments
        faces.append(np.stack([np.stack([a, c, b], 1), np.stack([b, c, d], 1)], axis=1).reshape(-1, 3))
    base = 1 + (rings - 1) * segments
    faces.append(np.stack([np.full(segments, last), base + jn, base + j], axis=1))
    return vertices, np.concatenate(faces).astype(np.int64)


def mesh_edges(faces: np.ndarray) -> np.ndarray:
    """The unique undirected edges of a triangle mesh, (u < v), sorted lexicographically."""
    faces = np.asarray(faces, dtype=np.int64)
    pairs = np.concatenate([faces[:, [0, 1]], faces[:, [1, 2]], faces[:, [2, 0]]])
    return np.unique(np.sort(pairs, axis=1), axis=0)


def subdivide(vertices: np.ndarray, faces: np.ndarray):
    """Midpoint subdivision: (vertices + midpoints, faces split 1 -> 4, pool_idx = the split edges)."""
    vertices = np.asarray(vertices, dtype=np.float64)
    faces = np.asarray(faces, dtype=np.int64)
    edges = mesh_edges(faces)
    n = vertices.shape[0]
    key = edges[:, 0] * n + edges[:, 1]  # sorted, so searchsorted finds each edge's rank

    def midpoint_index(u, v):
        lo, hi = np.minimum(u, v), np.maximum(u, v)
        return n + np.searchsorted(key, lo * n + hi)

    a, b, c = faces.T
    ab, bc, ca = midpoint_index(a, b), midpoint_index(b, c), midpoint_index(c, a)
    children = np.stack(
        [np.stack([a, ab, ca], 1), np.stack([b, bc, ab], 1), np.stack([c, ca, bc], 1), np.stack([ab, bc, ca], 1)],
        axis=1,
    ).reshape(-1, 3)
    new_vertices = np.vstack([vertices, (vertices[edges[:, 0]] + vertices[edges[:, 1]]) / 2.0])
    return new_vertices, children, edges


def adjacency(edges: np.ndarray, n: int) -> sp.csr_matrix:
    """Symmetric 0/1 adjacency (float64 CSR) of an undirected edge list."""
    edges = np.asarray(edges, dtype=np.int64)
    rows = np.concatenate([edges[:, 0], edges[:, 1]])
    cols = np.concatenate([edges[:, 1], edges[:, 0]])
    adj = sp.csr_matrix((np.ones(rows.size), (rows, cols)), shape=(n, n))
    adj.data[:] = 1.0  # an edge listed twice is still one edge
    return adj


def _largest_eigenvalue(sym: sp.csr_matrix) -> float:
    n = sym.shape[0]
    if n <= 512:
        return float(np.linalg.eigvalsh(sym.toarray())[-1])
    v0 = np.random.default_rng(0).standard_normal(n)
    import scipy.sparse.linalg as spla  # only here: its import is a tenth of a second

    return float(spla.eigsh(sym, k=1, which="LA", v0=v0, tol=0, return_eigenvectors=False)[0])


def chebyshev_t1(edges: np.ndarray, n: int) -> sp.csr_matrix:
    """T1 = 2 L / lambda_max(L) - I, L = I - D^-1/2 A D^-1/2 (float64 CSR, diagonal stored)."""
    adj = adjacency(edges, n)
    degree = np.asarray(adj.sum(axis=1)).ravel()
    if np.any(degree == 0):
        raise InputError(
            f"chebyshev_t1: {int(np.sum(degree == 0))} of the {n} vertices have no edge; "
            "expected every vertex in at least one edge"
        )
    d = sp.diags(1.0 / np.sqrt(degree))
    lap = (sp.identity(n, format="csr") - d @ adj @ d).tocsr()
    lmax = _largest_eigenvalue(lap)
    t1 = ((2.0 / lmax) * lap - sp.identity(n, format="csr")).tocsr()
    t1.sum_duplicates()
    t1.sort_indices()
    return t1


def lape_index(edges: np.ndarray, n: int, width: int = LAPE_NEIGHBOURS) -> np.ndarray:
    """(n, width + 2) int32: the ``width`` smallest neighbours (sorted, -1 padded), self, count kept."""
    adj = adjacency(edges, n)
    adj.sort_indices()
    out = np.full((n, width + 2), -1, dtype=np.int32)
    for i in range(n):
        nb = adj.indices[adj.indptr[i] : adj.indptr[i + 1]][:width]
        out[i, : nb.size] = nb
        out[i, width] = i
        out[i, width + 1] = nb.size
    return out


def icosphere_offsets(radius: float = HYPOTHESIS_RADIUS):
    """(43, 3) float64: the origin, the 12 icosahedron vertices, the 30 edge midpoints, at ``radius``;
    and the 162 edges of their graph (icosphere edges + the origin joined to all), indices in 0..42."""
    t = (1.0 + np.sqrt(5.0)) / 2.0
    ico = np.array(
        [
            (-1, t, 0),
            (1, t, 0),
            (-1, -t, 0),
            (1, -t, 0),
            (0, -1, t),
            (0, 1, t),
            (0, -1, -t),
            (0, 1, -t),
            (t, 0, -1),
            (t, 0, 1),
            (-t, 0, -1),
            (-t, 0, 1),
        ],
        float,
    )
    # the icosahedron's edges join vertices at distance 2 (squared 4); its faces are the 3-cliques
    dist2 = ((ico[:, None] - ico[None]) ** 2).sum(-1)
    near = np.isclose(dist2, 4.0)
    tri = [
        (i, j, k)
        for i in range(12)
        for j in range(i + 1, 12)
        for k in range(j + 1, 12)
        if near[i, j] and near[j, k] and near[i, k]
    ]
    unit = ico / np.linalg.norm(ico, axis=1, keepdims=True)
    verts, faces, _ = subdivide(unit, np.array(tri))
    verts = verts / np.linalg.norm(verts, axis=1, keepdims=True) * radius
    sphere_edges = mesh_edges(faces) + 1
    spokes = np.stack([np.zeros(len(verts), np.int64), np.arange(1, len(verts) + 1)], axis=1)
    return np.vstack([np.zeros((1, 3)), verts]), np.vstack([spokes, sphere_edges])


def _support_tuple(t1: sp.csr_matrix, n: int) -> list:
    """[T0, T1] of one stage in the official (coords, values, shape) layout."""
    out = []
    for mat in (sp.identity(n, format="csr"), t1):
        coo = mat.tocoo()
        out.append(
            (
                np.stack([coo.row, coo.col], 1).astype(np.int64),
                coo.data.astype(np.float32),
                np.array([n, n], dtype=np.int64),
            )
        )
    return out


def template_dict(rings: int = RINGS, segments: int = SEGMENTS) -> dict:
    """The default template in the official ``.dat`` layout; fewer ``rings`` and ``segments`` make a
    coarser ellipsoid of the same layout (a quick model for tests: 2 + rings * segments vertices at
    the first level)."""
    vertices, faces = uv_ellipsoid(rings, segments)
    coord = vertices.astype(np.float32)
    levels = [faces]
    pool_idx = []
    for _ in range(SUBDIVISIONS):
        vertices, faces, edges = subdivide(vertices, faces)
        levels.append(faces)
        pool_idx.append(edges.astype(np.int32))

    data: dict = {
        "coord": coord,
        "pool_idx": pool_idx,
        "faces": [np.hstack([f, f[:, :1]]).astype(np.int32) for f in levels],
        "faces_triangle": [f.astype(np.int32) for f in levels],
        "lape_idx": [],
    }
    n = coord.shape[0]
    for s, f in enumerate(levels):
        edges = mesh_edges(f)
        data["lape_idx"].append(lape_index(edges, n))
        data[f"stage{s + 1}"] = _support_tuple(chebyshev_t1(edges, n), n)
        if s < len(pool_idx):
            n += pool_idx[s].shape[0]

    offsets, graph = icosphere_offsets()
    k = offsets.shape[0]
    data["sample_coord"] = offsets.astype(np.float32)
    data["sample_cheb_dense"] = [np.eye(k, dtype=np.float32), chebyshev_t1(graph, k).toarray().astype(np.float32)]
    return data


@functools.lru_cache(maxsize=1)
def generate_template() -> Template:
    """The default template (156 / 618 / 2466 vertices), validated like a loaded file; cached, read-only."""
    return template_from_dict(template_dict(), source="xmesh.template_gen.generate_template()")
