"""Example models for trying kvmesh with PyTorch.

TinyLlama is a small Llama as plain torch modules: RMSNorm, grouped-query
attention with NeoX RoPE, SwiGLU MLP, in float32, with random weights. Its
attention reads and writes a paged KV cache (kvmesh.inject.PagedCache, NHD)
through a slot mapping, as vLLM's does, so the same code runs a full
prefill and a prompt whose chunks kvmesh injected. Module names follow
Hugging Face (layers[i].self_attn.k_proj, ...) so kvmesh.torch.KVCapture's
default patterns find the pre-RoPE keys and values. save_pretrained writes
it as a Hugging Face checkpoint that kvmesh.torch.LlamaModel loads.

    model = TinyLlama(seed=7)
    logits = model(tokens, positions, caches, slots, seq_slots)   # [T, vocab]
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import torch
from torch import nn

from ..keys import DType, ModelSpec, RopeStyle

__all__ = ["TinyLlama", "rope_tables", "rotate", "save_pretrained"]


def rope_tables(head_dim: int, theta: float, positions: int):
    """cos and sin [positions, head_dim/2] as the node computes them
    (cudakern.RopeTable): inv_freq in float64 rounded to float32, the angle
    a float32 product, cos and sin in float64 rounded to float32."""
    half = head_dim // 2
    inv = (1.0 / np.power(theta, np.arange(half, dtype=np.float64) * 2 / head_dim)).astype(np.float32)
    ang = (np.arange(positions, dtype=np.float32)[:, None] * inv[None, :]).astype(np.float64)
    return torch.from_numpy(np.cos(ang).astype(np.float32)), torch.from_numpy(np.sin(ang).astype(np.float32))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NeoX rotation of x [T, H, D] by per-token cos/sin [T, D/2]."""
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([a * c - b * s, b * c + a * s], dim=-1)


class RMSNorm(nn.Module):
    """x * rsqrt(mean(x^2) + eps) * weight."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    """Grouped-query attention over a paged cache (see TinyLlama.forward)."""

    def __init__(self, hidden, heads, kv_heads, head_dim):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)

    def forward(self, x, cos, sin, cache, slots, seq_slots, positions):
        T = x.shape[0]
        q = self.q_proj(x).view(T, self.heads, self.head_dim)
        k = self.k_proj(x).view(T, self.kv_heads, self.head_dim)  # pre-RoPE: what kvmesh stores
        v = self.v_proj(x).view(T, self.kv_heads, self.head_dim)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        flat = cache.view(2, -1, self.kv_heads, self.head_dim)  # [K|V][slot][head][dim]
        flat[0, slots] = k
        flat[1, slots] = v
        K, V = flat[0, seq_slots], flat[1, seq_slots]  # the whole sequence so far
        g = self.heads // self.kv_heads
        K, V = K.repeat_interleave(g, dim=1), V.repeat_interleave(g, dim=1)
        scores = torch.einsum("thd,shd->hts", q, K) / math.sqrt(self.head_dim)
        mask = torch.arange(len(seq_slots))[None, :] > positions[:, None]
        scores = scores.masked_fill(mask[None], float("-inf"))
        out = torch.einsum("hts,shd->thd", scores.softmax(-1), V)
        return self.o_proj(out.reshape(T, -1))


class Layer(nn.Module):
    """One decoder layer: attention and a SwiGLU MLP, each after an RMSNorm."""

    def __init__(self, hidden, heads, kv_heads, head_dim, ffn):
        super().__init__()
        self.input_layernorm = RMSNorm(hidden)
        self.self_attn = Attention(hidden, heads, kv_heads, head_dim)
        self.post_attention_layernorm = RMSNorm(hidden)
        self.gate_proj = nn.Linear(hidden, ffn, bias=False)
        self.up_proj = nn.Linear(hidden, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x, *attn_args):
        x = x + self.self_attn(self.input_layernorm(x), *attn_args)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(torch.nn.functional.silu(self.gate_proj(h)) * self.up_proj(h))


class TinyLlama(nn.Module):
    """A random-weight Llama (seed picks the weights); .spec is its
    kvmesh.ModelSpec."""

    def __init__(self, layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=128, vocab=512,
                 theta=10000.0, max_positions=4096, seed=0):
        super().__init__()
        self.shape = dict(layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim, ffn=ffn,
                          vocab=vocab, theta=theta, max_positions=max_positions)
        torch.manual_seed(seed)
        self.spec = ModelSpec("llama", layers, kv_heads, head_dim, DType.F32, RopeStyle.NEOX, theta,
                              weights_revision=f"tinyllama-test-seed{seed}", tokenizer_id="bytes")
        self.embed_tokens = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(Layer(hidden, heads, kv_heads, head_dim, ffn) for _ in range(layers))
        self.norm = RMSNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        self.cos, self.sin = rope_tables(head_dim, theta, max_positions)

    @torch.no_grad()
    def forward(self, tokens, positions, caches, slots, seq_slots):
        """Runs tokens at positions, writing their K (rotated) and V into
        slots of the per-layer caches and attending over seq_slots (the
        slots of positions 0..len-1); returns logits [T, vocab]."""
        tokens = torch.as_tensor(tokens)
        positions = torch.as_tensor(positions)
        slots, seq_slots = torch.as_tensor(slots), torch.as_tensor(seq_slots)
        x = self.embed_tokens(tokens)
        cos, sin = self.cos[positions], self.sin[positions]
        for layer, cache in zip(self.layers, caches):
            x = layer(x, cos, sin, cache, slots, seq_slots, positions)
        return self.lm_head(self.norm(x))


def save_pretrained(model: TinyLlama, path: str) -> None:
    """Writes model as a Hugging Face Llama checkpoint (config.json and
    model.safetensors, HF tensor names) that LlamaModel.from_pretrained
    loads: the same forward pass, over plain tensors."""
    from .. import safetensors
    sh = model.shape
    os.makedirs(path, exist_ok=True)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": sh["hidden"],
           "intermediate_size": sh["ffn"], "num_hidden_layers": sh["layers"], "num_attention_heads": sh["heads"],
           "num_key_value_heads": sh["kv_heads"], "head_dim": sh["head_dim"], "vocab_size": sh["vocab"],
           "rms_norm_eps": 1e-5, "rope_theta": sh["theta"], "max_position_embeddings": sh["max_positions"],
           "tie_word_embeddings": False, "torch_dtype": "float32"}
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    out = {}
    for name, t in model.state_dict().items():
        if name.startswith("layers."):
            i, rest = name.split(".", 2)[1:]
            if rest.split(".")[0] in ("gate_proj", "up_proj", "down_proj"):
                rest = "mlp." + rest
            name = f"model.layers.{i}.{rest}"
        elif name != "lm_head.weight":
            name = "model." + name
        out[name] = t.detach().cpu().numpy()
    safetensors.write(os.path.join(path, "model.safetensors"), out, {"format": "pt"})
