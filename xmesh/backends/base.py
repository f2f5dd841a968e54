"""What every backend provides. Subclasses fill in the array library; the model supplies the maths."""

from __future__ import annotations

from typing import Any

from ..ops import FastPaths


class Branch:
    """A second queue of work that starts after everything queued when it was made: work queued
    inside ``with branch:`` (as many blocks as needed) may run beside the work queued outside them,
    until ``branch.join()``, after which queued work waits for the branch. On the CPU (this class)
    the blocks simply run in place, so a branch changes no result, only what may overlap on a GPU."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None

    def join(self) -> None:
        """Make the work queued from now on wait for the branch's work."""


class Backend(FastPaths):
    """An array namespace plus the operations the network needs beyond the array API.

    Required: ``xp``, ``asarray``, ``to_numpy``, ``sparse``, ``spmm``, ``conv2d_same``,
    ``synchronize``. The fast paths (:class:`xmesh.ops.FastPaths`, methods ``op_<name>``) return None
    here; a backend overrides those it has a better kernel for, and the model runs its own array-API
    code where one returns None.
    """

    name = "abstract"
    xp: Any = None
    precision = "fp32"

    def asarray(self, array, dtype=None):
        raise NotImplementedError

    def to_numpy(self, array):
        raise NotImplementedError

    def sparse(self, csr_host):
        """A host ``scipy.sparse`` matrix -> this backend's sparse matrix (float32 CSR)."""
        raise NotImplementedError

    def spmm(self, sparse_matrix, dense):
        """``sparse_matrix @ dense`` for a dense (N, C) or batched (B, N, C) array."""
        raise NotImplementedError

    def conv2d_same(self, x, weight, bias, stride: int, relu: bool = True):
        """NHWC convolution with TensorFlow's 'SAME' padding, bias and optional ReLU."""
        raise NotImplementedError

    def synchronize(self) -> None:
        """Wait for queued device work (a no-op on the CPU)."""

    def load_kernels(self) -> None:
        """Have every kernel the reconstructions run loaded now rather than at first use."""

    def branch(self) -> Branch:
        """A second queue that starts after everything queued so far (see :class:`Branch`)."""
        return Branch()

    def copy_views_into(self, dst, host, views) -> None:
        """Copy views ``views`` of host images (B, V, H, W, C) into device images ``dst`` (B*V, H, W, C),
        sample-major, on the current queue; the other views of ``dst`` are left as they are."""
        num_views = host.shape[1]
        for v in views:
            dst[v::num_views] = self.asarray(host[:, v])

    def is_out_of_memory(self, exc: BaseException) -> bool:
        """Whether ``exc`` means the device (or host) ran out of memory."""
        return isinstance(exc, MemoryError)

    def memory_bytes(self) -> tuple[int, int] | None:
        """(free, total) bytes of the device's memory; None for host memory (this class)."""
        return None

    def held_bytes(self) -> int:
        """Bytes of device memory the backend's allocator holds (in use or cached); 0 here."""
        return 0

    def release_memory(self) -> None:
        """Give cached, unused device memory back (before a retry with a smaller batch)."""

    def copy_into(self, dst, src) -> None:
        """dst[...] = src (host or device data), src reshaped to dst's shape."""
        dst[...] = self.xp.reshape(self.asarray(src), dst.shape)

    def __repr__(self) -> str:  # pragma: no cover - cosmetic
        return f"<xmesh backend {self.name} ({self.precision})>"
