"""The CNN's L2 regulariser (:func:`xmesh.train.regularisers.l2_penalty`) over a stage's 18 kernels in
two launches on CuPy, for the replayed step (:mod:`xmesh.train.graph_step`), where the array-API code
makes four launches a kernel.

``L2Table`` holds the device addresses of the variables (the trainer's arrays, which stay where they
are), made once outside any capture. :meth:`L2Table.penalty` writes every gradient ``factor * v`` (one
rounding, as the array-API code's) into one buffer, of which the gradients are views, and each block's
sum of squares; a second launch adds the blocks' sums in a fixed order. The sum of squares is the
array-API code's but for the order of its float32 additions.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping

import numpy as np

from .adam_cupy import BLOCK_OWNER_SOURCE, THREADS, first_blocks

TOTAL_THREADS = 1024

_SOURCE = r"""
// The block's threads' `sum`s added in a fixed order (warp shuffles, then the warps' sums): thread 0's
// return value (the others' are partial).
__device__ __forceinline__ float xmesh_block_sum(float sum) {
    __shared__ float warps[32];
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_down_sync(0xffffffffu, sum, o);
    if ((threadIdx.x & 31) == 0) warps[threadIdx.x >> 5] = sum;
    __syncthreads();
    if (threadIdx.x < 32) {
        sum = threadIdx.x < (blockDim.x >> 5) ? warps[threadIdx.x] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_down_sync(0xffffffffu, sum, o);
    }
    return sum;
}

// rows[3 i ..] = (size, offset in out, first block) of variable i at table[i]. Block b scales its
// variable's 8 * blockDim.x floats (adam_cupy.CHUNK) into out and writes their sum of squares to partial[b].
extern "C" __global__ void xmesh_l2_blocks(const unsigned long long* table, const long long* rows, int count,
                                           float factor, float* __restrict__ out, float* __restrict__ partial) {
    const int i = xmesh_block_owner(rows, 3, 2, count, blockIdx.x);
    const float* v = reinterpret_cast<const float*>(table[i]);
    const long long size = rows[3 * i], first = (blockIdx.x - rows[3 * i + 2]) * (8LL * blockDim.x);
    float* dst = out + rows[3 * i + 1];
    float sum = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        const long long k = first + e * blockDim.x + threadIdx.x;
        if (k < size) {
            const float x = v[k];
            dst[k] = __fmul_rn(factor, x);
            sum += __fmul_rn(x, x);
        }
    }
    sum = xmesh_block_sum(sum);
    if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

// One block: loss[0] = (the sum of partial[0 .. n)) * half, in a fixed order.
extern "C" __global__ void xmesh_l2_total(const float* __restrict__ partial, long long n, float half,
                                          float* __restrict__ loss) {
    float sum = 0.0f;
    for (long long k = threadIdx.x; k < n; k += blockDim.x) sum += partial[k];
    sum = xmesh_block_sum(sum);
    if (threadIdx.x == 0) loss[0] = __fmul_rn(sum, half);
}
"""


@functools.cache
def _kernels():
    import cupy

    module = cupy.RawModule(code=BLOCK_OWNER_SOURCE + _SOURCE, options=("-std=c++17",))
    return module.get_function("xmesh_l2_blocks"), module.get_function("xmesh_l2_total")


class L2Table:
    """The float32 CuPy arrays of ``variables`` (name -> array, contiguous, staying where they are) by
    device address, for :meth:`penalty`."""

    def __init__(self, xp, variables: Mapping):
        self.xp, self.names = xp, list(variables)
        _kernels()  # compiled and loaded here, before any capture of their launches
        self.shapes = [tuple(variables[n].shape) for n in self.names]
        firsts, blocks = first_blocks(variables[name].size for name in self.names)
        rows, offset = [], 0
        self.offsets = []
        for name, first in zip(self.names, firsts, strict=True):
            value = variables[name]
            if value.dtype != xp.float32 or not value.flags.c_contiguous:
                raise ValueError(f"{name}: the L2 table takes contiguous float32 arrays")
            rows.append((value.size, offset, first))
            self.offsets.append(offset)
            offset += -(-value.size // 64) * 64  # each gradient on a 256-byte boundary
        self.table = xp.asarray(np.asarray([variables[n].data.ptr for n in self.names], dtype=np.uint64))
        self.rows = xp.asarray(np.asarray(rows, dtype=np.int64).ravel())
        self.size, self.blocks = offset, blocks

    def penalty(self, factor: float):
        """``factor * sum(l2_loss(v))`` over the variables, as a 0-d float32 array, and each variable's
        gradient ``factor * v`` (views of one new buffer)."""
        xp = self.xp
        out = xp.empty((self.size,), dtype=xp.float32)
        partial = xp.empty((self.blocks,), dtype=xp.float32)
        loss = xp.empty((), dtype=xp.float32)
        scale = np.float32(factor)
        blocks, total = _kernels()
        blocks((self.blocks,), (THREADS,), (self.table, self.rows, np.int32(len(self.names)), scale, out, partial))
        total((1,), (TOTAL_THREADS,), (partial, np.int64(self.blocks), np.float32(factor / 2), loss))
        grads = {
            name: xp.reshape(out[o : o + math.prod(shape)], shape)
            for name, o, shape in zip(self.names, self.offsets, self.shapes, strict=True)
        }
        return loss, grads
