#!/usr/bin/env python3
"""Writes invfreq_golden.json: inv_freq (float32 bits) and attention factors
for a few specs, transcribed from transformers' modeling_rope_utils with the
standard library only (float64 math, rounded to float32 at the end).
Run: python3 invfreq_golden.py > invfreq_golden.json"""
import json, math, struct

def f32bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]

def default(base, dim):
    return [1.0 / (base ** (i / dim)) for i in range(0, dim, 2)]

def linear(base, dim, factor):
    return [f / factor for f in default(base, dim)], 1.0

def llama3(base, dim, factor, low, high, old):
    inv = default(base, dim)
    low_wl, high_wl = old / low, old / high
    out = []
    for f in inv:
        wl = 2 * math.pi / f
        llama = f / factor if wl > low_wl else f
        if not (wl < high_wl) and not (wl > low_wl):
            s = (old / wl - low) / (high - low)
            llama = (1 - s) * llama / factor + s * llama
        out.append(llama)
    return out, 1.0

def yarn(base, dim, factor, omax, beta_fast=32, beta_slow=1, attn=None):
    def get_mscale(scale, mscale=1):
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0
    if attn is None:
        attn = get_mscale(factor)
    def cd(rot):
        return (dim * math.log(omax / (rot * 2 * math.pi))) / (2 * math.log(base))
    low, high = max(math.floor(cd(beta_fast)), 0), min(math.ceil(cd(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    out = []
    for j, i in enumerate(range(0, dim, 2)):
        pf = base ** (i / dim)
        ramp = min(max((j - low) / (high - low), 0), 1)
        ext = 1 - ramp
        out.append((1 / (factor * pf)) * (1 - ext) + (1 / pf) * ext)
    return out, attn

def dynamic(base, dim, factor, maxpos, seqlen):
    L = max(seqlen, maxpos)
    b = base * ((factor * L / maxpos) - (factor - 1)) ** (dim / (dim - 2))
    return default(b, dim), 1.0

cases = [
    ("default-llama2", dict(theta=10000.0, dim=128), (default(10000.0, 128), 1.0)),
    ("default-qwen-partial", dict(theta=1000000.0, dim=64), (default(1000000.0, 64), 1.0)),
    ("linear-4", dict(theta=10000.0, dim=128), linear(10000.0, 128, 4.0)),
    ("llama3.1", dict(theta=500000.0, dim=128), llama3(500000.0, 128, 8.0, 1.0, 4.0, 8192)),
    ("yarn-qwen", dict(theta=1000000.0, dim=128), yarn(1000000.0, 128, 4.0, 32768)),
    ("yarn-small", dict(theta=10000.0, dim=32), yarn(10000.0, 32, 16.0, 2048, 16.0, 2.0, 1.25)),
    ("dynamic", dict(theta=10000.0, dim=64), dynamic(10000.0, 64, 2.0, 2048, 4096)),
]
out = []
for name, p, (inv, attn) in cases:
    out.append({"name": name, "inv_freq_f32_bits": [f32bits(f) for f in inv], "attention_factor": attn})
print(json.dumps(out, indent=1))
