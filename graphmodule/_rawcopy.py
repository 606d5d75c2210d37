"""One input's copy through the CUDA driver: what ``copy_`` does for it, at less host cost.

A replay copies the call's input into the graph's buffer. For one dense tensor, ``copy_``
spends most of its host time before the copy itself (the dispatcher, a ``TensorIterator``,
the checks of a general copy), then enqueues one ``cudaMemcpyAsync``. Where the source is
exactly the buffer's kind of tensor, :func:`copier` makes that copy with the driver's
``cuMemcpyDtoDAsync`` on the caller's current stream, which is all ``copy_`` would have
enqueued (H100: 5.5 µs of host time against 9 µs; ``scripts/copy_probe.py``).

The driver copy is taken only where it writes what ``copy_`` writes, and ``copy_`` is used
otherwise: the source a plain ``torch.Tensor`` (no subclass, no functorch wrapper: those
have no plain data pointer), contiguous like the buffer, without a negative bit (a real
view of a conjugated complex tensor, ``z.conj().imag``), not overlapping the buffer, with
the buffer's device current (the stream must be the current context's); and any error the
driver reports (no context yet in a new thread) falls back to ``copy_`` too. Shape, dtype
and device were checked before (``InputSpec.match``).

What differs from ``copy_``: the buffer's version counter does not move (graphmodule reads
it only while capturing; a graph used as a layer, which autograd checks, copies with
``copy_``), and the copy is not an ``aten::copy_`` in the torch profiler.
``GRAPHMODULE_TORCH_COPY=1`` turns it off.
"""

from __future__ import annotations

import ctypes
import os
from typing import Callable

import torch

__all__ = ["copier"]

Tensor = torch.Tensor
_driver: tuple | None = None
_loaded = False


def _load() -> tuple | None:
    """The driver's copy, the current raw stream and device of torch, or None."""
    global _driver, _loaded
    if not _loaded:
        _loaded = True
        try:
            memcpy = ctypes.CDLL("libcuda.so.1").cuMemcpyDtoDAsync_v2
            memcpy.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p]
            memcpy.restype = ctypes.c_int
            _driver = (memcpy, torch._C._cuda_getCurrentRawStream, torch._C._cuda_getDevice)
        except (OSError, AttributeError):  # no driver library, or a torch without these
            _driver = None
    return _driver


def copier(buffer: Tensor) -> Callable[[Tensor], bool] | None:
    """A function copying a source into ``buffer`` through the driver, answering whether it
    did (else the caller uses ``copy_``); None where ``buffer`` is not such a tensor.

    Example (on a GPU)::

        >>> buf = torch.zeros(4, device="cuda")
        >>> copy = copier(buf)
        >>> copy(torch.ones(4, device="cuda")) or buf.copy_(torch.ones(4, device="cuda"))
        True
    """
    if (
        os.environ.get("GRAPHMODULE_TORCH_COPY") == "1"
        or type(buffer) is not Tensor
        or buffer.device.type != "cuda"
        or not buffer.is_contiguous()
        or buffer.is_complex()
        or buffer.is_neg()
        or buffer.numel() == 0
    ):
        return None
    driver = _load()
    if driver is None:
        return None
    memcpy, raw_stream, current_device = driver
    dst, n, index = buffer.data_ptr(), buffer.numel() * buffer.element_size(), buffer.device.index
    end = dst + n
    contiguous, is_neg, data_ptr = Tensor.is_contiguous, Tensor.is_neg, Tensor.data_ptr

    def copy(source: Tensor) -> bool:
        if type(source) is not Tensor or not contiguous(source) or is_neg(source):
            return False
        try:
            src = data_ptr(source)
        except RuntimeError:  # no storage (a wrapper tensor)
            return False
        if src < end and dst < src + n or current_device() != index:
            return False
        return memcpy(dst, src, n, raw_stream(index)) == 0

    return copy
