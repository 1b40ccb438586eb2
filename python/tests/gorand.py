"""Go's math/rand/v2 PCG source and engine.RandomTensors, so the Python
tests rebuild the Go tests' random-weight models bit for bit from a seed
(engine/testdata/python_logits.json holds what the engine computed)."""

from __future__ import annotations

import math

import numpy as np

M64 = (1 << 64) - 1
_MUL = (2549297995355413924 << 64) | 4865540595714422341
_INC = (6364136223846793005 << 64) | 1442695040888963407


class PCG:
    """rand.NewPCG(seed1, seed2): a 128-bit LCG with the DXSM output."""

    def __init__(self, seed1: int, seed2: int):
        self.state = (seed1 << 64) | seed2

    def uint64(self) -> int:
        self.state = (self.state * _MUL + _INC) & ((1 << 128) - 1)
        hi, lo = self.state >> 64, self.state & M64
        hi ^= hi >> 32
        hi = (hi * 0xDA942042E4DD58B5) & M64
        hi ^= hi >> 48
        return (hi * (lo | 1)) & M64

    def float64(self) -> float:
        return (self.uint64() & ((1 << 53) - 1)) / (1 << 53)  # float64(x<<11>>11) / (1 << 53)


def tensor_shapes(cfg: dict) -> "dict[str, tuple]":
    """engine.tensorShapes of a config.json dict."""
    import kvmesh.hfconfig as hf
    from kvmesh.torch.llama import _shapes
    return _shapes(hf.parse(cfg))


def random_tensors(cfg: dict, seed: int) -> "dict[str, np.ndarray]":
    """engine.RandomTensors(c, seed, 0) for float32 weights."""
    rng = PCG(seed, 0x6B766D657368)
    out = {}
    for n, shape in sorted(tensor_shapes(cfg).items()):
        size = int(np.prod(shape))
        f = rng.float64
        if len(shape) == 1 and n.endswith(".weight"):
            vals = [1 + 0.1 * (2 * f() - 1) for _ in range(size)]
        elif len(shape) == 1:
            vals = [0.1 * (2 * f() - 1) for _ in range(size)]
        else:
            a = math.sqrt(3) if n == "model.embed_tokens.weight" else math.sqrt(3 / shape[1])
            vals = [a * (2 * f() - 1) for _ in range(size)]
        out[n] = np.asarray(vals, dtype=np.float64).astype(np.float32).reshape(shape)
    return out
