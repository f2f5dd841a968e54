"""The original's loss family (``modules/losses.py``), forward and backward, for a batch of meshes.

``mesh_loss``: Chamfer between the ground-truth points and the predicted vertices plus points
sampled on the predicted faces by area, ``(mean d1 + 0.55 mean d2) * 3000``; the mean squared edge
length times 350 (500 in stage 2); half the mean |cosine| between each edge and the ground-truth
normal nearest its first vertex. ``laplace_loss``: the mean squared change of each vertex's
Laplacian coordinate times 1500, and of its position times 50 (100 in stage 2).

The gradients are the original graph's: the Chamfer op's ``2 (a - b[idx])`` with the nearest
neighbours of the forward pass, the face choice and the gathered normals held constant, and the
normal term differentiated through TF's ``l2_normalize`` of the edges. Every function takes a
leading batch axis B; a loss is returned per sample, (B,).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from array_api_compat import is_cupy_namespace

from ..model.sparse import scatter_add

SAMPLES = 4000  # points sampled on the faces per mesh_loss call
NORMALIZE_EPS = 1e-12  # tf.nn.l2_normalize's epsilon on the squared norm


@dataclass(frozen=True)
class MeshLossWeights:
    """The factors of one stage's ``mesh_loss``."""

    chamfer: float = 3000.0
    chamfer_pred: float = 0.55
    edge: float = 350.0
    normal: float = 0.5


@dataclass(frozen=True)
class LaplaceWeights:
    """The factors of one stage's ``laplace_loss``."""

    laplace: float = 1500.0
    move: float = 50.0


STAGE1_MESH, STAGE2_MESH = MeshLossWeights(), MeshLossWeights(edge=500.0)
STAGE1_LAPLACE, STAGE2_LAPLACE = LaplaceWeights(), LaplaceWeights(move=100.0)


@dataclass(frozen=True)
class GroundTruth:
    """A batch's ground truth, padded to the longest sample (or to a given size): points and normals
    (B,P,3), ``valid`` (B,P) 1 for real points and 0 for padding, ``counts`` (B,) the real points per
    sample (host), ``count_values`` the same on ``xp`` in the points' dtype, and ``device_lengths``,
    where given, the counts as (B,) int64 on the device, which the nearest neighbours then read as
    they are (a CUDA Graph's inputs: no copy from the host)."""

    points: Any
    normals: Any
    valid: Any
    counts: np.ndarray
    count_values: Any
    device_lengths: Any = None

    def lengths(self):
        """The counts where some sample is padded, else None (every point is real)."""
        if self.device_lengths is not None:
            return self.device_lengths
        return self.counts if int(self.counts.min()) < self.points.shape[1] else None

    @staticmethod
    def host_arrays(labels, dtype, size: int | None = None, out: dict | None = None) -> dict:
        """B (P_i, 6) arrays of points and unit normals padded to ``size`` points (default the longest):
        the host arrays of the fields, by name (``counts``: int64), written into ``out``'s arrays where
        given (``points``, ``normals``, ``valid``, ``count_values`` of ``dtype``, e.g. a step's pinned
        inputs) and returned in it."""
        counts = np.array([len(lab) for lab in labels], dtype=np.int64)
        size = int(counts.max()) if size is None else size
        if int(counts.max()) > size:
            raise ValueError(f"ground truth of {int(counts.max())} points does not fit {size}")
        batch, dtype = len(labels), np.dtype(dtype)
        if out is None:
            out = {
                "points": np.empty((batch, size, 3), dtype),
                "normals": np.empty((batch, size, 3), dtype),
                "valid": np.empty((batch, size), dtype),
                "count_values": np.empty((batch,), dtype),
            }
        # padding far from any mesh: never a nearest point of a predicted point
        out["points"][...] = 1e4
        out["normals"][...] = 1e4
        out["valid"][...] = 0.0
        for b, lab in enumerate(labels):
            lab = np.asarray(lab)  # each value rounded once to dtype, as from float64
            out["points"][b, : counts[b]] = lab[:, :3]
            out["normals"][b, : counts[b]] = lab[:, 3:6]
            out["valid"][b, : counts[b]] = 1.0
        out["count_values"][...] = counts
        out["counts"] = counts
        return out

    @classmethod
    def from_labels(cls, xp, labels, dtype) -> GroundTruth:
        """From a list of B (P_i, 6) arrays of points and unit normals."""
        host = cls.host_arrays(labels, dtype)
        return cls(
            xp.asarray(host["points"]),
            xp.asarray(host["normals"]),
            xp.asarray(host["valid"]),
            host["counts"],
            xp.asarray(host["count_values"]),
        )


@dataclass(frozen=True)
class Draws:
    """A mesh_loss call's random draws for B samples: face indices ``choice`` (B,S) and the
    uniforms ``r1``, ``r2`` (B,S,1); a sample is (1-u) a + u(1-v) b + u v c, u = sqrt(r1), v = r2."""

    choice: Any
    r1: Any
    r2: Any

    @classmethod
    def stack(cls, xp, draws, dtype) -> Draws:
        """From B ``(choice, r1, r2)`` host triples (the original's fed draws)."""
        choice = np.stack([np.asarray(c, dtype=np.int64).reshape(-1) for c, _, _ in draws])
        r1 = np.stack([np.asarray(r, dtype=np.float32).reshape(-1, 1) for _, r, _ in draws]).astype(dtype)
        r2 = np.stack([np.asarray(r, dtype=np.float32).reshape(-1, 1) for _, _, r in draws]).astype(dtype)
        return cls(xp.asarray(choice), xp.asarray(r1), xp.asarray(r2))


def _flat_rows(xp, index, n: int):
    """Per-sample rows ``index`` (B,k) of B stacked blocks of ``n`` rows as rows of the stack, flat
    (B*k,): sample b's shifted by b*n. One sample's are its own, with no offsets to make."""
    if index.shape[0] == 1:
        return xp.reshape(index, (-1,))
    offsets = xp.arange(index.shape[0], dtype=index.dtype)[:, None] * n
    return xp.reshape(index + offsets, (-1,))


def _take(xp, x, index):
    """Rows ``index`` (B,k) or (k,) of each sample of x (B,n,C) -> (B,k,C)."""
    batch, n, c = x.shape
    if index.ndim == 1:
        return xp.take(x, index, axis=1)
    flat = _flat_rows(xp, index, n)
    return xp.reshape(xp.take(xp.reshape(x, (batch * n, c)), flat, axis=0), (batch, index.shape[1], c))


def _scatter(xp, index, values, n: int):
    """The backward of :func:`_take`: rows of values (B,k,C) summed into (B,n,C) at ``index``."""
    batch, k, c = values.shape
    if index.ndim == 1:
        index = xp.broadcast_to(index[None], (batch, k))
    flat = _flat_rows(xp, index, n)
    return xp.reshape(scatter_add(xp, flat, xp.reshape(values, (batch * k, c)), batch * n), (batch, n, c))


def face_areas(xp, pred, faces):
    """Each face's area (B,F), in the original's ``choice_faces`` arithmetic."""
    a, b, c = (xp.take(pred, faces[:, i], axis=1) for i in range(3))
    u, v = a - b, b - c
    cross = xp.stack(
        [
            u[..., 1] * v[..., 2] - u[..., 2] * v[..., 1],
            u[..., 2] * v[..., 0] - u[..., 0] * v[..., 2],
            u[..., 0] * v[..., 1] - u[..., 1] * v[..., 0],
        ],
        axis=-1,
    )
    return xp.sqrt(xp.sum(cross * cross, axis=-1)) / 2


@dataclass(frozen=True)
class Uniforms:
    """A mesh_loss call's uniforms for the trainer's own draws, on ``xp``: ``pick`` (B,S) float64 (the
    face, through the areas' cumulative distribution) and ``r1``, ``r2`` (B,S,1)."""

    pick: Any
    r1: Any
    r2: Any

    @staticmethod
    def host(
        rng: np.random.Generator, batch: int, calls: int, dtype, count: int = SAMPLES, out: list | None = None
    ) -> list:
        """``calls`` calls' uniforms from ``rng`` as host (pick, r1, r2) triples, each call's pick, r1 and
        r2 in turn (so a run's draws resume with its generator); drawn into ``out``'s triples where given
        (float64 (B,S) and float32 (B,S,1) arrays, e.g. a step's pinned inputs)."""
        host = []
        for call in range(calls):
            if out is not None:
                pick, r1, r2 = out[call]
                rng.random(out=pick)
                rng.random(dtype=np.float32, out=r1)
                rng.random(dtype=np.float32, out=r2)
                host.append(out[call])
                continue
            pick = rng.random((batch, count))
            r1 = rng.random((batch, count, 1), dtype=np.float32)
            r2 = rng.random((batch, count, 1), dtype=np.float32)
            host.append((pick, r1.astype(dtype), r2.astype(dtype)))
        return host

    @classmethod
    def draw(cls, xp, rng: np.random.Generator, batch: int, calls: int, dtype, count: int = SAMPLES) -> list:
        """:meth:`host`'s uniforms, all uploaded at once before a step's forward: an upload from the host
        waits for the device's queue, which is empty then."""
        return [
            cls(xp.asarray(pick), xp.asarray(r1), xp.asarray(r2))
            for pick, r1, r2 in cls.host(rng, batch, calls, dtype, count)
        ]


def draw_samples(
    xp, rng: np.random.Generator | None, pred, faces, count: int = SAMPLES, uniforms: Uniforms | None = None
) -> Draws:
    """The trainer's own draws: ``count`` faces per sample chosen with probability proportional to
    area (as the original's ``choice_faces``) and two uniforms each. The uniforms are ``uniforms``, or
    drawn from ``rng`` now (:meth:`Uniforms.draw`); the face choice inverts the areas' cumulative
    distribution on the device."""
    batch = pred.shape[0]
    if uniforms is None:
        uniforms = Uniforms.draw(xp, rng, batch, 1, pred.dtype, count)[0]
    pick, r1, r2 = uniforms.pick, uniforms.r1, uniforms.r2
    areas = xp.astype(face_areas(xp, pred, faces), xp.float64)
    cdf = xp.cumulative_sum(areas, axis=1)
    cdf = cdf / cdf[:, -1:]
    if batch > 1:  # each sample's distribution shifted by its number, so that one search serves all
        offsets = xp.arange(batch, dtype=xp.float64)[:, None]
        cdf, pick = cdf + offsets, pick + offsets
    choice = xp.searchsorted(xp.reshape(cdf, (-1,)), xp.reshape(pick, (-1,)), side="right")
    choice = xp.reshape(choice, (batch, count))
    if batch > 1:
        choice = choice - xp.arange(batch, dtype=choice.dtype)[:, None] * faces.shape[0]
    # min(max(.)) is clip's arithmetic with no scalar uploaded (array-api-compat's clip makes arrays of
    # its bounds, copies a CUDA Graph cannot hold)
    choice = xp.minimum(xp.maximum(xp.astype(choice, xp.int64), 0), faces.shape[0] - 1)
    return Draws(choice, r1, r2)


def nearest(xp, a, b, lengths_b=None):
    """Index (B,n) of the nearest point of each sample's ``b`` (B,m,3) for every point of ``a`` (B,n,3),
    among b's first ``lengths_b[i]`` points: SciPy's k-d tree in float64 on NumPy, the metrics'
    brute-force kernel on CuPy."""
    if is_cupy_namespace(xp):
        from ..metrics import nn_cupy

        # lengths already on the device are a CUDA Graph's input, read unchecked (no copy to the host)
        return nn_cupy.nearest(a, b, None, lengths_b, validate=not nn_cupy.is_cupy(lengths_b))[1]
    from ..metrics import nn_cpu

    out = np.empty(a.shape[:2], dtype=np.int64)
    for i in range(a.shape[0]):
        m = b.shape[1] if lengths_b is None else int(lengths_b[i])
        out[i] = nn_cpu.nearest_index(np.asarray(a[i], np.float64), np.asarray(b[i, :m], np.float64))
    return xp.asarray(out)


def _unit(xp, v):
    """tf.nn.l2_normalize over the last axis, with the 1/norm used and whether its epsilon bounds it."""
    square = xp.sum(v * v, axis=-1, keepdims=True)
    inv = 1.0 / xp.sqrt(xp.maximum(square, NORMALIZE_EPS))
    return v * inv, inv, square >= NORMALIZE_EPS


@dataclass
class MeshLossCache:
    pred_count: int
    edges: Any
    faces: Any
    draws: Draws
    weights: MeshLossWeights
    edge: Any
    unit_normal: Any
    edge_inv: Any
    edge_free: Any
    cosine: Any
    sample_pred: Any
    gt: GroundTruth
    idx1: Any
    idx2: Any
    terms: dict


def mesh_loss_forward(xp, pred, gt: GroundTruth, edges, faces, draws: Draws, weights: MeshLossWeights):
    """``mesh_loss`` of predicted vertices (B,N,3) with the block's ``edges`` (E,2) and ``faces`` (F,3);
    returns (loss (B,), cache). ``cache.terms`` holds the Chamfer, edge and normal parts (B,)."""
    n = pred.shape[1]
    edge = xp.take(pred, edges[:, 0], axis=1) - xp.take(pred, edges[:, 1], axis=1)
    edge_loss = xp.mean(xp.sum(edge * edge, axis=-1), axis=1) * weights.edge

    corners = [_take(xp, pred, _face_corner(xp, faces, draws.choice, i)) for i in range(3)]
    u = xp.sqrt(draws.r1)
    v = draws.r2
    points = (1 - u) * corners[0] + (u * (1 - v)) * corners[1] + (u * v) * corners[2]
    sample_pred = xp.concat([pred, points], axis=1)
    idx1 = nearest(xp, gt.points, sample_pred)
    idx2 = nearest(xp, sample_pred, gt.points, gt.lengths())
    d1 = xp.sum((gt.points - _take(xp, sample_pred, idx1)) ** 2, axis=-1)
    d2 = xp.sum((sample_pred - _take(xp, gt.points, idx2)) ** 2, axis=-1)
    counts = gt.count_values
    mean1 = xp.sum(d1 * gt.valid, axis=1) / counts
    point_loss = (mean1 + weights.chamfer_pred * xp.mean(d2, axis=1)) * weights.chamfer

    normal = _take(xp, _take(xp, gt.normals, idx2[:, :n]), edges[:, 0])
    unit_normal = _unit(xp, normal)[0]
    unit_edge, inv, free = _unit(xp, edge)
    cosine = xp.sum(unit_normal * unit_edge, axis=-1)
    normal_loss = xp.mean(xp.abs(cosine), axis=1) * weights.normal

    terms = {"chamfer": point_loss, "edge": edge_loss, "normal": normal_loss}
    cache = MeshLossCache(
        n, edges, faces, draws, weights, edge, unit_normal, inv, free, cosine, sample_pred, gt, idx1, idx2, terms
    )
    return point_loss + edge_loss + normal_loss, cache


def _face_corner(xp, faces, choice, i: int):
    """Vertex ``i`` of the chosen faces, (B,S), for a per-sample ``choice`` (B,S)."""
    return xp.reshape(xp.take(faces[:, i], xp.reshape(choice, (-1,)), axis=0), choice.shape)


def mesh_loss_backward(xp, dloss, cache: MeshLossCache):
    """The gradient (B,N,3) of the predicted vertices from the loss's gradient ``dloss`` (B,)."""
    w, n = cache.weights, cache.pred_count
    g = dloss[:, None, None]
    num_edges = cache.edges.shape[0]
    # edge length and normal cosine, through tf.nn.l2_normalize of the edges
    dedge = g * (2 * w.edge / num_edges) * cache.edge
    # sign(cosine) as two comparisons: array-api-compat's sign on CuPy writes NaNs through a boolean mask,
    # which reads a count back from the device (a NaN cosine stops the step anyway)
    sign = xp.astype(cache.cosine > 0, g.dtype) - xp.astype(cache.cosine < 0, g.dtype)
    dunit = (g * (w.normal / num_edges)) * sign[..., None] * cache.unit_normal
    inv = cache.edge_inv
    along = xp.sum(cache.edge * dunit, axis=-1, keepdims=True)
    dedge = dedge + inv * dunit - xp.where(cache.edge_free, inv * inv * inv * along, xp.zeros_like(along)) * cache.edge
    dpred = _scatter(xp, cache.edges[:, 0], dedge, n) - _scatter(xp, cache.edges[:, 1], dedge, n)
    # Chamfer: the op's gradient 2 (a - b[idx]) to a, its negative to b[idx]
    gt, sample_pred = cache.gt, cache.sample_pred
    counts = gt.count_values[:, None, None]
    diff1 = gt.points - _take(xp, sample_pred, cache.idx1)
    to_nearest = (-2 * w.chamfer) * g * gt.valid[..., None] * diff1 / counts
    d_sample = _scatter(xp, cache.idx1, to_nearest, sample_pred.shape[1])
    diff2 = sample_pred - _take(xp, gt.points, cache.idx2)
    d_sample = d_sample + (2 * w.chamfer * w.chamfer_pred / sample_pred.shape[1]) * g * diff2
    dpred = dpred + d_sample[:, :n]
    dpoints = d_sample[:, n:]
    u = xp.sqrt(cache.draws.r1)
    v = cache.draws.r2
    for i, factor in enumerate(((1 - u), (u * (1 - v)), (u * v))):
        dpred = dpred + _scatter(xp, _face_corner(xp, cache.faces, cache.draws.choice, i), factor * dpoints, n)
    return dpred


def _neighbour_sum(xp, pred, lape_idx):
    """Each vertex's sum of its (up to 8) neighbours, a -1 reading the zero row the original appends."""
    batch, n, _ = pred.shape
    ext = xp.concat([pred, xp.zeros((batch, 1, 3), dtype=pred.dtype)], axis=1)
    index = xp.where(lape_idx[:, :8] < 0, n, lape_idx[:, :8])
    gathered = xp.take(ext, xp.reshape(index, (-1,)), axis=1)
    return xp.sum(xp.reshape(gathered, (batch, n, 8, 3)), axis=2), index


def laplace_coord(xp, pred, lape_idx, reciprocal):
    """p - (sum of the neighbours) * (1 / their count), as the original's ``laplace_coord``."""
    total, _ = _neighbour_sum(xp, pred, lape_idx)
    return pred - total * reciprocal


@dataclass
class LaplaceCache:
    lape_idx: Any
    reciprocal: Any
    lap_diff: Any
    move_diff: Any
    weights: LaplaceWeights


def laplace_reciprocal(xp, lape_idx, dtype):
    """The float32 reciprocal of each vertex's neighbour count (column 9), as (N,1) of ``dtype``;
    ``lape_idx`` on the host or on ``xp``'s device."""
    count = xp.astype(xp.asarray(lape_idx)[:, 9:10], xp.float32)
    return xp.astype(1.0 / count, dtype)


def laplace_loss_forward(xp, pred1, pred2, lape_idx, weights: LaplaceWeights, reciprocal=None):
    """``laplace_loss`` between the meshes before (B,N,3) and after (B,N,3) a block; returns (loss (B,),
    cache) with ``cache.terms``-free parts: Laplacian and move."""
    if reciprocal is None:
        reciprocal = laplace_reciprocal(xp, lape_idx, pred1.dtype)
    lap_diff = laplace_coord(xp, pred1, lape_idx, reciprocal) - laplace_coord(xp, pred2, lape_idx, reciprocal)
    move_diff = pred1 - pred2
    loss = (
        xp.mean(xp.sum(lap_diff * lap_diff, axis=-1), axis=1) * weights.laplace
        + xp.mean(xp.sum(move_diff * move_diff, axis=-1), axis=1) * weights.move
    )
    return loss, LaplaceCache(lape_idx, reciprocal, lap_diff, move_diff, weights)


def laplace_loss_backward(xp, dloss, cache: LaplaceCache):
    """(dpred1, dpred2) from the loss's gradient ``dloss`` (B,)."""
    batch, n, _ = cache.lap_diff.shape
    g = dloss[:, None, None]
    dlap = g * (2 * cache.weights.laplace / n) * cache.lap_diff
    dmove = g * (2 * cache.weights.move / n) * cache.move_diff
    index = xp.where(cache.lape_idx[:, :8] < 0, n, cache.lape_idx[:, :8])
    spread = xp.broadcast_to((dlap * cache.reciprocal)[:, :, None, :], (batch, n, 8, 3))
    neighbours = _scatter(xp, xp.reshape(index, (-1,)), xp.reshape(spread, (batch, n * 8, 3)), n + 1)[:, :n]
    dpred1 = dlap + dmove - neighbours
    return dpred1, -dpred1
