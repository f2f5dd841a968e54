"""The Hopper GEMM (``kernels/wgmma_gemm.cu``): warpgroup MMAs on compute capability 9.0 (H100, H200).

``HopperGemm(device)`` compiles the kernels for ``sm_90a`` (through NVRTC; wgmma exists only in that
target) and runs ``C = act(A B + bias)`` with B prepared once per weight by :meth:`HopperGemm.prepare`:
transposed to K-major rows, split into TF32 big and small parts (3xTF32) or rounded to TF32 (one
pass), zero-padded to whole 128 x 32 tiles. :class:`~xmesh.backends.cupy_backend.CupyBackend` sends
large products here and the rest (and every product on other GPUs) to ``kernels/tc_gemm.cu``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .cuda_kernels import get_arch_function

SOURCE = "wgmma_gemm.cu"
ARCH = "sm_90a"
#: Tile of C per block (rows, columns), K slice, ring depth and threads (kernels/wgmma_gemm.cu, WG_*).
BM, BN, BK, STAGES, THREADS = 128, 128, 32, 4, 256
A_STRIDE = BK + 4
#: CUfunction_attribute CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
MAX_DYNAMIC_SHARED_SIZE_BYTES = 8


def supported(device) -> bool:
    """Whether ``device`` (a ``cupy.cuda.Device``) runs sm_90a code: compute capability exactly 9.0."""
    return str(device.compute_capability) == "90"


def smem_bytes(passes: int) -> int:
    """Dynamic shared memory of one block: the ring of (B big [, B small], A) slices plus alignment slack."""
    parts = 2 if passes == 3 else 1
    return STAGES * (parts * BN * BK * 4 + BM * A_STRIDE * 4) + 1024


@dataclass(frozen=True)
class PreparedWeight:
    """B (k x n) in the Hopper kernel's form: ``big`` and ``small`` (None for one pass) of shape
    (ceil(n/128)*128, ceil(k/32)*32), row j holding column j of B."""

    big: object
    small: object
    k: int
    n: int
    passes: int


class HopperGemm:
    def __init__(self, cupy):
        self.cupy = cupy
        self._kernels: dict = {}
        self._split = get_arch_function(SOURCE, "wg_split_weight", ARCH, ("-std=c++17",))

    def _kernel(self, passes: int, vec: bool):
        key = (passes, vec)
        kernel = self._kernels.get(key)
        if kernel is None:
            from cupy_backends.cuda.api import driver

            kernel = get_arch_function(SOURCE, f"wg_gemm_{passes}x_{'v' if vec else 's'}", ARCH, ("-std=c++17",))
            # > 48 KB of dynamic shared memory needs the opt-in
            driver.funcSetAttribute(kernel.ptr, MAX_DYNAMIC_SHARED_SIZE_BYTES, smem_bytes(passes))
            self._kernels[key] = kernel
        return kernel

    def prepare(self, b, passes: int) -> PreparedWeight:
        """Transpose, split and pad a float32 (k, n) matrix with unit column stride."""
        cp = self.cupy
        k, n = b.shape
        kp, np_ = -(-k // BK) * BK, -(-n // BN) * BN
        big = cp.empty((np_, kp), dtype=cp.float32)
        small = cp.empty((np_, kp), dtype=cp.float32) if passes == 3 else None
        total = np_ * kp
        self._split((min(-(-total // 256), 4096),), (256,),
                    (b, np.int64(b.strides[0] // 4), np.int32(k), np.int32(n), np.int32(kp), np.int32(np_),
                     np.int32(passes), big, big if small is None else small))
        return PreparedWeight(big, small, k, n, passes)

    def __call__(self, a, weight: PreparedWeight, out, bias=None, relu: bool = False):
        """out (m, n) = act(a (m, k) @ B + bias); ``a`` and ``out`` row-strided views with unit column stride."""
        m, k = a.shape
        lda, ldc = a.strides[0] // 4, out.strides[0] // 4
        vec = lda % 4 == 0 and a.data.ptr % 16 == 0
        tiles = -(-m // BM) * (weight.big.shape[0] // BN)
        small = weight.big if weight.small is None else weight.small
        self._kernel(weight.passes, vec)(
            (tiles,), (THREADS,),
            (a, np.int64(lda), weight.big, small, np.int64(weight.big.shape[1]), out, np.int64(ldc), np.int32(m),
             np.int32(weight.n), np.int32(k), np.uint64(0) if bias is None else bias, np.int32(bool(relu))),
            shared_mem=smem_bytes(weight.passes))
        return out
