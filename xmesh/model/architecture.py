"""The fixed shape of the Pixel2Mesh++ network (MODEL.md), as data the other modules read."""

from __future__ import annotations

# CNN18: (output channels, kernel size, stride) of conv2d_1 .. conv2d_18.
CNN_LAYERS = (
    (16, 3, 1),
    (16, 3, 1),
    (32, 3, 2),
    (32, 3, 1),
    (32, 3, 1),
    (64, 3, 2),
    (64, 3, 1),
    (64, 3, 1),
    (128, 3, 2),
    (128, 3, 1),
    (128, 3, 1),
    (256, 5, 2),
    (256, 3, 1),
    (256, 3, 1),
    (512, 5, 2),
    (512, 3, 1),
    (512, 3, 1),
    (512, 3, 1),
)
STAGE1_TAPS = (8, 11, 14, 18)  # maps read by the stage-1 projection: 56x56x64 ... 7x7x512
STAGE2_TAPS = (2, 5, 8)  # maps read by the stage-2 local projection: 224x224x16 ... 56x56x64
IMAGE_SIZE = 224
NUM_VIEWS = 3

HIDDEN = 192
COORD_DIM = 3
# Stage 1 (MVP2M): three graph blocks. (block, first layer index, number of layers, support stage).
GRAPH_BLOCKS = ((1, 1, 14), (2, 17, 14), (3, 33, 15))
PROJECTION_LAYERS = (0, 15, 31)
UNPOOL_LAYERS = {16: 0, 32: 1}
RESIDUAL_LAYERS = frozenset({3, 5, 7, 9, 11, 13, 19, 21, 23, 25, 27, 29, 35, 37, 39, 41, 43, 45})
CONCAT_LAYERS = frozenset({15, 31})
NUM_STAGE1_LAYERS = 48

# Stage 2 (MeshNet): two deformation reasoning blocks of six local graph convolutions each.
DRB_BLOCKS = (("graph_drb_blk1_layer_2", range(1, 7)), ("graph_drb_blk2_layer_5", range(7, 13)))


def graph_layer_name(block: int, j: int, idx: int) -> str:
    return f"meshnetmvp2m/pixel2mesh/graph_conv_blk{block}_{j}_layer_{idx}_vars"


def graph_layers():
    """(block, layer index idx, variable scope) for the 43 stage-1 graph convolutions, in order."""
    for block, first, count in GRAPH_BLOCKS:
        for j in range(1, count + 1):
            idx = first + j - 1
            yield block, idx, graph_layer_name(block, j, idx)


def block_of_layer(idx: int) -> int:
    for block, first, count in GRAPH_BLOCKS:
        if first <= idx < first + count:
            return block
    raise KeyError(idx)


def last_layer_of_block(idx: int) -> bool:
    return any(idx == first + count - 1 for _, first, count in GRAPH_BLOCKS)


def map_stride(tap: int) -> int:
    """Pixels of the 224x224 image per map cell after conv ``tap`` (4 after conv 8, 32 after conv 18)."""
    stride = 1
    for _, _, step in CNN_LAYERS[:tap]:
        stride *= step
    return stride


def stage1_views_read(num_views: int, view_quirk: bool) -> tuple:
    """The views whose stage-1 maps the graph projections read.

    With the quirk the view index is divided by each map's stride like the pixel indices, so view v
    reads view v // stride's maps: with 3 views and strides of 4 and more, only view 0's.
    """
    if not view_quirk:
        return tuple(range(num_views))
    return tuple(sorted({v // map_stride(tap) for v in range(num_views) for tap in STAGE1_TAPS}))


def unpool_commutes_with_next(idx: int) -> bool:
    """Whether unpooling layer ``idx`` can run after the next layer's product instead of before it.

    True when layer idx + 1 is a graph convolution that reads only a[-1], and layer idx + 2 reads
    only a[-1] as well (so the unpooled input, a[-2] there, is never needed).
    """
    reads_previous = RESIDUAL_LAYERS | CONCAT_LAYERS
    nxt = idx + 1
    return (
        idx in UNPOOL_LAYERS
        and nxt not in PROJECTION_LAYERS
        and nxt not in UNPOOL_LAYERS
        and nxt < NUM_STAGE1_LAYERS
        and nxt not in reads_previous
        and nxt + 1 not in reads_previous
    )


def cnn_name(stage: int, k: int) -> str:
    return f"{'meshnetmvp2m' if stage == 1 else 'meshnet'}/cnn/conv2d_{k}"


def drb_layer_name(scope: str, k: int) -> str:
    return f"meshnet/pixel2mesh/{scope}/localgconv_{k}_vars"
