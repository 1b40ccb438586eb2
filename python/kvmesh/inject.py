"""A paged KV cache in shared memory that the local kvmesh node fills
(the Injector service, api/inject.proto).

The engine allocates its cache in a memfd (or a file under /dev/shm),
registers it once with the node on its own machine, and then asks that node
to inject stored chunks at positions of a new prompt: the node fetches each
chunk's best entry (its own tier first, then a replica), rotates the
pre-RoPE keys to the target positions and writes post-RoPE K and V into the
given slots, layer by layer, and answers EXACT, APPROXIMATE or MISS per
chunk. The layout is one of cudakern's (pagedkv.Order), per layer:
[2][num_blocks][block_size][kv_heads][head_dim] (NHD, vLLM FlashAttention's),
[2][num_blocks][kv_heads][block_size][head_dim] (HND), or with K and V inside
each block, [num_blocks][2][block_size][kv_heads][head_dim] (BLOCK_NHD:
FlashInfer's NHD, vLLM's FlashInfer and Triton backends) and
[num_blocks][2][kv_heads][block_size][head_dim] (BLOCK_HND: FlashInfer's HND).

A cache in GPU memory (PagedCache.cuda over torch CUDA tensors) registers
by CUDA IPC, or through pinned host staging where IPC is impossible
(CUDAPagedCache, StagedInjector, kvmesh.torch.gpu).
"""

from __future__ import annotations

import dataclasses
import logging
import mmap
import os
from typing import Callable, Sequence

import grpc
import numpy as np

from ._pb import inject_pb2, inject_pb2_grpc
from .entry import _np_dtype
from .errors import InvalidArgument, KvmeshError, PermissionDenied, UsageError
from .keys import ID, Context, DType, Key, _is_int, tokens_array, want_context, want_id

__all__ = ["NHD", "HND", "BLOCK_NHD", "BLOCK_HND", "ORDERS", "ALIGNMENT", "CacheLayout", "PagedCache", "CUDAPagedCache",
           "InjectChunk", "InjectResult", "Injector", "StagedInjector", "register_cache", "send_cache_file", "cuda_ipc",
           "STAGING", "CUDA_IPC", "HOST_STAGING"]

log = logging.getLogger("kvmesh.inject")

NHD, HND, BLOCK_NHD, BLOCK_HND = 1, 2, 3, 4  # pagedkv.Order's numbers
ORDERS = (NHD, HND, BLOCK_NHD, BLOCK_HND)
# Each order's axes as positions of (kv, block, slot in block, head) in
# its shape, head_dim last: what canonical() permutes by.
_AXES = {NHD: (0, 1, 2, 3), HND: (0, 1, 3, 2), BLOCK_NHD: (1, 0, 2, 3), BLOCK_HND: (1, 0, 3, 2)}


def _canonical(layer, order: int):
    """CacheLayout.canonical without the shape check (a valid order)."""
    perm = (*_AXES[order], 4)
    return layer.permute(*perm) if hasattr(layer, "permute") else layer.transpose(perm)


ALIGNMENT = 4096  # every layer starts on a page (the node needs 64 bytes)


@dataclasses.dataclass(frozen=True)
class CacheLayout:
    """One layer of the cache (pagedkv.CacheLayout)."""

    num_blocks: int
    block_size: int
    kv_heads: int
    head_dim: int
    dtype: DType = DType.F32
    order: int = NHD

    def __post_init__(self):
        for name in ("num_blocks", "block_size", "kv_heads", "head_dim"):
            v = getattr(self, name)
            if not _is_int(v) or v <= 0:
                raise UsageError(f"CacheLayout.{name} {v!r}: want a positive int")
        object.__setattr__(self, "dtype", DType.parse(self.dtype))
        if not _is_int(self.order) or self.order not in ORDERS:
            raise UsageError(f"CacheLayout.order {self.order!r}: want kvmesh.inject.NHD, HND, BLOCK_NHD or BLOCK_HND")

    @property
    def slots(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def layer_bytes(self) -> int:
        return 2 * self.slots * self.kv_heads * self.head_dim * DType(self.dtype).size

    @property
    def shape(self) -> tuple:
        """One layer's array shape in this order (head_dim last)."""
        dims = (2, self.num_blocks, self.block_size, self.kv_heads)
        ax = _AXES[self.order]
        out = [0] * 4
        for i, a in enumerate(ax):
            out[a] = dims[i]
        return (*out, self.head_dim)

    def canonical(self, layer):
        """A view of one layer (a numpy array or torch tensor of this
        layout's shape) with its axes as (kv, block, slot in block, head,
        head_dim), whatever the order: canonical(x)[kv, b, o, h] is the head
        vector of slot b*block_size+o in every layout. It copies nothing."""
        if tuple(layer.shape) != self.shape:
            raise UsageError(f"CacheLayout.canonical: layer of shape {tuple(layer.shape)}, "
                             f"the layout's is {self.shape}")
        return _canonical(layer, self.order)

    def proto(self) -> inject_pb2.CacheLayout:
        """The layout as the Injector service's message."""
        return inject_pb2.CacheLayout(order=self.order, num_blocks=self.num_blocks, block_size=self.block_size,
                                      kv_heads=self.kv_heads, head_dim=self.head_dim, dtype=int(self.dtype))


class PagedCache:
    """A paged KV cache of `layers` layers in one shared-memory file, each
    layer page-aligned. layer(l) is a writable numpy view of layer l (shape
    CacheLayout.shape; bf16 as uint16); kvmesh.torch.cache_tensor gives a
    torch tensor over the same memory. By default the file is a memfd, so
    nothing is left behind; shm_dir puts a named file there instead (on
    tmpfs or hugetlbfs). register_cache hands the node the open file
    descriptor (fileno()), never a path: the node maps only memory its
    caller holds. path says what the file is, for messages."""

    def __init__(self, layers: int, layout: CacheLayout, shm_dir: "str | None" = None, name: str = "kvmesh-cache"):
        if not _is_int(layers) or layers <= 0:
            raise UsageError(f"PagedCache: layers {layers!r}: want a positive int (the model's layers)")
        if not isinstance(layout, CacheLayout):
            raise UsageError(f"PagedCache: want a kvmesh.inject.CacheLayout, got {type(layout).__name__}")
        self.layers, self.layout = layers, layout
        per = -(-layout.layer_bytes // ALIGNMENT) * ALIGNMENT
        self.offsets = [l * per for l in range(layers)]
        self.size = per * layers
        self._remove = None
        if shm_dir is None:
            self._fd = os.memfd_create(name, os.MFD_CLOEXEC)
            self.path = f"memfd:{name}"
        else:
            import tempfile
            self._fd, self.path = tempfile.mkstemp(prefix=name + "-", dir=shm_dir)
            self._remove = self.path
        os.ftruncate(self._fd, self.size)
        self._mm = mmap.mmap(self._fd, self.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        nd = _np_dtype(DType(layout.dtype))
        n = layout.layer_bytes // nd.itemsize
        self._layers = [np.frombuffer(self._mm, dtype=nd, count=n, offset=o).reshape(layout.shape)
                        for o in self.offsets]

    def fileno(self) -> int:
        """The shared-memory file's descriptor (what register_cache hands
        the node)."""
        return self._fd

    def layer(self, l: int) -> np.ndarray:
        """Layer l as a writable numpy array over the shared memory."""
        return self._layers[l]

    def close(self) -> None:
        """Unmaps the cache (unregister it first) and closes the file."""
        self._layers = []
        try:
            self._mm.close()
        except BufferError:
            pass  # views (arrays, tensors) are still alive: unmapped when the last goes
        os.close(self._fd)
        if self._remove:
            os.unlink(self._remove)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @staticmethod
    def cuda(tensors, layout: CacheLayout, staging: str = "auto") -> "CUDAPagedCache":
        """A PagedCache over torch CUDA tensors (one per layer) instead of
        shared memory, registered by CUDA IPC or, where that is impossible,
        through pinned host staging (staging "auto", "never" or "always"):
        see CUDAPagedCache."""
        return CUDAPagedCache(tensors, layout, staging)


# CUDA IPC handles (cudaIpcMemHandle_t) are 64 bytes; the node wants every
# layer on a 64-byte boundary of its allocation.
IPC_HANDLE_BYTES = 64
_DEVICE_ALIGN = 64

# How a CUDAPagedCache may reach the node (CUDAPagedCache.staging), and how
# it does (CUDAPagedCache.transport).
STAGING = ("auto", "never", "always")
CUDA_IPC, HOST_STAGING = "cuda-ipc", "host-staging"


def _gpu():
    """kvmesh.torch.gpu, the CUDA seam (imported on first use: it needs
    torch)."""
    from .torch import gpu
    return gpu


def _check_layers(what: str, tensors: list, layout: CacheLayout) -> None:
    """Refuses layers that cannot be an engine's GPU cache of layout, by
    IPC or staging alike."""
    if not isinstance(layout, CacheLayout):
        raise UsageError(f"{what}: want a kvmesh.inject.CacheLayout, got {type(layout).__name__}")
    if not tensors:
        raise UsageError(f"{what}: no layers")
    cuda = _gpu().cuda
    for l, t in enumerate(tensors):
        if not cuda.is_device(t):
            raise UsageError(f"{what}: layer {l} is not a CUDA tensor: for a cache in host memory, register a "
                             "PagedCache in shared memory")
        if not t.is_contiguous():
            raise UsageError(f"{what}: layer {l} is not contiguous")
        if t.numel() * t.element_size() != layout.layer_bytes:
            raise UsageError(f"{what}: layer {l} of {t.numel() * t.element_size()} bytes, the layout needs "
                             f"{layout.layer_bytes}")


def cuda_ipc(tensors, layout: CacheLayout):
    """The CUDA IPC registration of a cache whose layer l is the torch CUDA
    tensor tensors[l] (contiguous, layout.layer_bytes): (device, one
    64-byte handle per layer, each layer's byte offset in the allocation
    its handle exports), from torch's own storage sharing. Layers of one
    allocation share its handle. What cannot be exported is a UsageError."""
    tensors = list(tensors)
    _check_layers("cuda_ipc", tensors, layout)
    cuda = _gpu().cuda
    devices, handles, offsets = set(), [], []
    for l, t in enumerate(tensors):
        try:
            device, handle, offset = cuda.export(t)
        except KvmeshError:
            raise
        except Exception as e:  # noqa: BLE001 (torch refuses with RuntimeError and more)
            raise UsageError(f"cuda_ipc: layer {l}: torch cannot export it by CUDA IPC: {e}") from e
        if len(handle) != IPC_HANDLE_BYTES:
            raise UsageError(f"cuda_ipc: layer {l}: torch gave a {len(handle)}-byte IPC handle")
        offset += t.storage_offset() * t.element_size()
        if offset % _DEVICE_ALIGN:
            raise UsageError(f"cuda_ipc: layer {l} at byte {offset} of its allocation: the node needs "
                             f"{_DEVICE_ALIGN}-byte alignment")
        devices.add(int(device))
        handles.append(handle)
        offsets.append(int(offset))
    if len(devices) != 1:
        raise UsageError(f"cuda_ipc: layers on devices {sorted(devices)}: want one GPU")
    return devices.pop(), handles, offsets


class CUDAPagedCache:
    """A paged KV cache in the engine's GPU memory: one torch CUDA tensor
    per layer (contiguous, layout.layer_bytes each; the CacheLayout's
    order and dtype). register_cache registers it with the local node.

    By CUDA IPC (MEMORY_KIND_CUDA_IPC, the handles from torch) the node
    writes hits straight into the tensors. That needs a kvmeshd built with
    the cuda tag on the same machine and GPU. Where IPC is impossible the
    cache goes through pinned host staging (kvmesh.torch.gpu.HostStaging):
    a shared-memory PagedCache of the same layout, page-locked, that the
    node writes; its StagedInjector copies the rows written to the tensors
    and waits for the copies before it reports a layer or returns. It
    costs host memory the size of the cache and a host-to-device copy of
    what each injection writes.

    staging says which:
    - "auto" (the default): IPC, else staging where IPC is impossible:
      torch cannot export the tensors (expandable segments, say), or the
      node answers that it cannot open them (Unimplemented: a kvmeshd
      without the cuda tag; InvalidArgument: its device refused the
      handles). The fallback is logged (logger kvmesh.inject) and said by
      fallback_reason; it lasts for the cache's life.
    - "never": IPC only; what cannot be exported raises UsageError, a
      node's refusal its KvmeshError.
    - "always": staging only.
    transport says which one the cache uses: CUDA_IPC ("cuda-ipc") or
    HOST_STAGING ("host-staging"); with "auto" it may turn to staging at
    register_cache. A node on another machine is refused either way
    (PermissionDenied): both need the node on the engine's machine.

    A cache is registered through staging with one node at a time (the
    staging is one shared-memory file). close() also frees the staging."""

    def __init__(self, tensors, layout: CacheLayout, staging: str = "auto"):
        if staging not in STAGING:
            raise UsageError(f"PagedCache.cuda: staging {staging!r}: want one of {', '.join(STAGING)}")
        if isinstance(tensors, (str, bytes)) or not hasattr(tensors, "__iter__"):
            raise UsageError(f"PagedCache.cuda: want one torch CUDA tensor per layer, got {type(tensors).__name__}")
        self._tensors = list(tensors)
        _check_layers("PagedCache.cuda", self._tensors, layout)
        self.layers, self.layout, self.staging = len(self._tensors), layout, staging
        self.transport, self.fallback_reason = CUDA_IPC, None
        self.device, self.ipc_handles, self.offsets = None, [], []
        self._host = None  # the HostStaging, once one is made
        self._staged = False  # registered through the staging
        if staging == "always":
            self.transport = HOST_STAGING
            return
        try:
            self.device, self.ipc_handles, self.offsets = cuda_ipc(self._tensors, layout)
        except UsageError as e:
            if staging == "never":
                raise
            self._fall_back(str(e))

    def _fall_back(self, reason: str) -> None:
        self.transport, self.fallback_reason = HOST_STAGING, reason
        log.warning("kvmesh: GPU cache of %d layers through pinned host staging, not CUDA IPC: %s", self.layers, reason)

    def host_staging(self):
        """The cache's HostStaging (made on first use: host memory the size
        of the cache)."""
        if self._host is None:
            self._host = _gpu().HostStaging(self._tensors, self.layout)
        return self._host

    def layer(self, l: int):
        """Layer l, the engine's own tensor."""
        return self._tensors[l]

    def close(self) -> None:
        """Drops the references to the tensors and frees the staging
        (unregister first)."""
        self._tensors = []
        if self._host is not None:
            host, self._host = self._host, None
            host.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

@dataclasses.dataclass(frozen=True)
class InjectChunk:
    """Place the chunk `tokens` (content ID content) at absolute position
    pos, token i in cache slot slots[i] (-1: skip it). want is the context
    that makes an entry EXACT (the prompt's prefix chain, usually).

    A slot numbers a token's row in the paged cache: block b, offset o is
    slot b * block_size + o, in every layer and for K and V alike. Positions
    are what RoPE sees (the token's index in its prompt, plus the
    prompt's start); slots are where the KV lives, in any order."""

    content: ID
    tokens: Sequence[int]
    want: Context
    pos: int
    slots: Sequence[int]

    def __post_init__(self):
        want_id(self.content, "InjectChunk.content")
        t = tokens_array(self.tokens, "InjectChunk.tokens")
        want_context(self.want, "InjectChunk.want")
        if not _is_int(self.pos) or self.pos < 0:
            raise UsageError(f"InjectChunk.pos {self.pos!r}: want the chunk's first position, a non-negative int")
        sl = slots_array(self.slots, "InjectChunk.slots")
        if len(sl) != len(t):
            raise UsageError(f"InjectChunk: {len(sl)} slots for {len(t)} tokens: want one slot per token (-1 skips one)")


def slots_array(slots, what: str = "slots") -> np.ndarray:
    """slots (ints >= -1: a list, numpy array or torch tensor) as int64
    numpy, or UsageError."""
    if hasattr(slots, "detach") and hasattr(slots, "cpu"):
        slots = slots.detach().cpu().numpy()
    if isinstance(slots, (str, bytes)) or _is_int(slots):
        raise UsageError(f"{what}: want a list of cache slots (ints, -1 to skip), got {type(slots).__name__}")
    try:
        a = np.asarray(slots)
    except (TypeError, ValueError) as e:
        raise UsageError(f"{what}: want a list of cache slots (ints): {e}") from None
    if a.size == 0:
        return np.zeros(0, dtype=np.int64)
    if a.ndim != 1 or a.dtype.kind not in "iu" or a.min() < -1:
        raise UsageError(f"{what}: want a flat list of cache slots (ints >= -1), got shape {a.shape}, dtype {a.dtype}")
    return a.astype(np.int64)


@dataclasses.dataclass(frozen=True)
class InjectResult:
    """match per chunk (Match.EXACT / APPROXIMATE / MISS) and the key of the
    entry written (None on a miss); what the node wrote and decoded, and
    the node's time per stage in nanoseconds (fetch_ns, arrive_ns,
    verify_ns, decode_ns, scatter_ns; empty from a node that predates it)."""

    matches: "list[str]"
    keys: "list[Key | None]"
    layers: int
    written_bytes: int
    decoded_bytes: int
    timings: "dict[str, int]" = dataclasses.field(default_factory=dict)


def _want_chunks(chunks) -> "list[InjectChunk]":
    """chunks as a list of InjectChunks, or UsageError."""
    if isinstance(chunks, InjectChunk):
        raise UsageError("inject: want a list of InjectChunks, got one (wrap it in a list)")
    chunks = list(chunks)
    for i, c in enumerate(chunks):
        if not isinstance(c, InjectChunk):
            raise UsageError(f"inject: chunk {i}: want a kvmesh.inject.InjectChunk, got {type(c).__name__}")
    return chunks


class Injector:
    """Injects chunks into a cache registered with one node (the node on
    the engine's machine: it writes the engine's memory). Made by
    Client.register_cache; close() unregisters."""

    def __init__(self, client, addr: str, cache_id: int):
        self._client, self.addr, self.cache_id = client, addr, cache_id
        self._stub = inject_pb2_grpc.InjectorStub(client._channel(addr))

    def inject(self, chunks: "Sequence[InjectChunk]", on_layer: "Callable[[int], None] | None" = None,
               on_plan: "Callable[[list], None] | None" = None, timeout: "float | None" = None) -> InjectResult:
        """Injects chunks; on_layer(l) is called as the node reports layer l
        written for every hit (so a model may start layer l early), and
        on_plan(matches) once every entry is fetched and verified, before
        anything is written."""
        from .client import _MATCH_OF, _key, _pcontext, _pid, translate
        chunks = _want_chunks(chunks)
        req = inject_pb2.InjectRequest(cache_id=self.cache_id, plan=on_plan is not None, chunks=[
            inject_pb2.InjectChunk(content=_pid(c.content), tokens=list(c.tokens), want=_pcontext(c.want),
                                   pos=c.pos, slots=list(c.slots)) for c in chunks])
        layers = 0
        try:
            for ev in self._stub.Inject(req, metadata=self._client._metadata,
                                        timeout=timeout or self._client.rpc_timeout):
                kind = ev.WhichOneof("event")
                if kind == "layer_written":
                    layers += 1
                    if on_layer:
                        on_layer(ev.layer_written)
                elif kind == "plan" and on_plan:
                    on_plan([_MATCH_OF.get(r.status, "MISS") for r in ev.plan.results])
                elif kind == "done":
                    d = ev.done
                    if len(d.results) != len(chunks):
                        raise KvmeshError(f"Inject: {len(d.results)} results for {len(chunks)} chunks")
                    matches = [_MATCH_OF.get(r.status, "MISS") for r in d.results]
                    keys = [_key(r.key) if m != "MISS" else None for m, r in zip(matches, d.results)]
                    timings = ({f.name: getattr(d.timings, f.name) for f in d.timings.DESCRIPTOR.fields}
                               if d.HasField("timings") else {})
                    return InjectResult(matches, keys, layers, d.written_bytes, d.decoded_bytes, timings)
        except grpc.RpcError as e:
            raise translate(e, "Inject", self.addr) from None
        raise KvmeshError(f"Inject on {self.addr}: the stream ended without results")

    def close(self) -> None:
        """Unregisters the cache from the node."""
        from ._pb import inject_pb2 as pb
        from .client import translate
        try:
            self._stub.UnregisterCache(pb.UnregisterCacheRequest(cache_id=self.cache_id),
                                       metadata=self._client._metadata, timeout=self._client.rpc_timeout)
        except grpc.RpcError as e:
            raise translate(e, "UnregisterCache", self.addr) from None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class StagedInjector(Injector):
    """The Injector of a CUDAPagedCache registered through host staging:
    the node writes the staging, and inject copies what it wrote to the
    engine's tensors (the slots of the chunks the plan answered as hits,
    each layer as the node reports it) and waits for the copies before it
    calls on_layer(l) and before it returns: when the engine hears of a
    layer, its tensors hold it. A failed copy raises KvmeshError. Slots of
    a planned hit that the node then answers MISS (an entry that failed to
    decode or arrive at a later layer) hold what the staging held, as they
    hold unspecified bytes by CUDA IPC: the engine computes them, as for
    any MISS. close() unregisters; the cache keeps its staging."""

    def __init__(self, client, addr: str, cache_id: int, cache: CUDAPagedCache):
        super().__init__(client, addr, cache_id)
        self.cache = cache
        self._host = cache.host_staging()  # the staging the node maps

    def inject(self, chunks: "Sequence[InjectChunk]", on_layer: "Callable[[int], None] | None" = None,
               on_plan: "Callable[[list], None] | None" = None, timeout: "float | None" = None) -> InjectResult:
        """Injector.inject, the rows written copied to the device first."""
        from .client import Match
        chunks = _want_chunks(chunks)
        slots = [slots_array(c.slots) for c in chunks]
        host = self._host
        if host.closed:
            raise UsageError("inject: the GPU cache was closed: its staging is gone")
        gpu = _gpu()
        runs = None  # the rows to copy, once the plan says which chunks hit
        early = []  # layers reported before a plan (a node that sends none)

        def hit_runs(matches):
            return gpu.slot_runs(np.concatenate([np.zeros(0, np.int64)] + [
                s for s, m in zip(slots, matches, strict=True) if m != Match.MISS]))

        def plan(matches):
            nonlocal runs
            runs = hit_runs(matches)
            if on_plan:
                on_plan(matches)

        def layer(l):
            if runs is None:
                early.append(l)
                return
            host.copy(l, runs)
            host.wait()
            if on_layer:
                on_layer(l)

        res = super().inject(chunks, on_layer=layer, on_plan=plan, timeout=timeout)
        if early:
            runs = hit_runs(res.matches)
            for l in early:
                host.copy(l, runs)
            host.wait()
            for l in early:
                if on_layer:
                    on_layer(l)
        return res

    def close(self) -> None:
        """Unregisters the staging from the node."""
        try:
            super().close()
        finally:
            self.cache._staged = False


def _ipc_refused(e: KvmeshError) -> bool:
    """Whether a node's answer to a CUDA IPC registration says it cannot
    open the handles (no device kernel; its device refused them), so that
    staging may serve the cache instead. A malformed registration answers
    InvalidArgument too: staging then fails the same way, and says so."""
    return e.code == grpc.StatusCode.UNIMPLEMENTED or isinstance(e, InvalidArgument)


def register_cache(client, addr: str, fingerprint: ID, cache: PagedCache, head_lo: int = 0, head_hi: int = 0,
                   max_positions: int = 0) -> Injector:
    """Registers cache with the node at addr (on this machine) for the model
    fingerprint; head_lo/head_hi: the model KV heads the cache holds (both
    0: all); max_positions: see Client.register_cache. A CUDAPagedCache
    registers by CUDA IPC or through its host staging (a StagedInjector),
    as its staging says."""
    from .client import _pid, translate
    if not isinstance(cache, (PagedCache, CUDAPagedCache)):
        hint = (": allocate a PagedCache (shared memory the node can map) and view its layers with "
                "kvmesh.torch.cache_tensor") if hasattr(cache, "dtype") or isinstance(cache, (list, tuple)) else ""
        raise UsageError(f"register_cache: want a kvmesh.inject.PagedCache, got {type(cache).__name__}{hint}")
    for name, v in (("head_lo", head_lo), ("head_hi", head_hi), ("max_positions", max_positions)):
        if not _is_int(v) or v < 0:
            raise UsageError(f"register_cache: {name} {v!r}: want a non-negative int")
    stub = inject_pb2_grpc.InjectorStub(client._channel(addr))

    def register(c, **memory) -> int:
        req = inject_pb2.RegisterCacheRequest(
            fingerprint=_pid(fingerprint), layers=c.layers, layouts=[c.layout.proto()], head_lo=head_lo,
            head_hi=head_hi, max_positions=max_positions, offsets=c.offsets, **memory)
        try:
            return stub.RegisterCache(req, metadata=client._metadata, timeout=client.rpc_timeout).cache_id
        except grpc.RpcError as e:
            raise translate(e, "RegisterCache", addr) from None

    def register_shm(c: PagedCache) -> int:
        try:
            sock = stub.CacheSocket(inject_pb2.CacheSocketRequest(), metadata=client._metadata,
                                    timeout=client.rpc_timeout)
        except grpc.RpcError as e:
            raise translate(e, "CacheSocket", addr) from None
        handle = send_cache_file(sock.address, c.fileno(), client.rpc_timeout)
        return register(c, memory_kind=inject_pb2.MEMORY_KIND_SHM, memory_handle=handle)

    if not isinstance(cache, CUDAPagedCache):
        return Injector(client, addr, register_shm(cache))
    if cache.transport == CUDA_IPC:
        try:
            return Injector(client, addr, register(cache, memory_kind=inject_pb2.MEMORY_KIND_CUDA_IPC,
                                                   device=cache.device, ipc_handles=cache.ipc_handles))
        except KvmeshError as e:
            if cache.staging != "auto" or not _ipc_refused(e):
                raise
            cache._fall_back(f"the node at {addr} cannot open its CUDA IPC handles: {e}")
    if cache._staged:
        raise UsageError("register_cache: this GPU cache is registered through host staging already: close that "
                         "Injector first")
    cache_id = register_shm(cache.host_staging().cache)
    cache._staged = True
    return StagedInjector(client, addr, cache_id, cache)


# The cache socket's protocol (api/cachesocket.go): the hello with one
# descriptor attached (SCM_RIGHTS), answered by a status byte (0 taken,
# 1 refused) and, when taken, the handle to register the file with.
CACHE_SOCKET_HELLO = b"KVMFD\x00\x00\x01"
CACHE_HANDLE_BYTES = 32


def send_cache_file(address: str, fd: int, timeout: "float | None" = None) -> bytes:
    """Hands the open file descriptor fd to a node's cache socket at
    address (a leading "@" is Linux's abstract namespace) and returns the
    handle RegisterCacheRequest.memory_handle takes. The node keeps its own
    copy of the descriptor; fd stays the caller's. A refusal raises
    PermissionDenied, without a reason (the node logs it)."""
    import socket
    name = "\0" + address[1:] if address.startswith("@") else address
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        try:
            s.connect(name)
            socket.send_fds(s, [CACHE_SOCKET_HELLO], [fd])
            reply = b""
            while len(reply) < 1 + CACHE_HANDLE_BYTES:
                got = s.recv(1 + CACHE_HANDLE_BYTES - len(reply))
                if not got:
                    break
                reply += got
                if reply[:1] != b"\x00":
                    break
        except OSError as e:
            raise KvmeshError(f"cache socket {address}: {e}") from None
    if reply[:1] != b"\x00":
        raise PermissionDenied(f"cache socket {address}: shared memory refused")
    if len(reply) != 1 + CACHE_HANDLE_BYTES:
        raise KvmeshError(f"cache socket {address}: short answer ({len(reply)} bytes)")
    return reply[1:]
