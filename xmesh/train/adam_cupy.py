"""Adam's updates of a whole stage in two launches on CuPy, skipped on the device when anything is not
finite: the end of the replayed training step (:mod:`xmesh.train.graph_step`).

``AdamTable`` holds the device addresses of a stage's gradients, variables and moments (arrays that
stay where they are: a captured graph's outputs, the trainer's weights and moments), made once; a
gradient may be a matrix's columns (rows of ``cols`` floats ``stride`` apart: the two halves of a
graph convolution's one weights' product). Then
:meth:`AdamTable.mark` marks each gradient that holds a NaN or an infinity, and whether anything does
(a gradient, or one of the step's reported values: the loss and its terms), and :meth:`AdamTable.update`
applies :func:`xmesh.train.adam.apply_updates`'s float32 operations, one for one (so its values bit for
bit), to every variable, or to none where anything was marked. The step's host code reads the marks
back with the loss, so a step it refuses has changed no weight and no moment.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping

import numpy as np

from .adam import AdamState, ensure_moments

THREADS = 256
CHUNK = 8 * THREADS  # floats a block: each variable takes ceil(size / CHUNK) blocks of one flat grid

BLOCK_OWNER_SOURCE = r"""
// Tables of count rows of `width` long longs, column `first` holding each row's first block of one flat
// grid (ascending): the row whose blocks hold block b, the last whose first block is at most b.
__device__ __forceinline__ int xmesh_block_owner(const long long* rows, int width, int first, int count,
                                                 long long b) {
    int lo = 0, hi = count - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (rows[width * mid + first] <= b) lo = mid; else hi = mid - 1;
    }
    return lo;
}
"""


def first_blocks(sizes) -> tuple[list[int], int]:
    """Each of ``sizes``' first block in one flat grid of ``CHUNK``-float blocks (at least one a size),
    and the grid's blocks: the layout ``xmesh_block_owner`` searches."""
    firsts, blocks = [], 0
    for size in sizes:
        firsts.append(blocks)
        blocks += max(1, math.ceil(size / CHUNK))
    return firsts, blocks


_SOURCE = r"""
// A variable's place in the tables: shape[4 i ..] = (size, cols, stride, first block); its gradient
// lies in rows of cols floats, stride floats apart. Block b works on the variable whose blocks hold it.
__device__ __forceinline__ int xmesh_adam_variable(const long long* shape, int count, long long b) {
    return xmesh_block_owner(shape, 4, 3, count, b);
}
__device__ __forceinline__ long long xmesh_adam_at(const long long* shape, int i, long long k) {
    const long long cols = shape[4 * i + 1];
    return (k / cols) * shape[4 * i + 2] + k % cols;
}

// flags (count + 1 floats, zero before): flags[i] = 1 where gradient i holds a NaN or an infinity;
// flags[count] = 1 where anything does, the reported values[0 .. nvalues) included.
extern "C" __global__ void xmesh_adam_marks(const unsigned long long* table, const long long* shape, int count,
                                            const float* values, int nvalues, float* flags) {
    const int i = xmesh_adam_variable(shape, count, blockIdx.x);
    const float* grad = reinterpret_cast<const float*>(table[4 * i]);
    const long long first = (blockIdx.x - shape[4 * i + 3]) * (8LL * blockDim.x), size = shape[4 * i];
    bool bad = false;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        const long long k = first + e * blockDim.x + threadIdx.x;
        if (k < size) bad |= !isfinite(grad[xmesh_adam_at(shape, i, k)]);
    }
    if (__syncthreads_or(bad) && threadIdx.x == 0) {
        flags[i] = 1.0f;
        flags[count] = 1.0f;
    }
    if (blockIdx.x == 0 && threadIdx.x < nvalues && !isfinite(values[threadIdx.x])) flags[count] = 1.0f;
}

// Each variable's m, v and value updated in place (table rows: gradient, variable, m, v), unless
// flags[count] is set: adam.py's _cupy_update, operation for operation.
extern "C" __global__ void xmesh_adam_updates(const unsigned long long* table, const long long* shape, int count,
                                              const float* flags, const float* alpha, float keep1, float keep2,
                                              float eps) {
    if (flags[count] != 0.0f) return;
    const int i = xmesh_adam_variable(shape, count, blockIdx.x);
    const float* grad = reinterpret_cast<const float*>(table[4 * i]);
    float* var = reinterpret_cast<float*>(table[4 * i + 1]);
    float* m = reinterpret_cast<float*>(table[4 * i + 2]);
    float* v = reinterpret_cast<float*>(table[4 * i + 3]);
    const float a = *alpha;
    const long long first = (blockIdx.x - shape[4 * i + 3]) * (8LL * blockDim.x), size = shape[4 * i];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        const long long k = first + e * blockDim.x + threadIdx.x;
        if (k >= size) break;
        const float g = grad[xmesh_adam_at(shape, i, k)];
        const float mk = __fadd_rn(m[k], __fmul_rn(__fsub_rn(g, m[k]), keep1));
        const float vk = __fadd_rn(v[k], __fmul_rn(__fsub_rn(__fmul_rn(g, g), v[k]), keep2));
        var[k] = __fsub_rn(var[k], __fdiv_rn(__fmul_rn(mk, a), __fadd_rn(__fsqrt_rn(vk), eps)));
        m[k] = mk;
        v[k] = vk;
    }
}
"""


@functools.cache
def _kernels():
    import cupy

    module = cupy.RawModule(code=BLOCK_OWNER_SOURCE + _SOURCE, options=("-std=c++17",))
    return module.get_function("xmesh_adam_marks"), module.get_function("xmesh_adam_updates")


def _rows(gradient, name: str) -> tuple[int, int]:
    """(cols, stride) of a gradient read as rows of ``cols`` floats ``stride`` floats apart: a contiguous
    array is one row, a matrix's columns are its rows."""
    if gradient.flags.c_contiguous:
        return max(1, gradient.size), max(1, gradient.size)
    item = gradient.itemsize
    if gradient.ndim == 2 and gradient.strides[1] == item and gradient.strides[0] % item == 0:
        return gradient.shape[1], gradient.strides[0] // item
    raise ValueError(f"{name}: Adam's table takes a gradient whose rows are contiguous (strides {gradient.strides})")


class AdamTable:
    """The gradients of ``gradients`` (name -> float32 CuPy array) with their variables in ``variables``
    and their moments in ``state`` (made as TF's zero slots where missing), by device address, in the
    order of ``gradients``. Every array must stay where it is while the table is used."""

    def __init__(self, xp, gradients: Mapping, variables: Mapping, state: AdamState):
        self.xp, self.names, self.config = xp, list(gradients), state.config
        _kernels()  # compiled and loaded here, before any capture of their launches
        ensure_moments(xp, variables, self.names, state)
        firsts, blocks = first_blocks(variables[name].size for name in self.names)
        rows, shapes = [], []
        for name, first in zip(self.names, firsts, strict=True):
            arrays = (gradients[name], variables[name], state.m[name], state.v[name])
            if any(a.dtype != xp.float32 or a.shape != arrays[1].shape for a in arrays) or not all(
                a.flags.c_contiguous for a in arrays[1:]
            ):
                raise ValueError(f"{name}: Adam's table takes float32 arrays of the variable's shape, contiguous")
            rows.append([a.data.ptr for a in arrays])
            shapes.append((arrays[1].size, *_rows(arrays[0], name), first))
        self.table = xp.asarray(np.asarray(rows, dtype=np.uint64).ravel())
        self.shape = xp.asarray(np.asarray(shapes, dtype=np.int64).ravel())
        self.grid = (blocks,)

    def mark(self, values, flags) -> None:
        """Into ``flags`` (len(names) + 1 float32 zeros): the gradients holding a NaN or an infinity, and
        at the end whether anything does, the float32 ``values`` (at most 256) included."""
        count = len(self.names)
        args = (self.table, self.shape, np.int32(count), values, np.int32(values.size), flags)
        _kernels()[0](self.grid, (THREADS,), args)

    def update(self, flags, alpha) -> None:
        """Adam's updates with the factor ``alpha`` (a 1-element float32 device array, read at the launch),
        unless ``flags`` says something was not finite; the state does not advance."""
        c, one = self.config, np.float32(1)
        keep1, keep2 = one - np.float32(c.beta1), one - np.float32(c.beta2)
        args = (self.table, self.shape, np.int32(len(self.names)), flags, alpha, keep1, keep2, np.float32(c.epsilon))
        _kernels()[1](self.grid, (THREADS,), args)
