"""Stage 2 (MeshNet) training: the loss of the original's ``MeshNet`` and its backward, top to bottom.

Forward: the stage-2 CNN up to conv 8 (the maps after convs 2, 5 and 8, zero-padded for the
bilinear rule); DRB 1 moves the starting mesh (stage 1's prediction), DRB 2 moves DRB 1's output.
The loss, in the original's order: ``mesh_loss_2`` of DRB 1's output on the block-3 edges and faces
(edge * 500), ``laplace_loss_2`` between the start and DRB 1's output (move * 100), the same two for
DRB 2 (its Laplacian term against DRB 1's output), and the CNN's L2 regulariser over all 18
convolutions. Nothing regularises the DRBs: the original's weight-decay loop reads each
DeformationReasoning layer's own variables, which are empty (they live in its LocalGConv layers).

Backward: the reverse. Both DRBs' map gradients are summed into the CNN's backward. Convs 9-18
never run (nothing reads their maps): their kernels get the regulariser's gradient alone and their
biases none, so the biases are absent from the gradients, as TensorFlow gives them None and its
Adam leaves them unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..model import architecture as arch
from ..model.cnn import cnn_backward, cnn_forward
from ..model.deformation_train import deformation_block_backward, deformation_block_forward
from ..model.projection import DeviceTransforms
from . import mesh_losses as ml
from .regularisers import cnn_regulariser

BLOCK = 3  # the losses read block 3's (2466-vertex) edges, faces and Laplacian neighbours
MESH_LOSS_CALLS = 2  # the mesh_loss_2 calls of one step, in the original's order: DRB 1's output, DRB 2's


@dataclass(frozen=True)
class Stage2Template:
    """What stage 2's training reads of the template, on ``xp`` in the training dtype."""

    offsets: Any  # (K,3) the hypotheses' offsets (sample_coord)
    supports: tuple  # (A0 or None where the identity, A1), (K,K) each
    edges: Any  # (E,2) block 3's second support's coordinate pairs
    faces: Any  # (F,3) block 3's triangles
    lape_idx: Any  # (N,10)
    reciprocal: Any  # (N,1) 1 / neighbour count

    @classmethod
    def build(cls, xp, template, dtype) -> Stage2Template:
        cheb0, cheb1 = (np.asarray(c) for c in template.sample_cheb)
        identity = cheb0.shape[0] == cheb0.shape[1] and np.array_equal(cheb0, np.eye(cheb0.shape[0]))
        coo = template.supports[BLOCK - 1][1].tocoo()
        lape_idx = template.lape_idx[BLOCK - 1]
        return cls(
            offsets=xp.asarray(np.asarray(template.sample_coord, dtype=dtype)),
            supports=(None if identity else xp.asarray(cheb0.astype(dtype)), xp.asarray(cheb1.astype(dtype))),
            edges=xp.asarray(np.stack([coo.row, coo.col], axis=1).astype(np.int64)),
            faces=xp.asarray(np.asarray(template.faces_triangle[BLOCK - 1], dtype=np.int64)),
            lape_idx=xp.asarray(np.asarray(lape_idx, dtype=np.int64)),
            reciprocal=ml.laplace_reciprocal(xp, lape_idx, dtype),
        )


def cnn_layers(weights: dict) -> list:
    """(W, b, stride) of the convolutions whose maps stage 2 reads (1-8)."""
    return [
        (weights[f"{arch.cnn_name(2, k)}/W:0"], weights[f"{arch.cnn_name(2, k)}/b:0"], stride)
        for k, (_, _, stride) in enumerate(arch.CNN_LAYERS[: max(arch.STAGE2_TAPS)], start=1)
    ]


def drb_layers(weights: dict) -> list:
    """Per DRB, its six local graph convolutions' (W0, W1, b)."""
    return [
        [
            tuple(weights[f"{arch.drb_layer_name(scope, k)}/{part}:0"] for part in ("weights_0", "weights_1", "bias"))
            for k in ks
        ]
        for scope, ks in arch.DRB_BLOCKS
    ]


def pad_map(xp, fmap):
    """A zero row and column appended to a (N,s,s,C) map: an index equal to s reads 0 (the original's rule).
    Only the row and column are zeroed, the rest written once from the map."""
    n, s, _, c = fmap.shape
    out = xp.empty((n, s + 1, s + 1, c), dtype=fmap.dtype)
    out[:, :s, :s, :] = fmap
    out[:, s, :, :] = 0
    out[:, :s, s, :] = 0
    return out


@dataclass
class Stage2Forward:
    """The CNN's maps and caches, the two DRBs' outputs (B,N,3) and caches."""

    maps: list
    cnn_caches: list
    blocks: list
    drb_caches: list


def forward(xp, weights: dict, tmpl: Stage2Template, images, tf: DeviceTransforms, starts) -> Stage2Forward:
    """Stage 2's training forward: images (B,V,224,224,3), ``starts`` (B,N,3) the meshes DRB 1 moves."""
    views = xp.reshape(images, (-1,) + tuple(images.shape[2:]))
    maps, cnn_caches = cnn_forward(xp, cnn_layers(weights), views, arch.STAGE2_TAPS)
    padded = [pad_map(xp, m) for m in maps]
    centers, blocks, caches = starts, [], []
    for layers in drb_layers(weights):
        centers, cache = deformation_block_forward(xp, layers, tmpl.supports, tmpl.offsets, centers, padded, tf)
        blocks.append(centers)
        caches.append(cache)
    return Stage2Forward(maps, cnn_caches, blocks, caches)


def backward(xp, fwd: Stage2Forward, dblocks: list) -> dict:
    """Gradients by official name (the CNN's regulariser aside) from those of the two DRBs' outputs."""
    grads: dict = {}
    dmaps = None
    dcenters = None
    for b in (1, 0):
        dout = dblocks[b] if dcenters is None else dblocks[b] + dcenters
        dcenters, dmaps, layer_grads = deformation_block_backward(xp, dout, fwd.drb_caches[b], dmaps)
        scope, ks = arch.DRB_BLOCKS[b]
        for k, (dw0, dw1, db) in zip(ks, layer_grads, strict=True):
            name = arch.drb_layer_name(scope, k)
            grads[f"{name}/weights_0:0"], grads[f"{name}/weights_1:0"], grads[f"{name}/bias:0"] = dw0, dw1, db
    # the padded row and column read 0 whatever the CNN computes: their gradient goes nowhere
    dmaps = [d[:, : m.shape[1], : m.shape[2], :] for d, m in zip(dmaps, fwd.maps, strict=True)]
    for k, (dw, db) in enumerate(cnn_backward(xp, dmaps, fwd.cnn_caches, arch.STAGE2_TAPS), start=1):
        grads[f"{arch.cnn_name(2, k)}/W:0"], grads[f"{arch.cnn_name(2, k)}/b:0"] = dw, db
    return grads


def mesh_loss_name(call: int) -> str:
    """The golden file's name of a DRB output's mesh_loss_2 call (call 0 or 1), without its 's2_term_' prefix."""
    return f"mesh_loss_2_block{BLOCK}_{2 * call}"


def laplace_loss_name(call: int) -> str:
    return f"laplace_loss_2_block{BLOCK}_{2 * call + 1}"


@dataclass
class Stage2Losses:
    """The four loss calls' values per sample (B,) by name, and their caches in the original's order."""

    terms: dict
    mesh_caches: list
    laplace_caches: list


def losses(
    xp,
    fwd: Stage2Forward,
    tmpl: Stage2Template,
    gt: ml.GroundTruth,
    starts,
    draws: list | None,
    rng: np.random.Generator | None = None,
    uniforms: list | None = None,
) -> Stage2Losses:
    """mesh_loss_2 of each DRB's output and laplace_loss_2 between its input and output.

    ``draws``: the two mesh_loss calls' :class:`~xmesh.train.mesh_losses.Draws`, or None to draw them
    from each DRB's output with ``uniforms`` (:class:`~xmesh.train.mesh_losses.Uniforms` per call) or,
    without them, with ``rng``."""
    terms, mesh_caches, laplace_caches = {}, [], []
    befores = [starts, fwd.blocks[0]]
    for call, pred in enumerate(fwd.blocks):
        call_draws = (
            draws[call]
            if draws is not None
            else ml.draw_samples(xp, rng, pred, tmpl.faces, uniforms=None if uniforms is None else uniforms[call])
        )
        terms[mesh_loss_name(call)], cache = ml.mesh_loss_forward(
            xp, pred, gt, tmpl.edges, tmpl.faces, call_draws, ml.STAGE2_MESH
        )
        mesh_caches.append(cache)
        terms[laplace_loss_name(call)], cache = ml.laplace_loss_forward(
            xp, befores[call], pred, tmpl.lape_idx, ml.STAGE2_LAPLACE, tmpl.reciprocal
        )
        laplace_caches.append(cache)
    return Stage2Losses(terms, mesh_caches, laplace_caches)


def loss_and_gradients(
    xp,
    weights: dict,
    tmpl: Stage2Template,
    images,
    tf: DeviceTransforms,
    gt: ml.GroundTruth,
    starts,
    draws: list | None,
    rng: np.random.Generator | None = None,
    uniforms: list | None = None,
    regulariser=None,
):
    """Stage 2's loss averaged over the batch and its terms (each averaged over the batch), as ``xp``
    scalars, and the gradient of every variable the loss reaches, by official name (``xp`` arrays).
    Without ``draws``, the own draws take ``uniforms`` (:class:`~xmesh.train.mesh_losses.Uniforms` per
    mesh_loss call, already on the device), or uniforms drawn from ``rng`` before the forward.
    ``regulariser()``, if given, returns the CNN regulariser's loss and gradients in place of
    :func:`~xmesh.train.regularisers.cnn_regulariser` (the replayed step's table of them)."""
    if draws is None and uniforms is None:
        uniforms = ml.Uniforms.draw(xp, rng, starts.shape[0], MESH_LOSS_CALLS, starts.dtype)
    fwd = forward(xp, weights, tmpl, images, tf, starts)
    calls = losses(xp, fwd, tmpl, gt, starts, draws, rng, uniforms)
    batch = starts.shape[0]
    per_sample = xp.ones((batch,), dtype=starts.dtype) / batch
    dblocks = [ml.mesh_loss_backward(xp, per_sample, cache) for cache in calls.mesh_caches]
    for call, cache in enumerate(calls.laplace_caches):
        dbefore, dafter = ml.laplace_loss_backward(xp, per_sample, cache)
        dblocks[call] = dblocks[call] + dafter
        if call > 0:  # DRB 1's input, the start, is data
            dblocks[call - 1] = dblocks[call - 1] + dbefore
    grads = backward(xp, fwd, dblocks)
    cnn_loss, cnn_grads = cnn_regulariser(xp, weights, 2) if regulariser is None else regulariser()
    for name, g in cnn_grads.items():
        grads[name] = grads[name] + g if name in grads else g
    terms = {name: xp.mean(value) for name, value in calls.terms.items()}
    total = cnn_loss
    for value in terms.values():
        total = total + value
    return total, terms, grads


def loss(
    xp,
    weights: dict,
    tmpl: Stage2Template,
    images,
    tf: DeviceTransforms,
    gt: ml.GroundTruth,
    starts,
    draws: list | None,
    rng: np.random.Generator | None = None,
):
    """Stage 2's loss averaged over the batch, forward only (an ``xp`` scalar)."""
    calls = losses(xp, forward(xp, weights, tmpl, images, tf, starts), tmpl, gt, starts, draws, rng)
    total = cnn_regulariser(xp, weights, 2)[0]
    for value in calls.terms.values():
        total = total + xp.mean(value)
    return total
