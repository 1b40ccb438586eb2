"""A Llama-architecture decoder in plain PyTorch (RMSNorm, SwiGLU,
grouped-query attention, NeoX RoPE) with the Hugging Face tensor names, and
a safetensors writer and reader, so the weights load in kvmesh's engine.
"""

import json
import math
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F


class Config:
    def __init__(self, vocab=512, hidden=128, inter=384, layers=4, heads=4, kv_heads=2,
                 head_dim=32, theta=10000.0, eps=1e-5, max_pos=1024):
        self.vocab, self.hidden, self.inter, self.layers = vocab, hidden, inter, layers
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.theta, self.eps, self.max_pos = theta, eps, max_pos

    def hf(self):
        return {
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": self.hidden, "intermediate_size": self.inter,
            "num_hidden_layers": self.layers, "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads, "head_dim": self.head_dim,
            "vocab_size": self.vocab, "rms_norm_eps": self.eps, "rope_theta": self.theta,
            "max_position_embeddings": self.max_pos, "tie_word_embeddings": False,
            "attention_bias": False, "hidden_act": "silu", "torch_dtype": "float32",
        }

    @staticmethod
    def from_hf(h):
        return Config(vocab=h["vocab_size"], hidden=h["hidden_size"], inter=h["intermediate_size"],
                      layers=h["num_hidden_layers"], heads=h["num_attention_heads"],
                      kv_heads=h["num_key_value_heads"], head_dim=h["head_dim"],
                      theta=h["rope_theta"], eps=h["rms_norm_eps"], max_pos=h["max_position_embeddings"])


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(c, n, device=None):
    inv = 1.0 / (c.theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float32) / c.head_dim))
    f = torch.outer(torch.arange(n, dtype=torch.float32), inv)
    emb = torch.cat([f, f], dim=-1)
    return emb.cos().to(device), emb.sin().to(device)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(c.hidden, c.heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden, c.kv_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden, c.kv_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.heads * c.head_dim, c.hidden, bias=False)
        self.keep = False

    def forward(self, x, cos, sin):
        c = self.c
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, c.heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, c.kv_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, c.kv_heads, c.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = c.heads // c.kv_heads
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        # Debian's torch 1.13 has no scaled_dot_product_attention.
        att = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(c.head_dim))
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        if self.keep:
            self.att = att  # read by the training loop's attention loss
        y = att @ v
        return self.o_proj(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden, c.inter, bias=False)
        self.up_proj = nn.Linear(c.hidden, c.inter, bias=False)
        self.down_proj = nn.Linear(c.inter, c.hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden, c.eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden, c.eps)
        self.mlp = MLP(c)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Body(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab, c.hidden)
        self.layers = nn.ModuleList([Layer(c) for _ in range(c.layers)])
        self.norm = RMSNorm(c.hidden, c.eps)


class Llama(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.model = Body(c)
        self.lm_head = nn.Linear(c.hidden, c.vocab, bias=False)
        for n, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)
                if n.endswith("o_proj.weight") or n.endswith("down_proj.weight"):
                    p.data /= math.sqrt(2 * c.layers)

    def hidden(self, ids):
        """The final normed hidden states [batch, seq, hidden]."""
        t = ids.shape[1]
        cos, sin = rope(self.c, t, ids.device)
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return self.model.norm(x)

    def forward(self, ids):
        return self.lm_head(self.hidden(ids))


def save_safetensors(path, tensors, metadata=None):
    """Writes float32 tensors in the safetensors format (names sorted)."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().to(torch.float32).contiguous().cpu()
        b = t.numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def load_safetensors(path):
    import numpy as np
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        assert info["dtype"] == "F32"
        out[name] = torch.from_numpy(np.frombuffer(data[a:b], dtype=np.float32).copy()).view(info["shape"])
    return out


def save_hf(model, outdir, metadata=None):
    import os
    os.makedirs(outdir, exist_ok=True)
    with open(os.path.join(outdir, "config.json"), "w") as f:
        json.dump(model.c.hf(), f, indent=2)
        f.write("\n")
    save_safetensors(os.path.join(outdir, "model.safetensors"), model.state_dict(), metadata)


def load_hf(outdir):
    import os
    with open(os.path.join(outdir, "config.json")) as f:
        c = Config.from_hf(json.load(f))
    m = Llama(c)
    m.load_state_dict(load_safetensors(os.path.join(outdir, "model.safetensors")))
    return m
