"""PyTorch integration (needs torch): capture of pre-RoPE K and V during a
model's forward pass, chunk entries from the capture, and torch tensors over
a shared-memory PagedCache.

Capture hooks the modules whose outputs are the keys and values before
rotary embedding: in Hugging Face Llama, Mistral and Qwen2 attention these
are `self_attn.k_proj` and `self_attn.v_proj` (Qwen3 normalises keys after
k_proj: hook `self_attn.k_norm` instead). Their outputs are
[batch, tokens, kv_heads * head_dim]; RoPE is applied later, inside
attention, so what the hooks see is exactly what kvmesh stores.
"""

from __future__ import annotations

import re
from typing import Iterable, Sequence

import numpy as np
import torch

from ..entry import Entry
from ..errors import UsageError
from ..inject import PagedCache
from ..keys import Context, DType, Fingerprint, Key, ModelSpec, _is_int, content_id, tokens_array, want_context

__all__ = ["KVCapture", "cache_tensor", "chunk_entries", "to_numpy_kv", "LlamaModel"]

_TORCH_DTYPE = {DType.F32: torch.float32, DType.F16: torch.float16, DType.BF16: torch.bfloat16}


def cache_tensor(cache: PagedCache, layer: int) -> torch.Tensor:
    """Layer `layer` of a shared-memory cache as a torch tensor over the same
    memory (shape CacheLayout.shape); what the node writes shows up in it."""
    if not isinstance(cache, PagedCache):
        raise UsageError(f"cache_tensor: want a kvmesh.inject.PagedCache, got {type(cache).__name__}")
    if not _is_int(layer) or not 0 <= layer < cache.layers:
        raise UsageError(f"cache_tensor: layer {layer!r}: want an int in 0..{cache.layers - 1}")
    a = cache.layer(layer)
    if cache.layout.dtype == DType.BF16:
        # numpy has no bfloat16: the bits go through int16.
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


class KVCapture:
    """Records pre-RoPE K and V per layer while active (a context manager).

    with KVCapture(model, spec) as cap:
        model(input_ids)
    kv = cap.kv()   # [layers, 2, tokens, kv_heads, head_dim] of batch row 0

    k_pattern and v_pattern match module names (regular expressions); the
    matches, in module order, are layers 0, 1, ... Several forward calls
    append along the token axis (prefill, then decode steps).
    """

    def __init__(self, model: torch.nn.Module, spec: ModelSpec, k_pattern: str = r"(^|\.)k_proj$",
                 v_pattern: str = r"(^|\.)v_proj$", batch_row: int = 0):
        if not isinstance(model, torch.nn.Module):
            raise UsageError(f"KVCapture: want a torch.nn.Module, got {type(model).__name__}")
        if not isinstance(spec, ModelSpec):
            raise UsageError(f"KVCapture: want the model's kvmesh.ModelSpec, got {type(spec).__name__}")
        self.spec, self.row = spec, batch_row
        ks = [m for n, m in model.named_modules() if re.search(k_pattern, n)]
        vs = [m for n, m in model.named_modules() if re.search(v_pattern, n)]
        if len(ks) != spec.layers or len(vs) != spec.layers:
            raise UsageError(f"KVCapture: found {len(ks)} key and {len(vs)} value modules for a {spec.layers}-layer spec "
                             f"(patterns {k_pattern!r}, {v_pattern!r})")
        self._mods = list(zip(ks, vs))
        self._k: list = [[] for _ in ks]
        self._v: list = [[] for _ in vs]
        self._hooks: list = []

    def _hook(self, store, layer):
        def fn(_mod, _inp, out):
            o = out[self.row] if out.dim() == 3 else out
            store[layer].append(o.detach().reshape(o.shape[0], self.spec.kv_heads, self.spec.head_dim).clone())
        return fn

    def __enter__(self):
        for l, (k, v) in enumerate(self._mods):
            self._hooks.append(k.register_forward_hook(self._hook(self._k, l)))
            self._hooks.append(v.register_forward_hook(self._hook(self._v, l)))
        return self

    def __exit__(self, *exc):
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def clear(self) -> None:
        self._k = [[] for _ in self._k]
        self._v = [[] for _ in self._v]

    def kv(self) -> torch.Tensor:
        """[layers, 2, tokens, kv_heads, head_dim] in the model's dtype."""
        if any(not k for k in self._k) or any(not v for v in self._v):
            raise UsageError("KVCapture.kv: nothing captured yet: run the model's forward pass inside "
                             "`with KVCapture(model, spec) as cap:` first")
        return torch.stack([torch.stack([torch.cat(k), torch.cat(v)]) for k, v in zip(self._k, self._v)])


def to_numpy_kv(kv: torch.Tensor, dtype: DType) -> np.ndarray:
    """A KV tensor in the entry dtype as numpy (bf16 as uint16 bits)."""
    if not isinstance(kv, torch.Tensor):
        raise UsageError(f"to_numpy_kv: want a torch.Tensor, got {type(kv).__name__}")
    t = kv.detach().to("cpu", _TORCH_DTYPE[DType(dtype)]).contiguous()
    if DType(dtype) == DType.BF16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def chunk_entries(kv: torch.Tensor, spec: ModelSpec, tokens: Sequence[int], bounds: "Iterable[tuple[int, int]]",
                  contexts: "Sequence[Context]") -> "list[Entry]":
    """Entries of the chunks tokens[a:b] for (a, b) in bounds, from a captured
    kv ([layers, 2, len(tokens), kv_heads, head_dim]), each with its
    context. bounds and contexts must be as long as each other."""
    if not isinstance(spec, ModelSpec):
        raise UsageError(f"chunk_entries: want the model's kvmesh.ModelSpec, got {type(spec).__name__}")
    fp: Fingerprint = spec.fingerprint()
    toks = tokens_array(tokens, "chunk_entries: tokens")
    bounds, contexts = list(bounds), list(contexts)
    if len(bounds) != len(contexts):
        raise UsageError(f"chunk_entries: {len(bounds)} bounds and {len(contexts)} contexts: want one context per chunk")
    if not isinstance(kv, torch.Tensor) or kv.dim() != 5 or kv.shape[1] != 2 or kv.shape[2] < len(toks):
        raise UsageError(f"chunk_entries: kv: want a tensor [layers, 2, >= {len(toks)}, kv_heads, head_dim] "
                         f"(KVCapture.kv() of the tokens), got {getattr(kv, 'shape', type(kv).__name__)}")
    kvn = to_numpy_kv(kv, spec.dtype)
    out = []
    for i, (ab, ctx) in enumerate(zip(bounds, contexts, strict=True)):
        if not (isinstance(ab, (tuple, list)) and len(ab) == 2 and all(_is_int(x) for x in ab)
                and 0 <= ab[0] < ab[1] <= len(toks)):
            raise UsageError(f"chunk_entries: bound {i} {ab!r}: want (a, b) with 0 <= a < b <= {len(toks)}")
        a, b = ab
        want_context(ctx, f"chunk_entries: context {i}")
        t = toks[a:b].tolist()
        out.append(Entry.from_kv(Key(fp, content_id(fp, t), ctx), t, kvn[:, :, a:b], spec.dtype))
    return out


from .llama import LlamaModel  # noqa: E402 (needs the helpers above)
