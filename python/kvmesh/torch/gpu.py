"""An engine's GPU cache: what kvmesh asks of CUDA for it, behind one seam,
and host staging, the way a node fills it when it cannot by CUDA IPC.

Host staging keeps a shared-memory PagedCache of the GPU cache's layout,
page-locked for the device (cudaHostRegister) while it is open. The node
writes hits there as into any shared-memory cache. Then the token rows it
wrote are copied to the engine's tensors: the slots given, no others (a
block the engine filled partly keeps the rest of its rows), K and V, as
non-blocking copies on a copy stream, which is waited for before anyone is
told the rows are there. kvmesh.inject's CUDAPagedCache (staging "auto" or
"always") and the vLLM connector stage this way.

The seam: every CUDA call goes through the object `cuda` (a CUDA): is a
tensor on a GPU, its IPC export, page-locking, the copy stream. Nothing
else here knows. A machine without a GPU cannot make a CUDA tensor, so its
tests replace `cuda` with a stand-in that takes CPU tensors for device
tensors (python/tests/test_cuda_staging.py); the copies are torch's
copy_ either way.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Sequence

import numpy as np

from ..errors import KvmeshError, UsageError
from ..inject import BLOCK_HND, BLOCK_NHD, IPC_HANDLE_BYTES, NHD, ORDERS, CacheLayout, PagedCache, _canonical

__all__ = ["CUDA", "cuda", "HostStaging", "ipc_mem_handle", "slot_runs", "copy_rows"]

log = logging.getLogger("kvmesh.gpu")


class CUDA:
    """The CUDA calls of kvmesh, through torch: the one seam tests replace
    (see the module doc). Methods raise what torch raises unless they say
    otherwise."""

    def is_device(self, t) -> bool:
        """Whether t is a tensor in GPU memory."""
        return bool(getattr(t, "is_cuda", False))

    def export(self, t) -> "tuple[int, bytes, int]":
        """t's storage by CUDA IPC, from torch's storage sharing: (device,
        the allocation's 64-byte cudaIpcMemHandle_t (ipc_mem_handle), the
        storage's byte offset in that allocation). Raises where the
        allocation cannot be exported (expandable segments, for one)."""
        storage = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()._untyped()
        device, handle, _size, offset = storage._share_cuda_()[:4]
        return int(device), ipc_mem_handle(bytes(handle)), int(offset)

    def pin(self, ptr: int, nbytes: int) -> bool:
        """Page-locks nbytes of host memory at ptr for the device
        (cudaHostRegister); False, doing nothing, without CUDA. A CUDA
        error is a KvmeshError."""
        import torch
        if not torch.cuda.is_available():
            return False
        err = _code(torch.cuda.cudart().cudaHostRegister(ptr, nbytes, 0))
        if err:
            _clear_last_error()
            raise KvmeshError(f"cudaHostRegister of {nbytes} bytes: CUDA error {err}")
        return True

    def unpin(self, ptr: int) -> None:
        """Undoes pin (cudaHostUnregister); a CUDA error is a KvmeshError."""
        import torch
        err = _code(torch.cuda.cudart().cudaHostUnregister(ptr))
        if err:
            _clear_last_error()
            raise KvmeshError(f"cudaHostUnregister: CUDA error {err}")

    def stream(self, t):
        """A copy stream on t's device; None for a tensor in host memory
        (its copies then run in the caller's thread)."""
        import torch
        return torch.cuda.Stream(device=t.device) if self.is_device(t) else None

    def copying(self, stream):
        """A context in which copies go to stream, after what the caller's
        current stream has queued (which may still read or write the
        rows)."""
        if stream is None:
            return contextlib.nullcontext()
        import torch
        stream.wait_stream(torch.cuda.current_stream(stream.device))
        return torch.cuda.stream(stream)

    def wait(self, stream) -> None:
        """Returns once every copy queued on stream is done."""
        if stream is not None:
            stream.synchronize()


# torch's shareable handles: before torch 2.2 the bare cudaIpcMemHandle_t;
# since, a version byte, a type byte, then the type's payload ('c': the
# cudaIpcMemHandle_t of a cudaMalloc block; 'e': an expandable segment's
# memory handles, which cuIpcOpenMemHandle cannot open).
_SHAREABLE_CUDA_MALLOC = ord("c")
_SHAREABLE_EXPANDABLE_SEGMENT = ord("e")


def ipc_mem_handle(shareable: bytes) -> bytes:
    """The 64-byte cudaIpcMemHandle_t in the handle torch's _share_cuda_
    gives (bare, or in its versioned form). A handle of another kind
    raises ValueError (export's callers then stage or refuse)."""
    n = IPC_HANDLE_BYTES
    if len(shareable) == n:
        return shareable
    if len(shareable) >= 2 and shareable[1] == _SHAREABLE_EXPANDABLE_SEGMENT:
        raise ValueError("the tensor is in an expandable segment (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), "
                         "which CUDA IPC handles cannot name")
    if len(shareable) == n + 2 and shareable[1] == _SHAREABLE_CUDA_MALLOC:
        return shareable[2:]
    raise ValueError(f"torch gave a {len(shareable)}-byte shareable handle of a kind kvmesh does not know "
                     f"(type byte {shareable[1:2]!r})")


def _clear_last_error() -> None:
    """Resets this thread's CUDA runtime error after a failed call. torch
    checks its kernel launches with cudaGetLastError, so the error of a
    cudaHostRegister that failed (and was handled: the staging stays
    unpinned) would otherwise fail torch's next launch in this thread.
    torch binds no cudaGetLastError; the runtime torch loaded has it (one
    instance per process: dlopen finds the loaded library by its name)."""
    import ctypes
    names = [None]
    try:
        import torch
        names.append(f"libcudart.so.{torch.version.cuda.split('.')[0]}")
    except Exception:  # noqa: BLE001 (no CUDA build of torch: nothing to clear)
        pass
    for name in names:
        try:
            ctypes.CDLL(name).cudaGetLastError()
            return
        except (OSError, AttributeError):
            continue
    log.warning("kvmesh: could not reset the CUDA runtime's last error after a failed call; "
                "torch's next kernel launch in this thread may report it")


def _code(err) -> int:
    """A cudaError_t from torch's cudart binding as an int (0: success)."""
    return int(getattr(err, "value", err))


cuda = CUDA()


def slot_runs(slots) -> "list[tuple[int, int]]":
    """The distinct slots >= 0 of slots as sorted runs of consecutive slots,
    [start, stop) each: one copy per run and K or V in NHD (copy_rows)."""
    a = np.unique(np.asarray(slots, dtype=np.int64).ravel())
    a = a[a >= 0]
    if a.size == 0:
        return []
    cut = np.flatnonzero(np.diff(a) != 1) + 1
    starts = np.concatenate(([a[0]], a[cut]))
    stops = np.concatenate((a[cut - 1] + 1, [a[-1] + 1]))
    return [(int(s), int(e)) for s, e in zip(starts, stops)]


def copy_rows(dst, src, runs: "Sequence[tuple[int, int]]", order: int, non_blocking: bool = False) -> None:
    """Copies the token rows of runs (slot_runs) of one layer, K and V, from
    src to dst: tensors of one CacheLayout.shape (of that order), dst
    contiguous in NHD (strided ones are copied right in the other orders:
    vLLM's FlashInfer HND cache is BLOCK_NHD-shaped). In NHD a run is one piece of K and one of V; in the other
    orders it is cut at block boundaries, whole blocks staying one piece
    (K and V in one where the block holds both) and a part of a block one
    strided copy."""
    if tuple(dst.shape) != tuple(src.shape) or dst.dim() != 5:
        raise UsageError(f"copy_rows: shapes {tuple(dst.shape)} and {tuple(src.shape)}: want one CacheLayout.shape")
    if order not in ORDERS:
        raise UsageError(f"copy_rows: cache order {order!r}: want one of kvmesh.inject.ORDERS")
    if order == NHD:
        d, s = dst.view(2, -1, *dst.shape[3:]), src.reshape(2, -1, *src.shape[3:])
        for a, b in runs:
            for kv in (0, 1):
                d[kv, a:b].copy_(s[kv, a:b], non_blocking=non_blocking)
        return
    cd, cs = _canonical(dst, order), _canonical(src, order)  # [2, blocks, block, heads, dim] views
    bs = cd.shape[2]
    for a, b in runs:
        while a < b:
            blk, o = divmod(a, bs)
            if o == 0 and b - a >= bs:  # whole blocks
                n = (b - a) // bs
                if order in (BLOCK_NHD, BLOCK_HND):
                    dst[blk:blk + n].copy_(src[blk:blk + n], non_blocking=non_blocking)
                else:
                    for kv in (0, 1):
                        dst[kv, blk:blk + n].copy_(src[kv, blk:blk + n], non_blocking=non_blocking)
                a += n * bs
            else:  # part of one block: its rows in every head, K and V
                e = min(b, (blk + 1) * bs) - blk * bs
                cd[:, blk, o:e].copy_(cs[:, blk, o:e], non_blocking=non_blocking)
                a = blk * bs + e


class HostStaging:
    """A shared-memory PagedCache shaped like tensors (the engine's cache,
    one tensor per layer, of layout's CacheLayout.shape and dtype),
    page-locked for their device while open (pinned says whether it is:
    without CUDA, or if cudaHostRegister fails, the copies are synchronous
    and still exact), and the copy of written rows from it to tensors.

    Register `cache` with the node; after the node reports layer l
    written, copy(l, runs) then wait() puts those rows in tensors[l]."""

    def __init__(self, tensors, layout: CacheLayout):
        from . import cache_tensor
        self.tensors = list(tensors)
        devices = sorted({str(t.device) for t in self.tensors})
        if len(devices) != 1:
            raise UsageError(f"host staging: layers on devices {devices}: want one GPU")
        self.layout = layout
        self._cuda = cuda  # the seam as it was when this staging was made
        self.cache = PagedCache(len(self.tensors), layout, name="kvmesh-staging")
        self.host = [cache_tensor(self.cache, l) for l in range(len(self.tensors))]
        self._base = self.cache.layer(0).ctypes.data - self.cache.offsets[0]
        self.pinned, self.closed = False, False
        try:
            self.pinned = self._cuda.pin(self._base, self.cache.size)
        except Exception as e:  # noqa: BLE001 (a torch without the binding, a memlock limit: copies stay exact)
            log.warning("kvmesh: host staging of %d bytes is not page-locked (its copies are synchronous): %s",
                        self.cache.size, e)
        try:
            self._stream = self._cuda.stream(self.tensors[0])
        except BaseException:
            self.close()
            raise

    def copy(self, layer: int, runs: "Sequence[tuple[int, int]]") -> None:
        """Queues the copy of runs (slot_runs) of layer from the staging to
        tensors[layer]; a failure is a KvmeshError."""
        if self.closed:
            raise UsageError("host staging: closed")
        try:
            with self._cuda.copying(self._stream):
                copy_rows(self.tensors[layer], self.host[layer], runs, self.layout.order, non_blocking=self.pinned)
        except KvmeshError:
            raise
        except Exception as e:  # noqa: BLE001 (torch's CUDA errors are RuntimeErrors and more)
            raise KvmeshError(f"host staging: copying layer {layer} to the device: {e}") from e

    def wait(self) -> None:
        """Returns once every queued copy is done; a failure is a
        KvmeshError."""
        try:
            self._cuda.wait(self._stream)
        except KvmeshError:
            raise
        except Exception as e:  # noqa: BLE001
            raise KvmeshError(f"host staging: waiting for the copies to the device: {e}") from e

    def close(self) -> None:
        """Unpins and closes the staging (unregister it first). The
        engine's tensors stay the engine's."""
        if self.closed:
            return
        self.closed, self.host = True, []
        try:
            if self.pinned:
                self.pinned = False
                self._cuda.unpin(self._base)
        finally:
            self.cache.close()
