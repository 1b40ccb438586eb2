"""Chunk reuse in a few lines: Mesh connects a model to a kvmesh cluster,
stores chunks, and prefills prompts from them.

    from kvmesh.serve import Mesh
    with Mesh.connect(addrs, model) as mesh:        # model: kvmesh.torch.LlamaModel
        mesh.store(passages, context="after", prefix=system)
        ids = mesh.generate([system] + passages, question, max_new_tokens=8)

A prompt is chunks (token lists; the first is usually a shared system
prompt) followed by a query (tokens that are always computed). prefill
asks the node on this machine to inject every chunk's best stored encoding
into the model's paged cache (EXACT when it was encoded after exactly this
prompt's preceding chunks, APPROXIMATE when encoded after something else,
MISS when nothing is stored), computes the rest, and treats APPROXIMATE
chunks as `approximate` says:

- "use": the injected KV as it is;
- "recompute": Go's engine's deviation-guided recomputation (CacheBlend):
  every approximate token is computed up to check_layer, and the
  `recompute` fraction of them whose fresh keys deviate most from the
  injected ones is recomputed in the layers after it;
- "bound": that, plus the guardrail: a chunk whose relative key deviation
  at the check layer exceeds `bound` is recomputed whole.

With write_back, what prefill computed in full after an exact prefix is
stored under its prefix-chain key, so the next identical prompt is all
EXACT. The rules and results are those of Go's engine.Run
(python/tests/test_mesh.py checks answers and matches against
kvmesh-bench -accuracy's code on train/recall).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import ipaddress
import logging
import math
import threading
import time
from typing import Sequence

import numpy as np
import torch

from .client import Client, Match
from .entry import Entry
from .errors import KvmeshError, UsageError
from .inject import CacheLayout, InjectChunk, PagedCache
from .keys import (ContextKind, Key, _is_int, content_id, prefix_chain, prefix_context, standalone_context,
                   tokens_array, window_or_prefix)
from .torch import cache_tensor, to_numpy_kv
from .torch.llama import LlamaModel, Plan

__all__ = ["Mesh", "Prefill"]

log = logging.getLogger("kvmesh.serve")

CONTEXTS = ("prefix", "standalone", "window", "after")
APPROXIMATE = ("use", "recompute", "bound")
_KINDS = {"prefix": ContextKind.PREFIX, "window": ContextKind.WINDOW, "standalone": ContextKind.STANDALONE}


@dataclasses.dataclass
class Prefill:
    """What Mesh.prefill did.

    logits: the next-token logits after the prompt ([vocab], float32, on
    the model's device). matches: per chunk, "EXACT", "APPROXIMATE" or
    "MISS" (after `accept`). computed_tokens: prompt tokens whose KV this
    call computed in the last layer (misses, the query, recomputed
    approximate tokens); prompt_tokens: the prompt's length. timings:
    seconds spent injecting (lookup, fetch and write by the node),
    computing, writing back, and in all. keys: the key of the encoding
    used per chunk (None on a miss); deviations: per chunk, the relative
    key deviation at the check layer (0 unless measured); fallbacks: the
    chunks the bound recomputed whole; stored: keys written back."""

    logits: torch.Tensor
    matches: "list[str]"
    computed_tokens: int
    prompt_tokens: int
    timings: "dict[str, float]"
    keys: "list[Key | None]" = dataclasses.field(default_factory=list)
    deviations: "list[float]" = dataclasses.field(default_factory=list)
    fallbacks: "list[int]" = dataclasses.field(default_factory=list)
    token_layers: int = 0
    stored: "list[Key]" = dataclasses.field(default_factory=list)


def _loopback(addr: str) -> bool:
    host = addr.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _chunks(chunks, what: str) -> "list[list[int]]":
    if isinstance(chunks, (str, bytes)) or _is_int(chunks) or chunks is None:
        raise UsageError(f"{what}: want a list of chunks (token lists), got {type(chunks).__name__}")
    out = []
    for i, c in enumerate(chunks):
        if _is_int(c):
            raise UsageError(f"{what}: want a list of chunks (token lists), got a list of ints: wrap one chunk as "
                             "[tokens]")
        t = tokens_array(c, f"{what}: chunk {i}").tolist()
        if not t:
            raise UsageError(f"{what}: chunk {i} is empty")
        out.append(t)
    return out


class Mesh:
    """A model served with chunk reuse from a kvmesh cluster. Make one with
    Mesh.connect; close it (or use it as a context manager) when done. One
    prefill or generate runs at a time."""

    def __init__(self, client: Client, model: LlamaModel, local: str, cache_tokens: int, block_size: int,
                 own_client: bool):
        self.client, self.model, self.local = client, model, local
        self._own = own_client
        self._lock = threading.Lock()
        self.fingerprint = model.spec.fingerprint()
        s = model.spec
        self.layout = CacheLayout(-(-cache_tokens // block_size), block_size, s.kv_heads, s.head_dim, s.dtype)
        self.cache = PagedCache(s.layers, self.layout)
        self._injector = None
        self.last: "Prefill | None" = None  # what the last prefill or generate did
        try:
            self._host = [cache_tensor(self.cache, l) for l in range(s.layers)]
            # On a GPU the model computes in its own cache; injected slots
            # are copied there from the shared memory the node writes.
            self._dev = self._host if model.device.type == "cpu" else model.new_cache(self.layout.slots, block_size)
            self._injector = client.register_cache(local, self.fingerprint, self.cache,
                                                   max_positions=model.max_positions)
        except BaseException:
            self._host = self._dev = []
            self.cache.close()
            raise

    @classmethod
    def connect(cls, addrs: "Sequence[str] | str | Client", model: LlamaModel, *, local: "str | None" = None,
                cache_tokens: int = 8192, block_size: int = 16) -> "Mesh":
        """Connects to the cluster at addrs (seeds, or a kvmesh.Client),
        registers model.spec, allocates a paged cache of cache_tokens slots
        in shared memory and registers it with the node on this machine:
        local, else the first of addrs on a loopback address, else the
        first cluster member on one."""
        if not isinstance(model, LlamaModel):
            raise UsageError(f"Mesh.connect: want a kvmesh.torch.LlamaModel, got {type(model).__name__}")
        for name, v in (("cache_tokens", cache_tokens), ("block_size", block_size)):
            if not _is_int(v) or v <= 0:
                raise UsageError(f"Mesh.connect: {name} {v!r}: want a positive int")
        own = not isinstance(addrs, Client)
        client = Client(addrs) if own else addrs
        try:
            client.register_model(model.spec)
            if local is None:
                cands = list(client.seeds) + [m.grpc_addr for m in client.ring.members]
                local = next((a for a in cands if a and _loopback(a)), None)
                if local is None:
                    raise UsageError("Mesh.connect: no node on a loopback address; pass local= (the node on this "
                                     "machine, which maps the cache's shared memory)")
            return cls(client, model, local, cache_tokens, block_size, own)
        except BaseException:
            if own:
                client.close()
            raise

    def close(self) -> None:
        """Unregisters the cache, frees it and closes the client (if Mesh
        made it)."""
        try:
            if self._injector is not None:
                self._injector.close()
                self._injector = None
        finally:
            self._host = self._dev = []
            self.cache.close()
            if self._own:
                self.client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- storing -------------------------------------------------------------

    def _encode(self, before: "list[int]", tokens: "list[int]") -> torch.Tensor:
        """Pre-RoPE K and V [layers, 2, len(tokens), kv_heads, head_dim] of
        tokens computed after before."""
        all_ = before + tokens
        n = len(all_)
        caches = self.model.new_cache(n, self.layout.block_size)
        idx = list(range(n))
        fw = self.model.run(all_, idx, caches, idx, Plan(active=idx, capture=True))
        lo = len(before)
        return torch.stack([torch.stack([k[lo:], v[lo:]]) for k, v in fw.kv])

    def _entry(self, tokens, ctx, kv: torch.Tensor) -> Entry:
        fp = self.fingerprint
        key = Key(fp, content_id(fp, tokens), ctx)
        return Entry.from_kv(key, tokens, to_numpy_kv(kv, self.model.spec.dtype), self.model.spec.dtype)

    def store(self, chunks, context: str = "prefix", *, window: int = 0, prefix=None) -> "list[Key]":
        """Encodes chunks with the model and stores them; returns their keys.

        context says what each chunk is encoded after: "prefix" the
        chunks before it (one prompt cut into consecutive segments: each
        entry is EXACT for a prompt that starts with the same chunks);
        "standalone" nothing; "window" the last `window` tokens before it
        (in this list; a window that holds all of them is the prefix
        encoding and keyed so); "after" the given `prefix` tokens (one
        segment, such as a system prompt: EXACT for a chunk right after that
        segment, APPROXIMATE elsewhere)."""
        cs = _chunks(chunks, "Mesh.store")
        if context not in CONTEXTS:
            raise UsageError(f"Mesh.store: context {context!r}: want one of {', '.join(CONTEXTS)}")
        if context == "window" and (not _is_int(window) or window <= 0):
            raise UsageError(f"Mesh.store: context 'window' needs window=w, a positive int (got {window!r})")
        if context != "window" and window:
            raise UsageError(f"Mesh.store: window= is for context 'window', not {context!r}")
        if context == "after":
            if prefix is None:
                raise UsageError("Mesh.store: context 'after' needs prefix=tokens (what every chunk follows)")
            prefix = tokens_array(prefix, "Mesh.store: prefix").tolist()
        elif prefix is not None:
            raise UsageError(f"Mesh.store: prefix= is for context 'after', not {context!r}")
        fp = self.fingerprint
        ents = []
        with self._lock:
            if context == "prefix":
                ctxs, _ = prefix_chain(fp, cs)
                kv = self._encode([], [t for c in cs for t in c])
                lo = 0
                for c, x in zip(cs, ctxs, strict=True):
                    ents.append(self._entry(c, x, kv[:, :, lo:lo + len(c)]))
                    lo += len(c)
            else:
                flat: list = []
                for i, c in enumerate(cs):
                    if context == "standalone":
                        before, ctx = [], standalone_context()
                    elif context == "window":
                        before, ctx = flat[max(0, len(flat) - window):], window_or_prefix(fp, window, cs[:i])
                    else:
                        _, end = prefix_chain(fp, [prefix] if prefix else [])
                        before, ctx = prefix, (prefix_context(end) if prefix else standalone_context())
                    ents.append(self._entry(c, ctx, self._encode(before, c)))
                    flat += c
        self._put(ents, strict=True)
        return [e.key for e in ents]

    def _put(self, ents: "list[Entry]", strict: bool) -> "list[Key]":
        """Puts ents concurrently (the client is thread-safe); returns the
        keys stored. strict: the first failure raises; otherwise failures
        are logged and skipped (write-back is best effort)."""
        if not ents:
            return []
        with concurrent.futures.ThreadPoolExecutor(min(8, len(ents))) as ex:
            futs = [ex.submit(self.client.put, e) for e in ents]
        stored = []
        for e, f in zip(ents, futs, strict=True):
            try:
                f.result()
                stored.append(e.key)
            except KvmeshError as err:
                if strict:
                    raise
                log.warning("kvmesh: write-back of %s failed: %s", e.key, err)
        return stored

    # -- prefill -------------------------------------------------------------

    def prefill(self, chunks, query, approximate: str = "recompute", recompute: float = 0.15, bound: float = 0.5,
                write_back: bool = True, *, accept=("prefix", "window", "standalone"), check_layer: int = 1) -> Prefill:
        """Prefills the prompt chunks + query from the cluster (see the
        module's doc): returns the logits after it and what was reused.
        accept: the kinds of APPROXIMATE encodings to use ("prefix",
        "window", "standalone"); a chunk injected from another kind is
        computed as a miss. check_layer: the layer whose key deviation
        ranks tokens (Go's Request.CheckLayer)."""
        with self._lock:
            out, _, _ = self._prefill(chunks, query, approximate, recompute, bound, write_back, accept, check_layer, 0)
            self.last = out
        return out

    def generate(self, chunks, query, max_new_tokens: int = 8, stop=None, **options) -> "list[int]":
        """prefill(chunks, query, **options), then greedy decoding of up to
        max_new_tokens tokens, ending after a stop token (included; one ID
        or several). Mesh.last holds the prefill's Prefill."""
        if not _is_int(max_new_tokens) or max_new_tokens < 0:
            raise UsageError(f"Mesh.generate: max_new_tokens {max_new_tokens!r}: want a non-negative int")
        allowed = {"approximate", "recompute", "bound", "write_back", "accept", "check_layer"}
        bad = sorted(set(options) - allowed)
        if bad:
            raise UsageError(f"Mesh.generate: unknown option {bad[0]!r} (want {', '.join(sorted(allowed))})")
        o = dict(approximate="recompute", recompute=0.15, bound=0.5, write_back=True,
                 accept=("prefix", "window", "standalone"), check_layer=1) | options
        with self._lock:
            out, all_, caches = self._prefill(chunks, query, o["approximate"], o["recompute"], o["bound"],
                                              o["write_back"], o["accept"], o["check_layer"], max_new_tokens)
            self.last = out
            return self.model.decode(all_, out.logits, caches, list(range(len(all_))), max_new_tokens, stop)

    def _prefill(self, chunks, query, approximate, recompute, bound, write_back, accept, check_layer, extra):
        t0 = time.perf_counter()
        cs = _chunks(chunks, "Mesh.prefill")
        q = tokens_array(query, "Mesh.prefill: query").tolist()
        if approximate not in APPROXIMATE:
            raise UsageError(f"Mesh.prefill: approximate {approximate!r}: want one of {', '.join(APPROXIMATE)}")
        for name, v in (("recompute", recompute), ("bound", bound)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise UsageError(f"Mesh.prefill: {name} {v!r}: want a finite number >= 0")
        if recompute > 1:
            raise UsageError(f"Mesh.prefill: recompute {recompute!r}: want a fraction in [0, 1]")
        if isinstance(accept, str):
            accept = (accept,)
        kinds = set()
        for a in accept:
            if a not in _KINDS:
                raise UsageError(f"Mesh.prefill: accept {a!r}: want kinds among prefix, window, standalone")
            kinds.add(_KINDS[a])
        if not _is_int(check_layer) or check_layer < 0:
            raise UsageError(f"Mesh.prefill: check_layer {check_layer!r}: want a non-negative int")
        all_ = [t for c in cs for t in c] + q
        n = len(all_)
        if n == 0:
            raise UsageError("Mesh.prefill: empty prompt")
        if n + extra > self.layout.slots:
            raise UsageError(f"Mesh.prefill: {n} prompt tokens + {extra} to generate exceed the cache's "
                             f"{self.layout.slots} slots (Mesh.connect(cache_tokens=...))")
        if n + extra > self.model.max_positions:
            raise UsageError(f"Mesh.prefill: {n + extra} positions exceed the model's max_positions "
                             f"{self.model.max_positions}")
        fp, model = self.fingerprint, self.model
        ctxs, _ = prefix_chain(fp, cs)
        starts = np.cumsum([0] + [len(c) for c in cs]).tolist()
        # Slot i holds position i: one prompt at a time, from block 0.
        reqs = [InjectChunk(content_id(fp, c), c, x, starts[i], list(range(starts[i], starts[i] + len(c))))
                for i, (c, x) in enumerate(zip(cs, ctxs, strict=True))]
        matches = [Match.MISS] * len(cs)
        keys: list = [None] * len(cs)
        t1 = time.perf_counter()
        if reqs:
            try:
                res = self._injector.inject(reqs)
                matches, keys = list(res.matches), list(res.keys)
            except KvmeshError as e:
                # A cluster that cannot answer means a full prefill, as in Go's engine.
                log.warning("kvmesh: inject failed, prefilling: %s", e)
        for i, m in enumerate(matches):
            if m == Match.APPROXIMATE and keys[i].context.kind not in kinds:
                matches[i], keys[i] = Match.MISS, None
        t_inject = time.perf_counter() - t1
        if self._dev is not self._host:
            hit = [s for i, c in enumerate(cs) if matches[i] != Match.MISS for s in range(starts[i], starts[i] + len(c))]
            if hit:
                ix = torch.as_tensor(hit)
                for h, d in zip(self._host, self._dev, strict=True):
                    model._write(d, 0, ix.to(model.device), model._read(h, 0, ix).to(model.device))
                    model._write(d, 1, ix.to(model.device), model._read(h, 1, ix).to(model.device))
        t2 = time.perf_counter()
        r = recompute if approximate in ("recompute", "bound") else 0.0
        b = bound if approximate == "bound" else 0.0
        repairs = r > 0 or b > 0
        state = []
        group = []
        for i, c in enumerate(cs):
            state += [matches[i]] * len(c)
            group += [i] * len(c)
        state += [Match.MISS] * len(q)
        group += [-1] * len(q)
        state[-1] = Match.MISS  # the last token's hidden state gives the logits
        active = [t for t, m in enumerate(state) if m == Match.MISS or (m == Match.APPROXIMATE and repairs)]
        approx = [state[t] == Match.APPROXIMATE for t in active]
        plan = Plan(active=active, capture=write_back)
        n_approx = sum(approx)
        if n_approx:
            plan.approx, plan.group, plan.groups = approx, [group[t] for t in active], len(cs)
            plan.check = check_layer or 1
            plan.keep, plan.bound = int(math.ceil(r * n_approx)), b
        fw = model.run(all_, list(range(n)), self._dev, list(range(n)), plan)
        t3 = time.perf_counter()
        out = Prefill(fw.logits, matches, 0, n, {}, keys, [0.0] * len(cs), [], fw.token_layers)
        if fw.deviation:
            out.deviations = list(fw.deviation)
            out.fallbacks = [i for i, f in enumerate(fw.fallback) if f]
        full = set()
        if fw.computed:
            full = set(fw.computed[0].tolist())
            for cl in fw.computed[1:]:
                full &= set(cl.tolist())
        out.computed_tokens = len(active) - n_approx + fw.selected
        if write_back:
            out.stored = self._write_back(cs, ctxs, starts, matches, all_, fw, full)
        t4 = time.perf_counter()
        out.timings = {"inject": t_inject, "compute": t3 - t2, "write_back": t4 - t3, "total": t4 - t0}
        return out, all_, self._dev

    def _write_back(self, cs, ctxs, starts, matches, all_, fw, full) -> "list[Key]":
        """Stores each chunk computed in every layer whose preceding tokens
        all hold exact KV (EXACT hits, or computed in full after such): its
        KV is then the prefix encoding, EXACT for the next identical prompt."""
        exact_upto = 0
        for i, c in enumerate(cs):
            lo, hi = starts[i], starts[i] + len(c)
            if exact_upto < lo:
                break
            if matches[i] == Match.EXACT or all(t in full for t in range(lo, hi)):
                exact_upto = hi
            else:
                break
        rows = [{int(t): r for r, t in enumerate(cl.tolist())} for cl in fw.computed]
        ents = []
        for i, c in enumerate(cs):
            lo, hi = starts[i], starts[i] + len(c)
            if hi > exact_upto:
                break
            if matches[i] == Match.EXACT:
                continue
            kv = torch.stack([torch.stack([k[[rw[t] for t in range(lo, hi)]], v[[rw[t] for t in range(lo, hi)]]])
                              for (k, v), rw in zip(fw.kv, rows, strict=True)])
            ents.append(self._entry(c, ctxs[i], kv))
        return self._put(ents, strict=False)

