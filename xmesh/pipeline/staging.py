"""Upload host batches to the GPU through pinned buffers on a side stream, and copy results back
into pinned host memory.

A batch's arrays (images, padded ground truth; or a list of equal arrays, stacked straight into
the buffer) are copied into the pinned host buffers of one of two slots, used in turn, and uploaded
on a non-blocking stream, so batch k+1 goes up while batch k computes. All ordering is by CUDA
events: a slot's pinned buffers are refilled only after its last upload finished (``copied``); its
device buffers are overwritten only after the compute that read them (``consumed``, recorded by
:meth:`Stager.release`); the compute waits for the upload (:meth:`Stager.wait`). Buffers grow to
the largest batch seen and are reused.

A new device buffer comes from CuPy's pool, which hands out blocks freed on the compute stream as
soon as they are freed: work queued there may still be using the block. So before its first upload
the side stream waits for everything queued on the compute stream so far.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


class _Slot:
    def __init__(self):
        self.pinned: dict[str, np.ndarray] = {}
        self.device: dict = {}
        self.started = None
        self.copied = None
        self.consumed = None


class Stager:
    SLOTS = 2

    def __init__(self, cupy):
        self.cupy = cupy
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.slots = [_Slot() for _ in range(self.SLOTS)]
        self.turn = 0

    def _buffers(self, slot: _Slot, name: str, shape: tuple, dtype):
        """Pinned and device buffers of at least ``shape``'s size and ``dtype``, as views of that shape."""
        import cupyx

        size = math.prod(shape)
        have = slot.pinned.get(name)
        if have is None or have.dtype != dtype or have.size < size:
            if have is not None:  # the old buffers may still be read or written: let that finish first
                self.cupy.cuda.Device().synchronize()
            slot.pinned[name] = cupyx.empty_pinned((size,), dtype=dtype)
            slot.device[name] = self.cupy.empty((size,), dtype=dtype)
            self.stream.wait_event(self.cupy.cuda.get_current_stream().record())  # see the module docstring
        return slot.pinned[name][:size].reshape(shape), slot.device[name][:size].reshape(shape)

    def stage(self, arrays: dict[str, np.ndarray | Sequence[np.ndarray]]) -> tuple[int, dict]:
        """Start uploading ``arrays`` (a list of equal arrays is uploaded as their stack); returns
        (slot number, {name: device array of the same shape})."""
        number = self.turn % self.SLOTS
        self.turn += 1
        slot = self.slots[number]
        if slot.copied is not None:
            slot.copied.synchronize()  # the pinned buffers' previous upload is done
        if slot.consumed is not None:
            self.stream.wait_event(slot.consumed)  # the device buffers are no longer read
        slot.started = self.stream.record()
        out = {}
        for name, array in arrays.items():
            if isinstance(array, np.ndarray):
                host, device = self._buffers(slot, name, array.shape, array.dtype)
                np.copyto(host, array)
            else:
                host, device = self._buffers(slot, name, (len(array),) + array[0].shape, array[0].dtype)
                np.stack(array, out=host)
            device.set(host, stream=self.stream)
            out[name] = device
        slot.copied = self.stream.record()
        return number, out

    def wait(self, number: int) -> None:
        """Make the current (compute) stream wait for the upload into slot ``number``."""
        self.cupy.cuda.get_current_stream().wait_event(self.slots[number].copied)

    def release(self, number: int, event=None) -> None:
        """Call once the compute reading slot ``number`` has been queued: ``event`` marks its end
        (default: an event recorded on the current stream now)."""
        self.slots[number].consumed = event if event is not None else self.cupy.cuda.get_current_stream().record()

    def upload_seconds(self, number: int) -> float:
        """GPU time of slot ``number``'s last upload (its events must have completed)."""
        slot = self.slots[number]
        return self.cupy.cuda.get_elapsed_time(slot.started, slot.copied) / 1000.0

    def close(self) -> None:
        self.stream.synchronize()


def copy_to_host(cupy, device_array, pinned: np.ndarray) -> None:
    """Queue an asynchronous copy of the contiguous ``device_array`` into the pinned host array
    ``pinned`` (of its size) on the current stream; ``pinned`` holds it once that stream gets past
    the copy (an event recorded after it)."""
    stream = cupy.cuda.get_current_stream()
    cupy.cuda.runtime.memcpyAsync(
        pinned.ctypes.data, device_array.data.ptr, device_array.nbytes, cupy.cuda.runtime.memcpyDeviceToHost, stream.ptr
    )


def pinned_buffer(buffers: dict, name: str, shape: tuple, dtype) -> np.ndarray:
    """A pinned host array of ``shape`` and ``dtype``: a view of ``buffers[name]``, which is replaced by a
    larger one when it is too small (so a set of buffers grows to the largest batch and is reused)."""
    import cupyx

    size = math.prod(shape)
    have = buffers.get(name)
    if have is None or have.dtype != dtype or have.size < size:
        buffers[name] = have = cupyx.empty_pinned((size,), dtype=dtype)
    return have[:size].reshape(shape)
