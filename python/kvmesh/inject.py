"""A paged KV cache in shared memory that the local kvmesh node fills
(the Injector service, api/inject.proto).

The engine allocates its cache in a memfd (or a file under /dev/shm),
registers it once with the node on its own machine, and then asks that node
to inject stored chunks at positions of a new prompt: the node fetches each
chunk's best entry (its own tier first, then a replica), rotates the
pre-RoPE keys to the target positions and writes post-RoPE K and V into the
given slots, layer by layer, and answers EXACT, APPROXIMATE or MISS per
chunk. The layout is cudakern's: per layer, K then V, each
[num_blocks][block_size][kv_heads][head_dim] (NHD, vLLM FlashAttention's)
or [num_blocks][kv_heads][block_size][head_dim] (HND).
"""

from __future__ import annotations

import dataclasses
import mmap
import os
from typing import Callable, Sequence

import grpc
import numpy as np

from ._pb import inject_pb2, inject_pb2_grpc
from .entry import _np_dtype
from .errors import KvmeshError, PermissionDenied, UsageError
from .keys import ID, Context, DType, Key, _is_int, tokens_array, want_context, want_id

__all__ = ["NHD", "HND", "ALIGNMENT", "CacheLayout", "PagedCache", "CUDAPagedCache", "InjectChunk", "InjectResult",
           "Injector", "register_cache", "send_cache_file", "cuda_ipc"]

NHD, HND = 1, 2
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
        if self.order not in (NHD, HND):
            raise UsageError(f"CacheLayout.order {self.order!r}: want kvmesh.inject.NHD or HND")

    @property
    def slots(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def layer_bytes(self) -> int:
        return 2 * self.slots * self.kv_heads * self.head_dim * DType(self.dtype).size

    @property
    def shape(self) -> tuple:
        if self.order == HND:
            return (2, self.num_blocks, self.kv_heads, self.block_size, self.head_dim)
        return (2, self.num_blocks, self.block_size, self.kv_heads, self.head_dim)

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
    def cuda(tensors, layout: CacheLayout) -> "CUDAPagedCache":
        """A PagedCache over torch CUDA tensors (one per layer) instead of
        shared memory: see CUDAPagedCache."""
        return CUDAPagedCache(tensors, layout)


# CUDA IPC handles (cudaIpcMemHandle_t) are 64 bytes; the node wants every
# layer on a 64-byte boundary of its allocation.
IPC_HANDLE_BYTES = 64
_DEVICE_ALIGN = 64


def cuda_ipc(tensors, layout: CacheLayout):
    """The CUDA IPC registration of a cache whose layer l is the torch CUDA
    tensor tensors[l] (contiguous, layout.layer_bytes): (device, one
    64-byte handle per layer, each layer's byte offset in the allocation
    its handle exports), from torch's own storage sharing. Layers of one
    allocation share its handle."""
    if not isinstance(layout, CacheLayout):
        raise UsageError(f"cuda_ipc: want a kvmesh.inject.CacheLayout, got {type(layout).__name__}")
    tensors = list(tensors)
    if not tensors:
        raise UsageError("cuda_ipc: no layers")
    devices, handles, offsets = set(), [], []
    for l, t in enumerate(tensors):
        if not getattr(t, "is_cuda", False):
            raise UsageError(f"cuda_ipc: layer {l} is not a CUDA tensor: register a PagedCache in shared memory "
                             "and copy its layers to the device from pinned memory instead")
        if not t.is_contiguous():
            raise UsageError(f"cuda_ipc: layer {l} is not contiguous")
        if t.numel() * t.element_size() != layout.layer_bytes:
            raise UsageError(f"cuda_ipc: layer {l} of {t.numel() * t.element_size()} bytes, the layout needs "
                             f"{layout.layer_bytes}")
        storage = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()._untyped()
        device, handle, _size, offset = storage._share_cuda_()[:4]
        handle = bytes(handle)
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
    order and dtype). register_cache registers it with the local node by
    CUDA IPC (MEMORY_KIND_CUDA_IPC, the handles from torch), and the node
    writes hits straight into it. That needs a kvmeshd built with the cuda
    tag on the same machine and GPU (others refuse it as unsupported);
    where IPC is impossible, register a PagedCache in shared memory and
    copy its layers to the device from pinned memory."""

    def __init__(self, tensors, layout: CacheLayout):
        self._tensors = list(tensors)
        self.device, self.ipc_handles, self.offsets = cuda_ipc(self._tensors, layout)
        self.layers, self.layout = len(self._tensors), layout

    def layer(self, l: int):
        """Layer l, the engine's own tensor."""
        return self._tensors[l]

    def close(self) -> None:
        """Drops the references to the tensors (unregister first)."""
        self._tensors = []

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
        if isinstance(chunks, InjectChunk):
            raise UsageError("inject: want a list of InjectChunks, got one (wrap it in a list)")
        chunks = list(chunks)
        for i, c in enumerate(chunks):
            if not isinstance(c, InjectChunk):
                raise UsageError(f"inject: chunk {i}: want a kvmesh.inject.InjectChunk, got {type(c).__name__}")
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


def register_cache(client, addr: str, fingerprint: ID, cache: PagedCache, head_lo: int = 0, head_hi: int = 0,
                   max_positions: int = 0) -> Injector:
    """Registers cache with the node at addr (on this machine) for the model
    fingerprint; head_lo/head_hi: the model KV heads the cache holds (both
    0: all); max_positions: see Client.register_cache."""
    from .client import _pid, translate
    if not isinstance(cache, (PagedCache, CUDAPagedCache)):
        hint = (": allocate a PagedCache (shared memory the node can map) and view its layers with "
                "kvmesh.torch.cache_tensor") if hasattr(cache, "dtype") or isinstance(cache, (list, tuple)) else ""
        raise UsageError(f"register_cache: want a kvmesh.inject.PagedCache, got {type(cache).__name__}{hint}")
    for name, v in (("head_lo", head_lo), ("head_hi", head_hi), ("max_positions", max_positions)):
        if not _is_int(v) or v < 0:
            raise UsageError(f"register_cache: {name} {v!r}: want a non-negative int")
    stub = inject_pb2_grpc.InjectorStub(client._channel(addr))
    if isinstance(cache, CUDAPagedCache):
        req = inject_pb2.RegisterCacheRequest(
            fingerprint=_pid(fingerprint), layers=cache.layers, layouts=[cache.layout.proto()], head_lo=head_lo,
            head_hi=head_hi, max_positions=max_positions, memory_kind=inject_pb2.MEMORY_KIND_CUDA_IPC,
            device=cache.device, ipc_handles=cache.ipc_handles, offsets=cache.offsets)
        try:
            resp = stub.RegisterCache(req, metadata=client._metadata, timeout=client.rpc_timeout)
        except grpc.RpcError as e:
            raise translate(e, "RegisterCache", addr) from None
        return Injector(client, addr, resp.cache_id)
    try:
        sock = stub.CacheSocket(inject_pb2.CacheSocketRequest(), metadata=client._metadata,
                                timeout=client.rpc_timeout)
    except grpc.RpcError as e:
        raise translate(e, "CacheSocket", addr) from None
    handle = send_cache_file(sock.address, cache.fileno(), client.rpc_timeout)
    req = inject_pb2.RegisterCacheRequest(
        fingerprint=_pid(fingerprint), layers=cache.layers, layouts=[cache.layout.proto()], head_lo=head_lo,
        head_hi=head_hi, max_positions=max_positions, memory_kind=inject_pb2.MEMORY_KIND_SHM,
        memory_handle=handle, offsets=cache.offsets)
    try:
        resp = stub.RegisterCache(req, metadata=client._metadata, timeout=client.rpc_timeout)
    except grpc.RpcError as e:
        raise translate(e, "RegisterCache", addr) from None
    return Injector(client, addr, resp.cache_id)


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
