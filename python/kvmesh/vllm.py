"""A vLLM V1 KV connector over kvmesh (docs/VLLM.md is the design).

Select it with

    --kv-transfer-config '{"kv_connector": "KvmeshConnector",
                           "kv_connector_module_path": "kvmesh.vllm",
                           "kv_role": "kv_both",
                           "kv_connector_extra_config": {"addrs": "127.0.0.1:7000"}}'

The interface is vLLM's KVConnectorBase_V1 as its public source defines it
at commit 13f4ad0f55b08ca1d37d1459f50ce950feaeb547
(vllm/distributed/kv_transfer/kv_connector/v1/base.py); the call sequence
is that of vLLM's scheduler and KVConnectorModelRunnerMixin (read at
00f4240ee6458263d76cf51ca7901ce1350bb4d1, which also calls methods newer
than that base class: see docs/VLLM.md) and the example connector
(example_connector.py at 00231834dc62bb1127ec5c8f2e6762c87d2f477e). vLLM
is imported only here, and only if it is installed: without it the
connector subclasses a stand-in with the same methods, so that
python/tests/test_vllm.py can drive it through vLLM's call sequence.

What it does: the scheduler side cuts each prompt into chunks of
chunk_tokens (a multiple of the block size) and looks them up; it offers
vLLM the leading run of EXACT hits (block-aligned, the last prompt token
always computed). The worker side registers vLLM's own cache with the
local node and has the node inject the chunks (start_load_kv, on a
thread); wait_for_layer_load returns once that layer of every hit is in
vLLM's cache. Blocks of a chunk planned as a hit that came back MISS are
reported by get_block_ids_with_load_errors, so vLLM recomputes them.
save_kv_layer records the step's pre-RoPE K (captured by capture_hooks,
else un-rotated from the cache) and V of the chunks to save; wait_for_save
stores them under their prefix-chain keys.

Which path runs (register_kv_caches; transport and fallback_reason say
which ran):
- vLLM's cache on a GPU, CUDA IPC: the per-layer tensors are registered
  themselves (PagedCache.cuda, one IPC handle and offset per layer). The
  node writes hits straight into vLLM's blocks (from a GPU tier on that
  device, device to device) and reports each layer once it is written: the
  connector copies nothing. Needs a kvmeshd built with the cuda tag on the
  same machine, and layers torch can export, each on a 64-byte boundary of
  its allocation.
- vLLM's cache on a GPU, host staging: where IPC is impossible (a kvmeshd
  without the cuda tag answers Unimplemented, its device refuses the
  handles, torch cannot export the tensors, a layer is not 64-byte
  aligned) staging "auto" falls back, once for the connector's life, and
  kvmesh.inject logs why. The node writes a pinned host buffer of the
  cache's layout and kvmesh.torch.gpu copies the written rows of each
  layer to vLLM's tensors (a copy stream, then a wait) before the layer is
  reported.
- vLLM's cache in host memory (a CPU vLLM): the same host staging, its rows
  copied in wait_for_layer_load once the node reported the layer.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import os
import re
import threading
from typing import Any

import numpy as np
import torch

from . import hfconfig
from .client import Client, LookupItem, Match
from .entry import Entry
from .errors import KvmeshError, UsageError
from .inject import BLOCK_HND, BLOCK_NHD, HND, HOST_STAGING, NHD, STAGING, CacheLayout, InjectChunk, PagedCache
from .keys import DType, Key, ModelSpec, RopeStyle, content_id, prefix_chain
from .torch import gpu, to_numpy_kv
from .torch.gpu import HostStaging, slot_runs
from .torch.llama import rope_inv_freq

__all__ = ["KvmeshConnector", "KvmeshConnectorMetadata", "capture_hooks", "VLLM_COMMIT", "HAVE_VLLM"]

VLLM_COMMIT = "13f4ad0f55b08ca1d37d1459f50ce950feaeb547"

log = logging.getLogger("kvmesh.vllm")

try:  # vLLM is optional: imported only inside this module
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1, KVConnectorMetadata,
                                                                   KVConnectorRole)
    HAVE_VLLM = True
except ImportError:
    HAVE_VLLM = False

    class KVConnectorRole(enum.Enum):
        """vLLM's KVConnectorRole."""

        SCHEDULER = 0
        WORKER = 1

    class KVConnectorMetadata:
        """vLLM's KVConnectorMetadata (an empty base)."""

    class KVConnectorBase_V1:
        """The part of vLLM's KVConnectorBase_V1 the connector relies on
        (the constructor and the metadata binding), for use without vLLM."""

        def __init__(self, vllm_config, role, kv_cache_config=None):
            self._connector_metadata = None
            self._vllm_config = vllm_config
            if vllm_config.kv_transfer_config is None:
                raise ValueError("kv_transfer_config must be set for KVConnectorBase_V1")
            self._kv_transfer_config = vllm_config.kv_transfer_config
            self._kv_cache_config = kv_cache_config
            self._role = role

        @property
        def role(self):
            return self._role

        def bind_connector_metadata(self, connector_metadata) -> None:
            self._connector_metadata = connector_metadata

        def clear_connector_metadata(self) -> None:
            self._connector_metadata = None

        def _get_connector_metadata(self):
            assert self._connector_metadata is not None
            return self._connector_metadata

        def has_connector_metadata(self) -> bool:
            return self._connector_metadata is not None


@dataclasses.dataclass
class _Load:
    req_id: str
    chunks: "list[InjectChunk]"
    blocks: "list[list[int]]"  # per chunk, the vLLM block IDs it fills


@dataclasses.dataclass
class _Save:
    req_id: str
    tokens: "list[int]"
    slots: "list[int]"  # slot of every prompt token
    chunks: "list[tuple[int, int]]"  # token bounds of the chunks to store


@dataclasses.dataclass
class KvmeshConnectorMetadata(KVConnectorMetadata):
    """What the scheduler side tells the workers for one step: chunks to
    load (inject) and chunks to save, per request."""

    loads: "list[_Load]" = dataclasses.field(default_factory=list)
    saves: "list[_Save]" = dataclasses.field(default_factory=list)


def _extra(cfg) -> dict:
    ex = getattr(cfg, "kv_connector_extra_config", None) or {}
    return dict(ex)


def _layer_index(name: str) -> int:
    m = re.search(r"layers\.(\d+)\.", name)
    if not m:
        raise UsageError(f"KvmeshConnector: cannot tell the layer of {name!r} (want ...layers.N....)")
    return int(m.group(1))


# vLLM's HND cache layout keeps a backend's shape over memory with
# block_size and kv_heads swapped: the order of that memory, per shape.
_SWAPPED = {NHD: HND, BLOCK_NHD: BLOCK_HND}


def _layouts(tensors: "list[torch.Tensor]", heads: "tuple[int, int]"):
    """vLLM's layers as (the CacheLayout of their shape, the CacheLayout of
    their memory, each layer as a contiguous tensor of that memory's
    shape), or UsageError."""
    t = tensors[0]
    if t.dim() != 5 or 2 not in tuple(t.shape[:2]) or tuple(t.shape[3:]) != heads:
        raise UsageError(f"register_kv_caches: layer of shape {tuple(t.shape)}: want [2, num_blocks, block_size, "
                         f"{heads[0]}, {heads[1]}] or [num_blocks, 2, block_size, {heads[0]}, {heads[1]}]")
    shape_order, blocks = (NHD, t.shape[1]) if t.shape[0] == 2 else (BLOCK_NHD, t.shape[0])
    view = CacheLayout(blocks, t.shape[2], t.shape[3], t.shape[4], DType.parse(str(t.dtype)), shape_order)
    order, memory = None, []
    for l, x in enumerate(tensors):
        if x.shape != t.shape or x.dtype != t.dtype or x.device != t.device:
            raise UsageError(f"register_kv_caches: layer {l} is {tuple(x.shape)} {x.dtype} on {x.device}, layer 0 "
                             f"{tuple(t.shape)} {t.dtype} on {t.device}: want one shape, dtype and device")
        if x.is_contiguous():
            o, m = shape_order, x
        elif x.transpose(2, 3).is_contiguous():
            o, m = _SWAPPED[shape_order], x.transpose(2, 3)
        else:
            raise UsageError(f"register_kv_caches: layer {l} has strides {x.stride()}: want its memory in its "
                             "shape's order or with block_size and kv_heads swapped (vLLM's HND cache layout)")
        if order is not None and o != order:
            raise UsageError(f"register_kv_caches: layer {l}'s memory order differs from layer 0's")
        order = o
        memory.append(m)
    return view, dataclasses.replace(view, order=order), memory


def capture_hooks(model: torch.nn.Module, connector: "KvmeshConnector", pattern: str = r"rotary_emb$") -> list:
    """Records pre-RoPE keys for connector.save_kv_layer: a forward pre-hook
    on each module matching pattern (vLLM's Llama-family attention calls
    self.rotary_emb(positions, q, k) before self.attn), in module order,
    layer 0 first. Returns the hook handles (remove() them to stop)."""
    mods = [m for n, m in model.named_modules() if re.search(pattern, n)]
    if not mods:
        raise UsageError(f"capture_hooks: no module matches {pattern!r}")
    hooks = []
    for layer, m in enumerate(mods):
        def pre(_mod, args, layer=layer):
            connector.record_pre_rope_key(layer, args[2])
        hooks.append(m.register_forward_pre_hook(pre))
    return hooks


class KvmeshConnector(KVConnectorBase_V1):
    """vLLM's KVConnectorBase_V1 over a kvmesh cluster (module doc).

    kv_connector_extra_config: addrs (seeds; default $KVMESH_ADDR), local
    (the node on this machine; default the first loopback address),
    chunk_tokens (default 256, a multiple of the block size),
    accept_approximate (false: only EXACT hits are loaded), tokenizer_id,
    weights_revision (default the model path and revision), spec (a dict of
    ModelSpec fields, instead of the one config.json gives), staging
    ("auto": a GPU cache by CUDA IPC, else through host staging; "never":
    IPC or fail; "always": host staging; see PagedCache.cuda).

    After register_kv_caches, transport says how the node reaches vLLM's
    cache (kvmesh.inject.CUDA_IPC or HOST_STAGING), fallback_reason why it
    is not IPC where "auto" fell back (else None), and layout is the
    CacheLayout registered (the order of vLLM's memory)."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        ex = _extra(self._kv_transfer_config)
        self._block = int(vllm_config.cache_config.block_size)
        self._chunk = int(ex.get("chunk_tokens", 256))
        if self._chunk <= 0 or self._chunk % self._block:
            raise UsageError(f"KvmeshConnector: chunk_tokens {self._chunk} must be a positive multiple of the "
                             f"block size {self._block}")
        self._approx = bool(ex.get("accept_approximate", False))
        self._staging_mode = ex.get("staging", "auto")
        if self._staging_mode not in STAGING:
            raise UsageError(f"KvmeshConnector: staging {self._staging_mode!r}: want one of {', '.join(STAGING)}")
        self.spec = self._spec(vllm_config, ex)
        self.fingerprint = self.spec.fingerprint()
        addrs = ex.get("addrs") or os.environ.get("KVMESH_ADDR", "")
        self.client = Client(addrs)
        self.client.register_model(self.spec)
        self._local = ex.get("local")
        # Scheduler side.
        self._matched: dict = {}  # req_id -> leading hit tokens offered
        self._need_load: dict = {}  # req_id -> (request, block ids, external tokens)
        # Worker side.
        self._caches: dict = {}
        self._names: list = []
        self.transport: "str | None" = None
        self.fallback_reason: "str | None" = None
        self.layout: "CacheLayout | None" = None  # of vLLM's memory, as registered
        self._view: "CacheLayout | None" = None  # of vLLM's tensors' shape
        self._cache = None  # a CUDAPagedCache over vLLM's GPU tensors
        self._staging: "HostStaging | None" = None  # the host staging of a cache in host memory
        self._runs: list = []  # the slot runs this step copies from _staging
        self._injector = None
        self._load_thread = None
        self._layer_done: list = []
        self._load_result = None
        self._load_error: "Exception | None" = None
        self._errors: set = set()
        self._pending: list = []  # (load, result) to copy
        self._keys: dict = {}  # layer -> pre-RoPE keys of this step
        self._saved: dict = {}  # (req_id, layer) -> (k, v) of the chunks' tokens
        self._inv = None
        self._loads: list = []

    # -- configuration -------------------------------------------------------

    @staticmethod
    def _spec(vllm_config, ex) -> ModelSpec:
        if ex.get("spec"):
            return ModelSpec(**ex["spec"])
        mc = vllm_config.model_config
        hf = mc.hf_config.to_dict() if hasattr(mc.hf_config, "to_dict") else dict(mc.hf_config)
        cfg = hfconfig.parse(hf)
        dt = getattr(vllm_config.cache_config, "cache_dtype", "auto")
        if dt in (None, "auto"):
            dt = str(getattr(mc, "dtype", "float32"))
        rev = ex.get("weights_revision") or f"{getattr(mc, 'model', '')}@{getattr(mc, 'revision', '') or ''}"
        return cfg.spec(DType.parse(dt), rev, ex.get("tokenizer_id", ""))

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config) -> "str | None":
        """NHD (vLLM's cache layout setting): a layer's rows are [block_size,
        kv_heads, head_dim], FlashAttention's layout, or the FlashInfer and
        Triton backends' with K and V inside each block (register_kv_caches
        takes either)."""
        return "NHD"

    # -- scheduler side ------------------------------------------------------

    def _cut(self, tokens: "list[int]") -> "list[list[int]]":
        """The prompt's full chunks before its last token (which vLLM always
        computes)."""
        n = (len(tokens) - 1) // self._chunk
        return [tokens[i * self._chunk:(i + 1) * self._chunk] for i in range(n)]

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> "tuple[int | None, bool]":
        """The tokens beyond num_computed_tokens that the leading run of hit
        chunks covers (block-aligned: chunks are whole blocks); loads are
        synchronous (the second value is False)."""
        tokens = list(request.prompt_token_ids or [])
        chunks = self._cut(tokens)
        if not chunks:
            return 0, False
        ctxs, _ = prefix_chain(self.fingerprint, chunks)
        fp = self.fingerprint
        try:
            res = self.client.lookup(fp, [LookupItem(content_id(fp, c), x) for c, x in zip(chunks, ctxs, strict=True)])
        except KvmeshError as e:
            log.warning("kvmesh: lookup failed, computing the prompt: %s", e)
            return 0, False
        run = 0
        for r in res:
            if r.match == Match.EXACT or (self._approx and r.match == Match.APPROXIMATE):
                run += 1
            else:
                break
        hit = run * self._chunk
        self._matched[request.request_id] = hit
        return max(0, hit - num_computed_tokens), False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        """Remembers the blocks of a request that loads tokens."""
        if num_external_tokens > 0:
            ids = blocks.get_block_ids()[0] if hasattr(blocks, "get_block_ids") else list(blocks)
            self._need_load[request.request_id] = (request, list(ids), num_external_tokens)

    def build_connector_meta(self, scheduler_output) -> KvmeshConnectorMetadata:
        """This step's loads (the requests update_state_after_alloc kept) and
        saves (new requests' full chunks past the loaded run, when the step
        computes their whole prompt)."""
        meta = KvmeshConnectorMetadata()
        fp = self.fingerprint
        for new in scheduler_output.scheduled_new_reqs:
            tokens = list(new.prompt_token_ids or [])
            ids = list(new.block_ids[0])
            slots = [ids[t // self._block] * self._block + t % self._block for t in range(len(tokens))
                     if t // self._block < len(ids)]
            chunks = self._cut(tokens)
            ctxs, _ = prefix_chain(fp, chunks) if chunks else ([], None)
            hit = self._matched.pop(new.req_id, 0)
            if new.req_id in self._need_load:
                _, _, ext = self._need_load.pop(new.req_id)
                done = hit - ext  # computed locally already (vLLM's prefix cache)
                lc, lb = [], []
                for i in range(hit // self._chunk):
                    a, b = i * self._chunk, (i + 1) * self._chunk
                    sl = [s if t >= done else -1 for t, s in zip(range(a, b), slots[a:b], strict=True)]
                    lc.append(InjectChunk(content_id(fp, chunks[i]), chunks[i], ctxs[i], a, sl))
                    lb.append(sorted({ids[t // self._block] for t in range(max(a, done), b)}))
                meta.loads.append(_Load(new.req_id, lc, lb))
            scheduled = scheduler_output.num_scheduled_tokens.get(new.req_id, 0)
            computed = getattr(new, "num_computed_tokens", 0)
            if computed + scheduled >= len(tokens) and len(chunks) * self._chunk > hit:
                bounds = [(i * self._chunk, (i + 1) * self._chunk) for i in range(hit // self._chunk, len(chunks))]
                meta.saves.append(_Save(new.req_id, tokens, slots, bounds))
        return meta

    def request_finished(self, request, block_ids) -> "tuple[bool, dict[str, Any] | None]":
        """Saves finish in wait_for_save, inside the step: blocks can be
        freed at once."""
        self._matched.pop(request.request_id, None)
        self._need_load.pop(request.request_id, None)
        return False, None

    # -- worker side ---------------------------------------------------------

    def register_kv_caches(self, kv_caches: "dict[str, torch.Tensor]"):
        """Registers vLLM's cache with the node on this machine (module doc:
        by CUDA IPC, else through host staging). vLLM's layer tensors are
        [2, num_blocks, block_size, kv_heads, head_dim] (FlashAttention's,
        kvmesh's NHD) or [num_blocks, 2, block_size, kv_heads, head_dim]
        (the FlashInfer and Triton backends', kvmesh's BLOCK_NHD); [2, 2,
        ...] reads as FlashAttention's. Their memory may be in that order
        (contiguous) or with block_size and kv_heads swapped (vLLM's HND
        cache layout: kvmesh's HND, BLOCK_HND); the node is given that
        memory order. Every layer has the same shape, dtype, memory order
        and device."""
        if self._injector is not None:
            raise UsageError("register_kv_caches: the caches are registered already")
        if not isinstance(kv_caches, dict) or not all(isinstance(t, torch.Tensor) for t in kv_caches.values()):
            raise UsageError("register_kv_caches: want a dict of layer name to torch.Tensor")
        names = sorted(kv_caches, key=_layer_index)
        if len(names) != self.spec.layers:
            raise UsageError(f"register_kv_caches: {len(names)} layers for a {self.spec.layers}-layer model")
        tensors = [kv_caches[n] for n in names]
        view, layout, memory = _layouts(tensors, (self.spec.kv_heads, self.spec.head_dim))
        local = self._local_node()
        if gpu.cuda.is_device(tensors[0]):  # every layer is on its device (_layouts)
            cache = PagedCache.cuda(memory, layout, staging=self._staging_mode)
            try:
                self._injector = self.client.register_cache(local, self.fingerprint, cache)
            except BaseException:
                cache.close()
                raise
            self._cache = cache
            self.transport, self.fallback_reason = cache.transport, cache.fallback_reason
        else:
            if self._staging_mode == "never":
                raise UsageError("register_kv_caches: staging \"never\", but vLLM's cache is in host memory, "
                                 "which CUDA IPC cannot register")
            staging = HostStaging(memory, layout)
            try:
                self._injector = self.client.register_cache(local, self.fingerprint, staging.cache)
            except BaseException:
                staging.close()
                raise
            self._staging = staging
            self.transport, self.fallback_reason = HOST_STAGING, None
        self._caches, self._names, self._view, self.layout = dict(kv_caches), names, view, layout
        # The reason of a fallback is kvmesh.inject's warning.
        log.info("kvmesh: vLLM's cache of %d layers (%s, order %d) registered with %s by %s", len(names),
                 layout.dtype.name, layout.order, local, self.transport)

    def _local_node(self) -> str:
        """The node on this machine: the extra config's local, else the
        first seed or member on a loopback address."""
        if self._local is not None:
            return self._local
        from .serve import _loopback
        cands = list(self.client.seeds) + [m.grpc_addr for m in self.client.ring.members]
        local = next((a for a in cands if a and _loopback(a)), None)
        if local is None:
            raise UsageError("KvmeshConnector: no node on a loopback address; set local in the extra config")
        return local

    def start_load_kv(self, forward_context, **kwargs) -> None:
        """Starts one Inject call for the step's chunks on a thread; layer l
        is in vLLM's cache when wait_for_layer_load(l) returns."""
        meta = self._get_connector_metadata()
        self._layer_done = [threading.Event() for _ in self._names]
        self._runs = []
        self._errors = set()
        self._keys = {}
        loads = [ld for ld in meta.loads if ld.chunks]
        self._loads = loads
        self._load_result, self._load_error = None, None
        if not loads:
            for e in self._layer_done:
                e.set()
            self._load_thread = None
            return
        chunks = [c for ld in loads for c in ld.chunks]
        if self._staging is not None:
            self._runs = slot_runs([s for c in chunks for s in c.slots])

        def run():
            try:
                self._load_result = self._injector.inject(chunks, on_layer=lambda l: self._layer_done[l].set())
            except Exception as e:  # noqa: BLE001 (reported as load errors)
                self._load_error = e
            finally:
                for e in self._layer_done:
                    e.set()

        self._load_thread = threading.Thread(target=run, name="kvmesh-load", daemon=True)
        self._load_thread.start()

    def _finish_load(self) -> None:
        if self._load_thread is None:
            return
        self._load_thread.join()
        self._load_thread = None
        res, err = self._load_result, self._load_error
        j = 0
        for ld in self._loads:
            for i in range(len(ld.chunks)):
                if err is not None or res.matches[j] == Match.MISS:
                    self._errors.update(ld.blocks[i])
                j += 1
        if err is not None:
            log.warning("kvmesh: inject failed; vLLM recomputes the blocks: %s", err)

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Blocks until this layer of every hit is in vLLM's cache: written
        there by the node (CUDA IPC), copied there from the host staging
        before the layer was reported (a GPU cache through staging), or
        copied here once the node reported it (a cache in host memory)."""
        if not self._layer_done:
            return
        l = _layer_index(layer_name)
        self._layer_done[l].wait()
        if self._staging is not None and self._runs:
            self._staging.copy(l, self._runs)
            self._staging.wait()
        if l == len(self._names) - 1:
            self._finish_load()

    def record_pre_rope_key(self, layer: int, key: torch.Tensor) -> None:
        """The step's pre-RoPE keys of one layer ([tokens, kv_heads *
        head_dim] or [tokens, kv_heads, head_dim]), in the order of
        attn_metadata.slot_mapping (capture_hooks calls it)."""
        self._keys[layer] = key.detach().reshape(key.shape[0], self.spec.kv_heads, self.spec.head_dim).clone()

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata, **kwargs) -> None:
        """Copies the K (pre-RoPE) and V of the chunks to save out of this
        layer: V from kv_layer at their slots, K as captured for the step
        (else un-rotated from kv_layer by position)."""
        meta = self._get_connector_metadata()
        if not meta.saves:
            return
        l = _layer_index(layer_name)
        step = attn_metadata.slot_mapping.detach().cpu().tolist()
        row = {s: r for r, s in enumerate(step)}
        cache = self._view.canonical(kv_layer)  # [2, blocks, block, heads, dim] in either shape
        bs = cache.shape[2]
        for sv in meta.saves:
            lo, hi = sv.chunks[0][0], sv.chunks[-1][1]
            sl = torch.as_tensor(sv.slots[lo:hi])
            b, o = sl // bs, sl % bs
            v = cache[1, b.to(kv_layer.device), o.to(kv_layer.device)].detach().float().cpu()
            if l in self._keys and all(s in row for s in sv.slots[lo:hi]):
                k = self._keys[l][[row[s] for s in sv.slots[lo:hi]]].float().cpu()
            else:
                post = cache[0, b.to(kv_layer.device), o.to(kv_layer.device)].detach().float().cpu()
                k = self._unrotate(post, torch.arange(lo, hi))
            self._saved[(sv.req_id, l)] = (k, v)

    def _unrotate(self, k: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Rotates post-RoPE keys [n, heads, dim] back by their positions
        (exact to float32 rounding; cudakern.UnrotateF32)."""
        if self._inv is None:
            inv, attn = rope_inv_freq(self.spec, 32768)
            self._inv, self._attn = torch.from_numpy(inv.astype(np.float32)), attn
        ang = (pos.float()[:, None] * self._inv[None, :]).double()
        c = (ang.cos() * self._attn).float()[:, None, :]
        s = (ang.sin() * self._attn).float()[:, None, :]
        half = c.shape[-1]
        rot = 2 * half
        inv2 = 1 / (self._attn * self._attn)
        out = k.clone()
        if self.spec.rope_style == RopeStyle.NEOX:
            a, b = k[..., :half], k[..., half:rot]
            out[..., :half] = (a * c + b * s) * inv2
            out[..., half:rot] = (b * c - a * s) * inv2
        else:
            a, b = k[..., 0:rot:2], k[..., 1:rot:2]
            out[..., 0:rot:2] = (a * c + b * s) * inv2
            out[..., 1:rot:2] = (b * c - a * s) * inv2
        return out

    def wait_for_save(self):
        """Stores this step's saved chunks (each under its prefix-chain
        key); returns once the puts are done."""
        if self._load_thread is not None:
            self._finish_load()
        if not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        fp = self.fingerprint
        for sv in meta.saves:
            parts = [self._saved.pop((sv.req_id, l), None) for l in range(self.spec.layers)]
            if any(p is None for p in parts):
                continue
            lo = sv.chunks[0][0]
            toks = [sv.tokens[a:b] for a, b in [(i * self._chunk, (i + 1) * self._chunk)
                                                 for i in range(sv.chunks[-1][1] // self._chunk)]]
            ctxs, _ = prefix_chain(fp, toks)
            kv = torch.stack([torch.stack([k, v]) for k, v in parts])  # [L, 2, T, H, D]
            for a, b in sv.chunks:
                t = sv.tokens[a:b]
                e = Entry.from_kv(Key(fp, content_id(fp, t), ctxs[a // self._chunk]), t,
                                  to_numpy_kv(kv[:, :, a - lo:b - lo], self.spec.dtype), self.spec.dtype)
                try:
                    self.client.put(e)
                except KvmeshError as err:
                    log.warning("kvmesh: save of %s failed: %s", e.key, err)

    def get_finished(self, finished_req_ids: "set[str]") -> "tuple[set[str] | None, set[str] | None]":
        """Loads and saves complete within the step: nothing is pending."""
        return None, None

    def get_block_ids_with_load_errors(self) -> "set[int]":
        """Blocks of chunks planned as hits that the node answered MISS (or
        of every chunk when the inject call failed): vLLM recomputes them."""
        self._finish_load()
        return set(self._errors)

    def shutdown(self):
        """Waits for a load in flight, unregisters vLLM's cache (and frees
        its host staging) and closes the client."""
        try:
            if self._load_thread is not None:
                self._finish_load()
            if self._injector is not None:
                inj, self._injector = self._injector, None
                inj.close()
        finally:
            cache, staging = self._cache, self._staging  # one of them, or neither
            self._cache = self._staging = None
            try:
                if cache is not None:
                    cache.close()
                if staging is not None:
                    staging.close()
            finally:
                self.client.close()
