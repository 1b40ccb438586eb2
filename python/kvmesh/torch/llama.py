"""A Llama-family decoder in PyTorch over a paged KV cache, loaded from a
Hugging Face checkpoint directory: the Python twin of Go's engine package.

LlamaModel.from_pretrained reads config.json (as Go's hfconfig does:
Llama, Mistral, Qwen2 with q/k/v bias, Qwen3 with q/k norm; default,
linear, dynamic, llama3 and YaRN RoPE; NeoX or GPT-J pairs; partial rotary)
and the safetensors checkpoint (one file or shards, HF tensor names, F32,
F16 or BF16), and runs the forward pass on CPU or CUDA tensors. RoPE follows
cudakern exactly (inv_freq in float64 rounded once to float32, the angle a
float32 product, cos and sin rounded from float64), so the keys it writes
are the keys the node writes when it injects a chunk, and its logits match
the Go engine's to float32 rounding (python/tests/test_llama.py checks the
engine's own outputs, engine/testdata/python_logits.json).

The paged cache is one tensor per layer, [2, num_blocks, block_size,
kv_heads, head_dim] (NHD, cudakern's and vLLM FlashAttention's layout) or
[2, num_blocks, kv_heads, block_size, head_dim] (HND), or a view of a cache
of any other order as one of these (CacheLayout.canonical); a token's slot
is block * block_size + offset (kvmesh.torch.cache_tensor gives such tensors
over a PagedCache the node fills). The forward pass writes each computed
token's post-RoPE K and V into its slot and attends over the slots of the
sequence so far, in position order.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Sequence

import numpy as np
import torch
import xxhash

from .. import hfconfig, safetensors
from ..errors import ModelError, UsageError
from ..keys import DType, ModelSpec, RopeStyle, _is_int, tokens_array

__all__ = ["LlamaModel", "Plan", "rope_inv_freq"]

# The families whose forward pass is implemented (Go's engine runs the same
# set); hfconfig also reads the mixture-of-experts ones, which are refused.
RUNS = ("llama", "mistral", "qwen2", "qwen3")


def rope_inv_freq(spec: ModelSpec, seq_len: int) -> "tuple[np.ndarray, float]":
    """The float64 inverse frequencies (rotary/2 of them) and the attention
    factor of spec, as cudakern.invFreq computes them (transformers'
    modeling_rope_utils); seq_len is dynamic NTK's sequence length."""
    dim = spec.rotary
    half = dim // 2
    base = float(spec.rope_theta)
    sc = spec.scaling
    i = np.arange(half, dtype=np.float64)

    def default(b):
        return 1.0 / np.power(b, 2 * i / dim)

    attn = 1.0
    t = sc.type
    if t in ("", "default"):
        inv = default(base)
    elif t == "linear":
        inv = default(base) / sc.factor
    elif t == "dynamic":
        l = float(max(seq_len, sc.max_positions))
        mp = float(sc.max_positions)
        b = base * math.pow(sc.factor * l / mp - (sc.factor - 1), dim / (dim - 2)) if dim > 2 else float("nan")
        if not (b > 1) or math.isinf(b):
            raise ModelError(f"dynamic NTK base {b} for rotary dim {dim}")
        inv = default(b)
    elif t == "llama3":
        inv = default(base)
        old = float(sc.original_max_positions)
        low_wl, high_wl = old / sc.low_freq_factor, old / sc.high_freq_factor
        out = inv.copy()
        for j, f in enumerate(inv):
            wl = 2 * math.pi / f
            if wl > low_wl:
                out[j] = f / sc.factor
            elif wl < high_wl:
                out[j] = f
            else:
                s = (old / wl - sc.low_freq_factor) / (sc.high_freq_factor - sc.low_freq_factor)
                out[j] = (1 - s) * f / sc.factor + s * f
        inv = out
    elif t == "yarn":
        beta_fast, beta_slow = sc.beta_fast or 32.0, sc.beta_slow or 1.0
        omax = float(sc.original_max_positions)

        def corr(rot):
            return dim * math.log(omax / (rot * 2 * math.pi)) / (2 * math.log(base))

        low = max(math.floor(corr(beta_fast)), 0.0)
        high = min(math.ceil(corr(beta_slow)), float(dim - 1))
        if low == high:
            high += 0.001
        out = np.empty(half)
        for j in range(half):
            pf = math.pow(base, 2 * j / dim)
            extra, inter = 1 / pf, 1 / (sc.factor * pf)
            ramp = min(max((j - low) / (high - low), 0.0), 1.0)
            ext = 1 - ramp
            out[j] = inter * (1 - ext) + extra * ext
        inv = out
        attn = sc.attention_factor or (0.1 * math.log(sc.factor) + 1 if sc.factor > 1 else 1.0)
    else:
        raise ModelError(f"unsupported rope scaling {t!r}")
    if not (np.all(inv > 0) and np.all(np.isfinite(inv))):
        raise ModelError("rope inverse frequencies are not positive and finite")
    return inv, attn


def weights_revision(tensors: "dict[str, np.ndarray]") -> str:
    """Go's engine.weightsRevision: xxh64 over every tensor's name, shape
    (u32 each) and float32 bytes, in name order. It is the spec's
    weights_revision, so the same weights get the same fingerprint in Go
    and in Python."""
    h = xxhash.xxh64()
    for name in sorted(tensors):
        t = tensors[name]
        h.update(name.encode() + np.asarray(t.shape, dtype="<u4").tobytes())
        h.update(np.ascontiguousarray(t, dtype="<f4").tobytes())
    return f"xxh64:{h.intdigest():016x}"


def _shapes(c: hfconfig.Config) -> "dict[str, tuple]":
    """Every tensor the config implies, HF names and shapes (engine.tensorShapes)."""
    h, q, kv, f = c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.intermediate_size
    m = {"model.embed_tokens.weight": (c.vocab_size, h), "model.norm.weight": (h,)}
    if not c.tie_word_embeddings:
        m["lm_head.weight"] = (c.vocab_size, h)
    for l in range(c.num_layers):
        p = f"model.layers.{l}."
        m[p + "input_layernorm.weight"] = (h,)
        m[p + "post_attention_layernorm.weight"] = (h,)
        m[p + "self_attn.q_proj.weight"] = (q, h)
        m[p + "self_attn.k_proj.weight"] = (kv, h)
        m[p + "self_attn.v_proj.weight"] = (kv, h)
        m[p + "self_attn.o_proj.weight"] = (h, q)
        if c.attention_bias:
            m[p + "self_attn.q_proj.bias"] = (q,)
            m[p + "self_attn.k_proj.bias"] = (kv,)
            m[p + "self_attn.v_proj.bias"] = (kv,)
        if c.output_bias:
            m[p + "self_attn.o_proj.bias"] = (h,)
        if c.qk_norm:
            m[p + "self_attn.q_norm.weight"] = (c.head_dim,)
            m[p + "self_attn.k_norm.weight"] = (c.head_dim,)
        m[p + "mlp.gate_proj.weight"] = (f, h)
        m[p + "mlp.up_proj.weight"] = (f, h)
        m[p + "mlp.down_proj.weight"] = (h, f)
    return m


@dataclasses.dataclass
class Plan:
    """What one forward pass over a sequence computes (Go's fwdPlan).

    active: sequence indices computed in layer 0, ascending; the others
    must already have KV in the cache; the last token must be active.
    approx[r] marks active row r as an APPROXIMATE token: computed up to
    the check layer, then only if selected (the keep rows of highest key
    deviation, plus every row of a group whose relative deviation exceeds
    bound, when bound > 0). group[r] is row r's chunk (-1: none).
    capture: record the pre-RoPE K and V of every computed row."""

    active: "list[int]"
    approx: "list[bool] | None" = None
    group: "list[int] | None" = None
    groups: int = 0
    check: int = 1
    keep: int = 0
    bound: float = 0.0
    capture: bool = False
    # wait(l), if set, runs before layer l first reads or writes the cache
    # (a layer-wise load lands there); saved(l, k, v, slots) after layer l
    # wrote the computed rows' post-RoPE K and V (k and v are pre-RoPE K and
    # V of those rows [n, kv_heads, head_dim], slots their cache slots).
    wait: "object | None" = None
    saved: "object | None" = None


@dataclasses.dataclass
class Forward:
    """What a forward pass computed: the last row's logits, work done,
    per-group deviations and fallbacks, and (with capture) pre-RoPE K/V."""

    logits: torch.Tensor
    token_layers: int = 0
    selected: int = 0
    deviation: "list[float]" = dataclasses.field(default_factory=list)
    fallback: "list[bool]" = dataclasses.field(default_factory=list)
    # computed[l] is the set of sequence indices computed in layer l; kv[l]
    # maps each to its (k, v) pre-RoPE [kv_heads, head_dim] rows.
    computed: "list[torch.Tensor]" = dataclasses.field(default_factory=list)
    kv: "list[tuple[torch.Tensor, torch.Tensor]]" = dataclasses.field(default_factory=list)


class LlamaModel(torch.nn.Module):
    """A Hugging Face Llama-family checkpoint as a forward pass over a
    paged KV cache. Make one with from_pretrained (or from_tensors)."""

    def __init__(self, config: hfconfig.Config, tensors: "dict[str, np.ndarray]", device="cpu", dtype=None,
                 tokenizer_id: str = "", max_positions: int = 0, kv_dtype=None):
        super().__init__()
        if not isinstance(config, hfconfig.Config):
            raise UsageError(f"LlamaModel: want a kvmesh.hfconfig.Config, got {type(config).__name__}")
        c = config
        if c.model_type not in RUNS:
            raise ModelError(f"model_type {c.model_type!r}: this runner implements {', '.join(RUNS)} "
                             "(mixture-of-experts families are not implemented)")
        if c.mlp_bias:
            raise ModelError("mlp_bias is not implemented")
        if c.hidden_act not in ("", "silu"):
            raise ModelError(f"hidden_act {c.hidden_act!r} is not implemented (want silu)")
        if c.intermediate_size <= 0 or c.vocab_size <= 0 or not c.rms_norm_eps > 0:
            raise ModelError("intermediate_size, vocab_size and rms_norm_eps must be positive")
        if c.model_type in ("qwen2",) and not c.attention_bias and "model.layers.0.self_attn.q_proj.bias" in tensors:
            # transformers' Qwen2 applies q/k/v biases whatever attention_bias says.
            c = dataclasses.replace(c, attention_bias=True)
        shapes = _shapes(c)
        for n in sorted(tensors):
            if n in shapes or n.endswith(".rotary_emb.inv_freq"):
                continue
            if (n == "lm_head.weight" and "model.embed_tokens.weight" in tensors
                    and np.array_equal(tensors[n], tensors["model.embed_tokens.weight"])):
                continue  # tied embeddings saved twice
            raise ModelError(f"checkpoint tensor {n!r} is not used by the model's config "
                             "(the model would compute without it)")
        for n, shp in shapes.items():
            if n not in tensors:
                raise ModelError(f"missing tensor {n!r}")
            if tuple(tensors[n].shape) != shp:
                raise ModelError(f"tensor {n!r} has shape {list(tensors[n].shape)}, config implies {list(shp)}")
        self.config = c
        self.device = torch.device(device)
        self.dtype = dtype if dtype is not None else torch.float32
        if self.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise UsageError(f"dtype {dtype!r}: want None (float32), torch.float32, torch.float16 or torch.bfloat16")
        kvd = DType.parse(kv_dtype if kv_dtype is not None else str(self.dtype))
        self.spec: ModelSpec = c.spec(kvd, weights_revision(tensors), tokenizer_id)
        self.spec.validate()
        self.max_positions = max_positions or min(max(c.max_position_embeddings, 8192), 32768)
        inv, attn = rope_inv_freq(self.spec, self.max_positions)
        self._inv = torch.from_numpy(inv.astype(np.float32))  # rounded once to float32, as cudakern
        self._attn = attn
        dev, dt = self.device, self.dtype

        def w(name):
            return torch.from_numpy(np.ascontiguousarray(tensors[name])).to(dev, dt)

        def opt(name):
            return w(name) if name in shapes else None

        self.embed = w("model.embed_tokens.weight")
        self.norm = w("model.norm.weight")
        self.lm_head = self.embed if c.tie_word_embeddings else w("lm_head.weight")
        self.layers = []
        for l in range(c.num_layers):
            p = f"model.layers.{l}."
            self.layers.append({k: opt(p + n) for k, n in (
                ("in_norm", "input_layernorm.weight"), ("post_norm", "post_attention_layernorm.weight"),
                ("q", "self_attn.q_proj.weight"), ("k", "self_attn.k_proj.weight"),
                ("v", "self_attn.v_proj.weight"), ("o", "self_attn.o_proj.weight"),
                ("qb", "self_attn.q_proj.bias"), ("kb", "self_attn.k_proj.bias"), ("vb", "self_attn.v_proj.bias"),
                ("ob", "self_attn.o_proj.bias"), ("q_norm", "self_attn.q_norm.weight"),
                ("k_norm", "self_attn.k_norm.weight"), ("gate", "mlp.gate_proj.weight"),
                ("up", "mlp.up_proj.weight"), ("down", "mlp.down_proj.weight"))})

    @classmethod
    def from_pretrained(cls, path: str, device="cpu", dtype=None, tokenizer_id: str = "",
                        max_positions: int = 0) -> "LlamaModel":
        """Loads a checkpoint directory: config.json and model.safetensors
        (or shards with model.safetensors.index.json), HF tensor names.
        device: where the weights and the forward pass live ("cpu",
        "cuda", a torch.device). dtype: the compute dtype; None computes in
        float32, as Go's engine does (exact), whatever the checkpoint
        stores. tokenizer_id goes into the model spec (and so into every
        chunk key); max_positions sizes RoPE as the engine's Config does
        (0: max(max_position_embeddings, 8192), at most 32768)."""
        if not isinstance(path, (str, os.PathLike)) or not os.path.isdir(path):
            raise UsageError(f"from_pretrained: want a checkpoint directory (config.json + safetensors), got {path!r}")
        cfg = hfconfig.load(os.fspath(path))
        return cls(cfg, safetensors.load_checkpoint(os.fspath(path)), device, dtype, tokenizer_id, max_positions)

    # -- geometry ------------------------------------------------------------

    @property
    def num_layers(self) -> int:
        return self.config.num_layers

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    def new_cache(self, tokens: int, block_size: int = 16) -> "list[torch.Tensor]":
        """A zeroed paged cache (NHD) with room for tokens slots, one tensor
        per layer on the model's device."""
        if not _is_int(tokens) or tokens <= 0 or not _is_int(block_size) or block_size <= 0:
            raise UsageError(f"new_cache: want positive ints, got tokens={tokens!r}, block_size={block_size!r}")
        nb = -(-tokens // block_size)
        c = self.config
        return [torch.zeros(2, nb, block_size, c.num_kv_heads, c.head_dim, device=self.device, dtype=self.dtype)
                for _ in range(c.num_layers)]

    # -- pieces of the forward pass ----------------------------------------

    def rope(self, positions: torch.Tensor) -> "tuple[torch.Tensor, torch.Tensor]":
        """cos and sin [T, rotary/2] (float32, on the device) of positions,
        as cudakern.RopeTable.fillRow: float32 angle, float64 cos/sin times
        the attention factor, rounded to float32."""
        p = positions.detach().to("cpu", torch.float32)
        ang = (p[:, None] * self._inv[None, :]).double()
        return ((ang.cos() * self._attn).float().to(self.device), (ang.sin() * self._attn).float().to(self.device))

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [T, heads, head_dim] rotated in float32 (cudakern's rotNeoX /
        rotGPTJ: each product rounded, then the sum)."""
        half = cos.shape[1]
        rot = 2 * half
        c, s = cos[:, None, :], sin[:, None, :]
        xf = x.float()
        if self.spec.rope_style == RopeStyle.NEOX:
            a, b = xf[..., :half], xf[..., half:rot]
            out = [a * c - b * s, b * c + a * s]
        else:
            a, b = xf[..., 0:rot:2], xf[..., 1:rot:2]
            out = [torch.stack([a * c - b * s, b * c + a * s], dim=-1).flatten(-2)]
        if rot < x.shape[-1]:
            out.append(xf[..., rot:])
        return torch.cat(out, dim=-1).to(x.dtype)

    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """RMSNorm over the last axis: the sum of squares in float64, as the
        engine's rmsNorm."""
        inv = torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + self.config.rms_norm_eps).to(x.dtype)
        return x * inv * w

    def _io(self, cache: torch.Tensor):
        """The layer's layout: NHD [2, nb, bs, H, D] or HND [2, nb, H, bs, D]."""
        c = self.config
        if cache.dim() != 5 or cache.shape[0] != 2 or cache.shape[-1] != c.head_dim:
            raise UsageError(f"cache layer of shape {tuple(cache.shape)}: want [2, blocks, block, {c.num_kv_heads}, "
                             f"{c.head_dim}] (NHD) or [2, blocks, {c.num_kv_heads}, block, {c.head_dim}] (HND)")
        if cache.shape[3] == c.num_kv_heads:
            return False, cache.shape[2]
        if cache.shape[2] == c.num_kv_heads:
            return True, cache.shape[3]
        raise UsageError(f"cache layer of shape {tuple(cache.shape)} does not hold {c.num_kv_heads} kv heads")

    def _read(self, cache, half, slots):
        hnd, bs = self._io(cache)
        b, o = slots // bs, slots % bs
        return cache[half, b, :, o] if hnd else cache[half, b, o]

    def _write(self, cache, half, slots, x):
        hnd, bs = self._io(cache)
        b, o = slots // bs, slots % bs
        if hnd:
            cache[half, b, :, o] = x.to(cache.dtype)
        else:
            cache[half, b, o] = x.to(cache.dtype)

    # -- forward -------------------------------------------------------------

    @torch.no_grad()
    def run(self, tokens, positions, caches: "Sequence[torch.Tensor]", seq_slots, plan: Plan) -> Forward:
        """One forward pass over a sequence (tokens, their positions and
        cache slots) computing what plan says; the last row's logits."""
        c = self.config
        dev = self.device
        toks = torch.as_tensor(tokens_array(tokens, "run: tokens"), device=dev)
        n_seq = len(toks)
        pos = torch.as_tensor(np.asarray(positions, dtype=np.int64))
        sslots = torch.as_tensor(np.asarray(seq_slots, dtype=np.int64), device=dev)
        if len(pos) != n_seq or len(sslots) != n_seq:
            raise UsageError(f"run: {n_seq} tokens, {len(pos)} positions and {len(sslots)} slots: want one each")
        if len(caches) != c.num_layers:
            raise UsageError(f"run: {len(caches)} cache layers for a {c.num_layers}-layer model")
        active = torch.as_tensor(list(plan.active), dtype=torch.long)
        if len(active) == 0 or int(active[-1]) != n_seq - 1:
            raise UsageError("run: the plan must compute the sequence's last token")
        approx = torch.as_tensor(plan.approx, dtype=torch.bool) if plan.approx is not None else None
        group = torch.as_tensor(plan.group, dtype=torch.long) if plan.group is not None else None
        check = min(max(plan.check, 1), c.num_layers - 1) if approx is not None else -1
        out = Forward(logits=torch.empty(0))
        H, KH, D = c.num_heads, c.num_kv_heads, c.head_dim
        scale = 1 / math.sqrt(D)
        cos_all, sin_all = self.rope(pos)
        h = self.embed[toks[active.to(dev)]]
        for l, lw in enumerate(self.layers):
            if approx is not None and l == check + 1:
                keep = self._select(active, approx, group, plan, dev_sum, norm_sum, out)
                active, h = active[keep], h[keep.to(dev)]
                approx = approx[keep]
                group = group[keep] if group is not None else None
            n = len(active)
            out.token_layers += n
            act = active.to(dev)
            x = self._rms(h, lw["in_norm"])
            q = torch.nn.functional.linear(x, lw["q"], lw["qb"]).view(n, H, D)
            k = torch.nn.functional.linear(x, lw["k"], lw["kb"]).view(n, KH, D)
            v = torch.nn.functional.linear(x, lw["v"], lw["vb"]).view(n, KH, D)
            if c.qk_norm:
                q, k = self._rms(q, lw["q_norm"]), self._rms(k, lw["k_norm"])
            if plan.capture:
                out.computed.append(active.clone())
                out.kv.append((k.clone(), v.clone()))
            cs, sn = cos_all[active], sin_all[active]
            k_pre_rope = k
            q, k = self._rotate(q, cs, sn), self._rotate(k, cs, sn)
            cache = caches[l]
            slots = sslots[act]
            if plan.wait is not None:
                plan.wait(l)
            if l == check:
                old = self._read(cache, 0, slots).float()
                kf = k.float()
                dev_sum = (kf - old).double().pow(2).sum((1, 2)).cpu()
                norm_sum = kf.double().pow(2).sum((1, 2)).cpu()
            k_pre = k_pre_rope if plan.saved is not None else None
            self._write(cache, 0, slots, k)
            self._write(cache, 1, slots, v)
            if plan.saved is not None:
                plan.saved(l, k_pre, v, slots)
            K = self._read(cache, 0, sslots).to(q.dtype)  # [S, KH, D], the whole sequence
            V = self._read(cache, 1, sslots).to(q.dtype)
            g = H // KH
            if g > 1:
                K, V = K.repeat_interleave(g, dim=1), V.repeat_interleave(g, dim=1)
            scores = torch.einsum("nhd,shd->hns", q, K) * scale
            mask = torch.arange(n_seq, device=dev)[None, :] > act[:, None]
            if c.sliding_window > 0:
                mask |= torch.arange(n_seq, device=dev)[None, :] <= act[:, None] - c.sliding_window
            scores = scores.masked_fill(mask[None], float("-inf"))
            att = torch.einsum("hns,shd->nhd", scores.softmax(-1), V).reshape(n, H * D)
            h = h + torch.nn.functional.linear(att, lw["o"], lw["ob"])
            x = self._rms(h, lw["post_norm"])
            gu = torch.nn.functional.silu(torch.nn.functional.linear(x, lw["gate"])) * torch.nn.functional.linear(x, lw["up"])
            h = h + torch.nn.functional.linear(gu, lw["down"])
        last = self._rms(h[-1:], self.norm)
        out.logits = torch.nn.functional.linear(last, self.lm_head)[0].float()
        return out

    def _select(self, active, approx, group, plan: Plan, dev_sum, norm_sum, out: Forward) -> torch.Tensor:
        """Go's selectTokens: keep every non-approximate row, every row of a
        group over the bound, and the plan.keep other approximate rows of
        highest key deviation (stable order on ties)."""
        if plan.groups > 0:
            d = [0.0] * plan.groups
            nn_ = [0.0] * plan.groups
            for r in range(len(active)):
                gr = int(group[r])
                if approx[r] and gr >= 0:
                    d[gr] += float(dev_sum[r])
                    nn_[gr] += float(norm_sum[r])
            out.deviation = [math.sqrt(a / b) if b > 0 else 0.0 for a, b in zip(d, nn_, strict=True)]
            out.fallback = [plan.bound > 0 and x > plan.bound for x in out.deviation]
        chosen = [False] * len(active)
        cand = []
        for r in range(len(active)):
            gr = int(group[r]) if group is not None else -1
            if not approx[r]:
                chosen[r] = True
            elif gr >= 0 and out.fallback[gr]:
                chosen[r] = True
                out.selected += 1
            else:
                cand.append(r)
        cand.sort(key=lambda r: -float(dev_sum[r]))
        for r in cand[:min(plan.keep, len(cand))]:
            chosen[r] = True
            out.selected += 1
        return torch.as_tensor([r for r in range(len(active)) if chosen[r]], dtype=torch.long)

    @torch.no_grad()
    def forward(self, tokens, positions, caches: "Sequence[torch.Tensor]", slots, seq_slots) -> torch.Tensor:
        """Runs tokens at positions, writing their post-RoPE K and V into
        slots of the per-layer caches and attending over seq_slots (the
        slots of the sequence's positions 0..len-1, in order; the tokens
        are its last len(tokens)); returns the last token's logits
        [vocab] (float32)."""
        t = tokens_array(tokens, "forward: tokens")
        sl = np.asarray(seq_slots, dtype=np.int64)
        s = np.asarray(slots, dtype=np.int64)
        if len(s) != len(t) or len(np.asarray(positions)) != len(t):
            raise UsageError(f"forward: {len(t)} tokens, {len(np.asarray(positions))} positions, {len(s)} slots: "
                             "want one each")
        if len(sl) < len(t) or not np.array_equal(sl[len(sl) - len(t):], s):
            raise UsageError("forward: seq_slots must end with the slots of the tokens computed")
        n0 = len(sl) - len(t)
        # Tokens before the computed ones are never read by id: zeros stand in.
        full = np.concatenate([np.zeros(n0, dtype=np.int64), t])
        p = np.asarray(positions, dtype=np.int64)
        p_full = np.concatenate([p[0] - n0 + np.arange(n0), p]) if n0 else p
        return self.run(full, p_full, caches, sl, Plan(active=list(range(n0, len(sl))))).logits

    @torch.no_grad()
    def prefill(self, tokens, caches=None) -> torch.Tensor:
        """Logits [vocab] after tokens, computed in full from position 0
        (into caches, or a fresh cache)."""
        t = tokens_array(tokens, "prefill: tokens")
        if len(t) == 0:
            raise UsageError("prefill: no tokens")
        caches = caches if caches is not None else self.new_cache(len(t))
        idx = list(range(len(t)))
        return self.run(t, idx, caches, idx, Plan(active=idx)).logits

    @torch.no_grad()
    def generate(self, tokens, max_new_tokens: int, stop=None) -> "list[int]":
        """Greedy continuation of tokens: up to max_new_tokens tokens, ending
        early after a stop token (included); stop is one token ID or several.
        The plain baseline a kvmesh prefill is compared with."""
        t = tokens_array(tokens, "generate: tokens").tolist()
        if not t:
            raise UsageError("generate: no tokens")
        if not _is_int(max_new_tokens) or max_new_tokens < 0:
            raise UsageError(f"generate: max_new_tokens {max_new_tokens!r}: want a non-negative int")
        caches = self.new_cache(len(t) + max_new_tokens + 1)
        logits = self.prefill(t, caches)
        return self.decode(t, logits, caches, list(range(len(t))), max_new_tokens, stop)

    def decode(self, tokens: "list[int]", logits: torch.Tensor, caches, seq_slots: "list[int]", max_new_tokens: int,
               stop=None, start_pos: int = 0) -> "list[int]":
        """Greedy decoding after a prefill of tokens (their KV in seq_slots of
        caches, logits the last one's): new tokens take the slots after
        max(seq_slots). Returns the generated tokens (a stop token included)."""
        stops = _stops(stop)
        out: list = []
        slots = list(seq_slots)
        nxt = max(slots) + 1 if slots else 0
        while len(out) < max_new_tokens:
            tok = int(torch.argmax(logits))
            out.append(tok)
            if tok in stops or len(out) == max_new_tokens:
                break
            slots.append(nxt)
            p = start_pos + len(slots) - 1
            logits = self.forward([tok], [p], caches, [nxt], slots)
            nxt += 1
        return out


def _stops(stop) -> "frozenset[int]":
    if stop is None:
        return frozenset()
    if _is_int(stop):
        return frozenset([int(stop)])
    try:
        s = frozenset(int(x) for x in stop)
    except (TypeError, ValueError):
        raise UsageError(f"stop {stop!r}: want a token ID, or a list of them") from None
    return s
