"""One Pixel2Mesh++ reconstruction, top to bottom, from images (B,V,224,224,3) BGR in [0,1] and
cameras (B,V,5):

- stage 1 (MVP2M): CNN18 maps; 48 layers of graph projection / graph convolution / unpooling
  deform the 156-vertex ellipsoid into the coarse 2466-vertex mesh;
- stage 2 (MeshNet): CNN18 maps (convs 1-8 only); two deformation reasoning blocks refine it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import architecture as arch
from .cnn import run_cnn
from .deformation import deformation_block
from .graph import graph_conv, unpool
from .projection import DeviceTransforms, graph_projection, pad_maps


@dataclass
class Trace:
    """Intermediate results of one call, kept only when asked for (tests, debugging)."""

    stage1_maps: list = field(default_factory=list)
    stage2_maps: list = field(default_factory=list)
    stage1_blocks: list = field(default_factory=list)
    stage2_blocks: list = field(default_factory=list)


def run_stage1_layers(
    backend,
    p,
    maps,
    tf: DeviceTransforms,
    view_quirk: bool,
    start: int,
    stop: int,
    previous,
    current,
    blocks: list | None = None,
):
    """Run stage-1 layers ``start .. stop-1`` from the state (a[-2], a[-1]); returns the new state.

    The original's list of 48 layers: graph projections at 0, 15, 31, unpooling at 16 and 32,
    graph convolutions elsewhere; layers in RESIDUAL_LAYERS average with a[-2], those in
    CONCAT_LAYERS append a[-2]'s features. Each block's last layer output (coordinates) is
    appended to ``blocks``. An unpooling followed by a graph convolution is run inside that
    convolution, after its product (``graph_conv``'s ``pool_idx``): the unpooled 3075-wide input
    is never made, and the product runs on a quarter of the rows.
    """
    xp = backend.xp
    pending_pool = None  # an unpooling left to the next layer, which runs its product first
    for idx in range(start, stop):
        if idx in arch.PROJECTION_LAYERS:  # with a[-2]'s features appended at the concatenating layers
            carried = previous if idx in arch.CONCAT_LAYERS else None
            h = graph_projection(backend, current, maps, tf, view_quirk, carried)
        elif idx in arch.UNPOOL_LAYERS:
            pool_idx = p.pool_idx[arch.UNPOOL_LAYERS[idx]]
            if arch.unpool_commutes_with_next(idx) and idx + 2 < stop:
                pending_pool, h = pool_idx, current
            else:
                h = unpool(backend, current, pool_idx)
        else:  # a graph convolution; the residual layers' averaging (h + a[-2]) / 2 is part of it
            block = arch.block_of_layer(idx)
            residual = previous if idx in arch.RESIDUAL_LAYERS else None
            h = graph_conv(backend, p.layers[idx], current, p.supports[block - 1], residual, pending_pool)
            pending_pool = None
            if blocks is not None and arch.last_layer_of_block(idx):
                blocks.append(h)
        if idx in arch.CONCAT_LAYERS and idx not in arch.PROJECTION_LAYERS:
            h = xp.concat([h, previous], axis=-1)
        previous, current = current, h
    return previous, current


def stage1_cnn_images(backend, images, num_views: int, view_quirk: bool):
    """The images whose stage-1 maps the graph projections read, (B*V',224,224,3) sample-major.

    With the quirk (the published weights) every view samples view 0's maps, so only view 0 goes
    through the stage-1 CNN: the other views' maps would never be read (the original computes and
    discards them). Without it, all V views.
    """
    views = arch.stage1_views_read(num_views, view_quirk)
    if len(views) == num_views:
        return images
    xp = backend.xp
    batch = images.shape[0] // num_views
    # the views read are always the first ones (v // stride does not decrease with v)
    per_sample = xp.reshape(images, (batch, num_views) + tuple(images.shape[1:]))
    return xp.reshape(per_sample[:, : len(views)], (batch * len(views),) + tuple(images.shape[1:]))


def stage1_maps(backend, p, images, num_views: int, view_quirk: bool = True) -> list:
    """Stage 1's CNN maps of the views its projections read (``stage1_cnn_images``)."""
    return run_cnn(backend, p.cnn, stage1_cnn_images(backend, images, num_views, view_quirk), arch.STAGE1_TAPS)


def stage1_from_maps(backend, p, maps, tf: DeviceTransforms, view_quirk: bool = True) -> list:
    """Stage 1 after its CNN: the 48 layers from the template's coordinates; returns the coordinates
    after graph blocks 1, 2, 3 ((B,156,3), (B,618,3), (B,2466,3))."""
    batch = tf.packed.shape[0]
    coords = backend.xp.broadcast_to(p.coord[None], (batch,) + tuple(p.coord.shape))
    blocks: list = []
    run_stage1_layers(backend, p, maps, tf, view_quirk, 0, arch.NUM_STAGE1_LAYERS, None, coords, blocks)
    return blocks


def run_stage1(backend, p, images, tf: DeviceTransforms, view_quirk: bool = True, trace: Trace | None = None):
    """Coarse mesh: returns the coordinates after graph blocks 1, 2, 3 ((B,156,3), (B,618,3), (B,2466,3)).

    A trace keeps every view's maps (as the original computes them); without one, only the views
    the projections read go through the CNN (``stage1_maps``).
    """
    if trace is not None:
        maps = run_cnn(backend, p.cnn, images, arch.STAGE1_TAPS)
    else:
        maps = stage1_maps(backend, p, images, tf.num_views, view_quirk)
    blocks = stage1_from_maps(backend, p, maps, tf, view_quirk)
    if trace is not None:
        trace.stage1_maps, trace.stage1_blocks = maps, blocks
    return blocks


def stage2_maps(backend, p, images) -> tuple[list, list]:
    """Stage 2's CNN maps and the same maps padded for the local projection."""
    maps = run_cnn(backend, p.cnn, images, arch.STAGE2_TAPS)
    return maps, pad_maps(backend, maps)


def run_stage2(
    backend, p, images, coarse, tf: DeviceTransforms, trace: Trace | None = None, maps: tuple[list, list] | None = None
):
    """Refined mesh (B,N,3) from the coarse one, through the two deformation reasoning blocks;
    ``maps``: ``stage2_maps``'s result when it was computed already."""
    maps, padded = stage2_maps(backend, p, images) if maps is None else maps
    centers = coarse
    blocks = []
    for layers in p.blocks:
        centers = deformation_block(backend, layers, p, centers, padded, tf)
        blocks.append(centers)
    if trace is not None:
        trace.stage2_maps, trace.stage2_blocks = maps, blocks
    return centers


def run_network(
    backend, stage1_params, stage2_params, images, cameras, view_quirk: bool = True, trace: Trace | None = None
):
    """images: device (B*V,224,224,3); cameras: host (B,V,5). Returns (coarse (B,N,3), refined (B,N,3))."""
    tf = DeviceTransforms.from_cameras(backend, cameras)
    return run_network_on_device(backend, stage1_params, stage2_params, images, tf, view_quirk, trace)


def run_network_on_device(
    backend,
    stage1_params,
    stage2_params,
    images,
    tf: DeviceTransforms,
    view_quirk: bool = True,
    trace: Trace | None = None,
):
    """As ``run_network`` with the view transforms already on the device: device work only (capturable).

    Stage 2's CNN reads only the images, so it is queued first, on a branch: on a GPU it runs
    beside stage 1, whose chain of small kernels leaves most of the chip idle at small batches.
    """
    cnn2 = backend.branch()
    with cnn2:
        maps2 = stage2_maps(backend, stage2_params, images)
    coarse = run_stage1(backend, stage1_params, images, tf, view_quirk, trace)[-1]
    cnn2.join()
    refined = run_stage2(backend, stage2_params, images, coarse, tf, trace, maps2)
    return coarse, refined


def run_network_from_host(
    backend, stage1_params, stage2_params, host_images, tf: DeviceTransforms, view_quirk: bool = True
):
    """As ``run_network_on_device`` from host images (B,V,224,224,3): only the views stage 1 reads
    are uploaded before it (with the view quirk, view 0); the others are uploaded on the stage-2
    CNN's branch, queued after stage 1, so on a GPU the upload runs while stage 1 computes."""
    batch, num_views = host_images.shape[:2]
    images = backend.xp.empty((batch * num_views,) + tuple(host_images.shape[2:]), dtype=backend.xp.float32)
    first = arch.stage1_views_read(num_views, view_quirk)
    backend.copy_views_into(images, host_images, first)
    cnn2 = backend.branch()
    coarse = run_stage1(backend, stage1_params, images, tf, view_quirk)[-1]
    with cnn2:
        backend.copy_views_into(images, host_images, [v for v in range(num_views) if v not in first])
        maps2 = stage2_maps(backend, stage2_params, images)
    cnn2.join()
    refined = run_stage2(backend, stage2_params, images, coarse, tf, None, maps2)
    return coarse, refined
