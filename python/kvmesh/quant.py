"""Decoders of the quantizing codecs (int8, int4, fp8), vectorised in
numpy, giving the same bits as Go's chunk package (codec_quant.go states
the format): per layer the K half then the V half, each its group
parameters then its codes in the canonical element order. K groups are 64
tokens of one (head, dim) channel, ordered [token group][channel]; V groups
are 64 dims of one token and head, ordered [token][head][dim group]. int8
and int4 store (zero, scale) per group, fp8 a scale, all in the entry
dtype. An element decodes to zero + code*scale (fp8: e4m3(code)*scale) in
float64, clamped to the dtype's finite range, rounded to float32 and then
to the dtype, to nearest even.
"""

from __future__ import annotations

import numpy as np

from .errors import CorruptEntry
from .keys import DType

GROUP_TOKENS = GROUP_DIMS = 64
INT8, INT4, FP8 = "int8", "int4", "fp8"

_MAX_FINITE = {DType.F32: float(np.finfo(np.float32).max), DType.F16: 65504.0,
               DType.BF16: float(np.frombuffer(np.array([0x7F7F0000], "<u4").tobytes(), "<f4")[0])}


def _fp8_table() -> np.ndarray:
    """e4m3fn (bias 7, 0x7f and 0xff NaN) of every byte, as float64."""
    b = np.arange(256, dtype=np.uint32)
    sign = np.where(b & 0x80, -1.0, 1.0)
    exp, man = (b >> 3) & 0xF, b & 7
    val = np.where(exp == 0, man / 512.0, (1 + man / 8.0) * np.exp2(exp.astype(np.float64) - 7))
    return sign * val


_FP8 = _fp8_table()


def _load(p: np.ndarray, dt: DType) -> np.ndarray:
    """Parameters stored in dt, widened to float64."""
    if dt is DType.F32:
        return p.view("<f4").astype(np.float64)
    if dt is DType.F16:
        return p.view("<f2").astype(np.float64)
    return (p.view("<u2").astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def _narrow(v: np.ndarray, dt: DType) -> np.ndarray:
    """float64 values, clamped, to dt bits (as Go's clampF32 + fromF32)."""
    lim = _MAX_FINITE[dt]
    f = np.clip(v, -lim, lim).astype(np.float32)
    if dt is DType.F32:
        return f
    if dt is DType.F16:
        return f.astype(np.float16)
    u = f.view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _codes(raw: np.ndarray, n: int, kind: str) -> np.ndarray:
    if kind != INT4:
        return raw[:n]
    out = np.empty(2 * len(raw), dtype=np.uint8)
    out[0::2], out[1::2] = raw & 15, raw >> 4
    return out[:n]


def _params(p: np.ndarray, groups: int, kind: str, dt: DType):
    es = dt.size
    if kind == FP8:
        zero, scale = np.zeros(groups), _load(p, dt)
    else:
        pv = p.reshape(groups, 2, es)
        zero, scale = _load(np.ascontiguousarray(pv[:, 0]).reshape(-1), dt), _load(np.ascontiguousarray(pv[:, 1]).reshape(-1), dt)
    if not (np.isfinite(zero).all() and np.isfinite(scale).all() and (scale >= 0).all()):
        raise CorruptEntry(f"{kind} group parameters not finite or negative")
    return zero, scale


def _dequant(q: np.ndarray, zero: np.ndarray, scale: np.ndarray, kind: str) -> np.ndarray:
    if kind == FP8:
        if ((q & 0x7F) == 0x7F).any():
            raise CorruptEntry("fp8 NaN code")
        return _FP8[q] * scale
    return zero + q.astype(np.float64) * scale


def decode_layer(enc, kind: str, dt: DType, tokens: int, heads: int, dim: int) -> bytes:
    """One encoded layer to its raw bytes [K|V][token][head][dim]."""
    chans = heads * dim
    elems = tokens * chans
    kgroups = -(-tokens // GROUP_TOKENS)
    vgroups = -(-dim // GROUP_DIMS)
    kg, vg = kgroups * chans, tokens * heads * vgroups
    ps = (1 if kind == FP8 else 2) * dt.size
    cb = (elems + 1) // 2 if kind == INT4 else elems
    enc = np.frombuffer(enc, dtype=np.uint8)
    if len(enc) != ps * (kg + vg) + 2 * cb:
        raise CorruptEntry(f"{kind} layer of {len(enc)} bytes, want {ps * (kg + vg) + 2 * cb}")
    kp, rest = enc[:kg * ps], enc[kg * ps:]
    kc, rest = rest[:cb], rest[cb:]
    vp, vc = rest[:vg * ps], rest[vg * ps:]
    if kind == INT4 and elems % 2 == 1 and (kc[-1] >> 4 or vc[-1] >> 4):
        raise CorruptEntry("int4 padding nibble set")
    # K: per channel, per group of 64 tokens.
    zero, scale = _params(kp, kg, kind, dt)
    tg = np.arange(tokens) // GROUP_TOKENS
    q = _codes(kc, elems, kind).reshape(tokens, chans)
    k = _dequant(q, zero.reshape(kgroups, chans)[tg], scale.reshape(kgroups, chans)[tg], kind)
    # V: per token and head, per group of 64 dims.
    zero, scale = _params(vp, vg, kind, dt)
    dg = np.arange(dim) // GROUP_DIMS
    q = _codes(vc, elems, kind).reshape(tokens, heads, dim)
    v = _dequant(q, zero.reshape(tokens, heads, vgroups)[:, :, dg], scale.reshape(tokens, heads, vgroups)[:, :, dg], kind)
    return _narrow(k, dt).tobytes() + _narrow(v, dt).tobytes()
