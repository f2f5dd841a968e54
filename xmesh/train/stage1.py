"""Stage 1 (MVP2M) training: the loss of ``MeshNetMVP2M`` and its backward, top to bottom.

Forward: CNN18 on the views the projections read (with the view quirk, view 0 only: the original
runs all three but reads only view 0's maps, so the others get no gradient); the 48 layers of
graph projection, graph convolution and unpooling, each keeping its cache; ``mesh_loss`` on the
three blocks' outputs and ``laplace_loss`` between each block's input mesh (the template, then the
unpooled previous block) and its output. Backward: the same layers in reverse, the three
projections' map gradients summed into the CNN's backward. The regularisers come last: the CNN's
L2 and the graph layers' weight decay.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..model import architecture as arch
from ..model.camera import packed_transforms
from ..model.cnn import cnn_backward, cnn_forward
from ..model.graph import GraphSupports, graph_conv_backward, graph_conv_forward, unpool_backward, unpool_forward
from ..model.projection import DeviceTransforms, graph_projection_backward, graph_projection_forward
from . import mesh_losses as ml
from .regularisers import cnn_regulariser, graph_weight_decay

MESH_LOSS_CALLS = 3  # the mesh_loss calls of one step, in the original's order: blocks 1, 2, 3


@dataclass(frozen=True)
class Stage1Template:
    """What stage 1's training reads of the template, on ``xp`` in the training dtype."""

    coord: Any
    supports: tuple  # per block: GraphSupports
    pool_idx: tuple  # (E,2) int64 per unpooling
    edges: tuple  # per block: (E,2) the second support's coordinate pairs
    faces: tuple  # per block: (F,3)
    lape_idx: tuple  # per block: (N,10)
    reciprocal: tuple  # per block: (N,1) 1 / neighbour count

    @classmethod
    def build(cls, xp, template, dtype) -> Stage1Template:
        edges = []
        for supports in template.supports:
            coo = supports[1].tocoo()
            edges.append(xp.asarray(np.stack([coo.row, coo.col], axis=1).astype(np.int64)))
        return cls(
            coord=xp.asarray(np.asarray(template.coord, dtype=dtype)),
            supports=tuple(GraphSupports.from_host(xp, s, dtype) for s in template.supports),
            pool_idx=tuple(xp.asarray(np.asarray(p, dtype=np.int64)) for p in template.pool_idx),
            edges=tuple(edges),
            faces=tuple(xp.asarray(np.asarray(f, dtype=np.int64)) for f in template.faces_triangle),
            lape_idx=tuple(xp.asarray(np.asarray(lape, dtype=np.int64)) for lape in template.lape_idx),
            reciprocal=tuple(ml.laplace_reciprocal(xp, lape, dtype) for lape in template.lape_idx),
        )


def graph_layer_variables(idx: int) -> str:
    """The variable scope of stage-1 graph convolution ``idx``."""
    block = arch.block_of_layer(idx)
    first = dict((b, f) for b, f, _ in arch.GRAPH_BLOCKS)[block]
    return arch.graph_layer_name(block, idx - first + 1, idx)


def cnn_layers(weights: dict) -> list:
    """(W, b, stride) of stage 1's 18 convolutions."""
    return [
        (weights[f"{arch.cnn_name(1, k)}/W:0"], weights[f"{arch.cnn_name(1, k)}/b:0"], stride)
        for k, (_, _, stride) in enumerate(arch.CNN_LAYERS, start=1)
    ]


@dataclass
class Stage1Forward:
    """The forward's activations (a[0] the template ... a[48] block 3) and per-layer caches."""

    maps: list
    cnn_caches: list
    activations: list
    caches: dict
    blocks: list


def transforms(xp, cameras) -> DeviceTransforms:
    """The views' camera transforms (B,V,5) -> on ``xp``, float32 as inference computes them."""
    cameras = np.asarray(cameras, dtype=np.float32)
    return DeviceTransforms.from_packed(xp.asarray(packed_transforms(cameras)), cameras.shape[1])


def cnn_images(xp, images, view_quirk: bool):
    """The images (B,V,224,224,3) whose maps the projections read, as (B*V',224,224,3)."""
    views = arch.stage1_views_read(images.shape[1], view_quirk)
    chosen = images[:, : len(views)]
    return xp.reshape(chosen, (-1,) + tuple(images.shape[2:]))


def forward(
    xp,
    weights: dict,
    tmpl: Stage1Template,
    images,
    tf: DeviceTransforms,
    view_quirk: bool = True,
    stop: int = arch.NUM_STAGE1_LAYERS,
    maps_and_caches=None,
) -> Stage1Forward:
    """Stage 1's training forward up to layer ``stop`` (all 48 by default); ``maps_and_caches`` is the
    CNN's result when it ran already."""
    if maps_and_caches is None:
        maps_and_caches = cnn_forward(xp, cnn_layers(weights), cnn_images(xp, images, view_quirk), arch.STAGE1_TAPS)
    maps, cnn_caches = maps_and_caches
    batch = images.shape[0]
    a = [xp.broadcast_to(tmpl.coord[None], (batch,) + tuple(tmpl.coord.shape))]
    caches: dict = {}
    blocks = []
    for idx in range(stop):
        previous = a[-2] if len(a) > 1 else None
        if idx in arch.PROJECTION_LAYERS:
            carried = previous if idx in arch.CONCAT_LAYERS else None
            h, caches[idx] = graph_projection_forward(xp, a[-1], maps, tf, view_quirk, carried)
        elif idx in arch.UNPOOL_LAYERS:
            h = unpool_forward(xp, a[-1], tmpl.pool_idx[arch.UNPOOL_LAYERS[idx]])
        else:
            scope = graph_layer_variables(idx)
            residual = previous if idx in arch.RESIDUAL_LAYERS else None
            h, caches[idx] = graph_conv_forward(
                xp,
                a[-1],
                weights[f"{scope}/weights_0:0"],
                weights[f"{scope}/weights_1:0"],
                weights[f"{scope}/bias:0"],
                tmpl.supports[arch.block_of_layer(idx) - 1],
                not arch.last_layer_of_block(idx),
                residual,
            )
            if arch.last_layer_of_block(idx):
                blocks.append(h)
        a.append(h)
    return Stage1Forward(maps, cnn_caches, a, caches, blocks)


def backward(xp, fwd: Stage1Forward, dblocks: list, tmpl: Stage1Template, weights: dict) -> dict:
    """Gradients by official name from the gradients of the three blocks' outputs (None for none)."""
    da: dict = {}

    def add(k, g):
        if g is not None:
            da[k] = g if k not in da else da[k] + g

    outputs = [first + count for _, first, count in arch.GRAPH_BLOCKS]  # a[15], a[31], a[48]
    for k, g in zip(outputs, dblocks):
        add(k, g)
    grads: dict = {}
    dmaps = [None] * len(arch.STAGE1_TAPS)
    for idx in range(len(fwd.activations) - 2, -1, -1):
        dh = da.pop(idx + 1, None)
        if dh is None:
            continue
        if idx in arch.PROJECTION_LAYERS:
            dcoords, layer_dmaps, dcarried = graph_projection_backward(xp, dh, fwd.caches[idx])
            dmaps = [d if m is None else m + d for m, d in zip(dmaps, layer_dmaps)]
            if idx > 0:
                add(idx, dcoords)
                add(idx - 1, dcarried)
        elif idx in arch.UNPOOL_LAYERS:
            add(idx, unpool_backward(xp, dh, tmpl.pool_idx[arch.UNPOOL_LAYERS[idx]], fwd.activations[idx].shape[1]))
        else:
            scope = graph_layer_variables(idx)
            dx, dw0, dw1, db, dres = graph_conv_backward(xp, dh, fwd.caches[idx])
            grads[f"{scope}/weights_0:0"], grads[f"{scope}/weights_1:0"], grads[f"{scope}/bias:0"] = dw0, dw1, db
            add(idx, dx)
            add(idx - 1, dres)
    for k, (dw, db) in enumerate(cnn_backward(xp, dmaps, fwd.cnn_caches, arch.STAGE1_TAPS), start=1):
        grads[f"{arch.cnn_name(1, k)}/W:0"], grads[f"{arch.cnn_name(1, k)}/b:0"] = dw, db
    return grads


def mesh_loss_name(block: int) -> str:
    return f"mesh_loss_block{block}_{block - 1}"


def laplace_loss_name(block: int) -> str:
    return f"laplace_loss_block{block}_{block + 2}"


def loss_and_gradients(
    xp,
    weights: dict,
    tmpl: Stage1Template,
    images,
    tf: DeviceTransforms,
    gt: ml.GroundTruth,
    draws: list | None,
    rng: np.random.Generator | None = None,
    view_quirk: bool = True,
):
    """Stage 1's loss averaged over the batch and its terms (each averaged over the batch), as ``xp``
    scalars, and every variable's gradient by official name (``xp`` arrays).

    ``draws``: the three mesh_loss calls' :class:`~xmesh.train.mesh_losses.Draws`, or None to draw them
    with ``rng`` from each block's predicted mesh (their uniforms drawn before the forward)."""
    uniforms = None if draws is not None else ml.Uniforms.draw(xp, rng, images.shape[0], MESH_LOSS_CALLS, images.dtype)
    fwd = forward(xp, weights, tmpl, images, tf, view_quirk)
    batch = images.shape[0]
    per_sample = xp.ones((batch,), dtype=fwd.blocks[0].dtype) / batch
    terms, dblocks = {}, [None, None, None]
    mesh_caches = []
    for b, pred in enumerate(fwd.blocks):
        block_draws = (
            draws[b] if draws is not None else ml.draw_samples(xp, rng, pred, tmpl.faces[b], uniforms=uniforms[b])
        )
        loss, cache = ml.mesh_loss_forward(xp, pred, gt, tmpl.edges[b], tmpl.faces[b], block_draws, ml.STAGE1_MESH)
        terms[mesh_loss_name(b + 1)] = xp.mean(loss)
        mesh_caches.append(cache)
    befores = [fwd.activations[0]] + [unpool_forward(xp, fwd.blocks[b], tmpl.pool_idx[b]) for b in range(2)]
    lap_caches = []
    for b, pred in enumerate(fwd.blocks):
        loss, cache = ml.laplace_loss_forward(
            xp, befores[b], pred, tmpl.lape_idx[b], ml.STAGE1_LAPLACE, tmpl.reciprocal[b]
        )
        terms[laplace_loss_name(b + 1)] = xp.mean(loss)
        lap_caches.append(cache)
    for b in range(3):
        dblocks[b] = ml.mesh_loss_backward(xp, per_sample, mesh_caches[b])
    for b in range(3):
        dbefore, dafter = ml.laplace_loss_backward(xp, per_sample, lap_caches[b])
        dblocks[b] = dblocks[b] + dafter
        if b > 0:  # the template (block 1's input mesh) is a constant
            n = fwd.blocks[b - 1].shape[1]
            dblocks[b - 1] = dblocks[b - 1] + unpool_backward(xp, dbefore, tmpl.pool_idx[b - 1], n)
    grads = backward(xp, fwd, dblocks, tmpl, weights)
    cnn_loss, cnn_grads = cnn_regulariser(xp, weights, 1)
    decay_loss, decay_grads = graph_weight_decay(xp, weights)
    for name, g in list(cnn_grads.items()) + list(decay_grads.items()):
        grads[name] = grads[name] + g
    total = cnn_loss + decay_loss
    for value in terms.values():
        total = total + value
    return total, terms, grads
