"""Reads and writes safetensors files (the format of Hugging Face
checkpoints) with numpy alone: an 8-byte little-endian header length, a
JSON header naming each tensor's dtype, shape and byte range, then the
data. F32, F16 and BF16 tensors are read as float32; a checkpoint may be one
model.safetensors or shards listed in model.safetensors.index.json."""

from __future__ import annotations

import json
import os
import struct

import numpy as np

from .errors import ModelError

__all__ = ["read", "write", "load_checkpoint"]

_MAX_HEADER = 100 << 20
_DTYPES = {"F32": (4, "<f4"), "F16": (2, "<f2"), "BF16": (2, "<u2")}


def read(path: str) -> "tuple[dict[str, np.ndarray], dict[str, str]]":
    """The tensors of one safetensors file, each widened to float32, and
    its metadata."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ModelError(f"read {path}: {e}") from None
    if len(data) < 8:
        raise ModelError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack_from("<Q", data)
    if n > _MAX_HEADER or 8 + n > len(data):
        raise ModelError(f"{path}: header of {n} bytes does not fit the file")
    try:
        header = json.loads(data[8:8 + n])
    except ValueError as e:
        raise ModelError(f"{path}: header is not JSON: {e}") from None
    body = memoryview(data)[8 + n:]
    meta = header.pop("__metadata__", None) or {}
    out = {}
    for name, info in header.items():
        try:
            dt, shape, (a, b) = info["dtype"], [int(d) for d in info["shape"]], info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise ModelError(f"{path}: tensor {name!r}: malformed header entry") from None
        if dt not in _DTYPES:
            raise ModelError(f"{path}: tensor {name!r}: unsupported dtype {dt!r} (want F32, F16 or BF16)")
        size, np_dt = _DTYPES[dt]
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if not 0 <= a <= b <= len(body) or b - a != count * size:
            raise ModelError(f"{path}: tensor {name!r}: bytes [{a}, {b}) do not hold {shape} {dt}")
        x = np.frombuffer(body[a:b], dtype=np_dt)
        if dt == "BF16":
            x = (x.astype(np.uint32) << 16).view(np.float32)
        out[name] = x.astype(np.float32).reshape(shape)
    return out, meta


def write(path: str, tensors: "dict[str, np.ndarray]", metadata: "dict[str, str] | None" = None,
          dtype: str = "F32") -> None:
    """Writes tensors (float32 arrays, rounded to dtype: F32, F16 or BF16,
    to nearest even) in name order, the header padded to 8 bytes."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name], dtype=np.float32)
        if dtype == "F32":
            b = a.astype("<f4").tobytes()
        elif dtype == "F16":
            b = a.astype("<f2").tobytes()
        elif dtype == "BF16":
            u = a.view(np.uint32).astype(np.uint64)
            b = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2").tobytes()
        else:
            raise ModelError(f"safetensors dtype {dtype!r}: want F32, F16 or BF16")
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if metadata:
        header["__metadata__"] = dict(metadata)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


def load_checkpoint(path: str) -> "dict[str, np.ndarray]":
    """Every tensor of the checkpoint in directory path: model.safetensors,
    or the shards model.safetensors.index.json lists (each tensor in the
    shard its weight_map names)."""
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        try:
            with open(index) as f:
                wm = json.load(f)["weight_map"]
        except (OSError, ValueError, KeyError) as e:
            raise ModelError(f"{index}: {e}") from None
        out: dict = {}
        for shard in sorted(set(wm.values())):
            ts, _ = read(os.path.join(path, shard))
            for name, t in ts.items():
                if wm.get(name) != shard:
                    raise ModelError(f"{shard}: tensor {name!r} is not mapped to this shard by the index")
                out[name] = t
        missing = sorted(set(wm) - set(out))
        if missing:
            raise ModelError(f"{index}: tensors missing from their shards: {missing[:5]}")
        return out
    single = os.path.join(path, "model.safetensors")
    if not os.path.exists(single):
        raise ModelError(f"{path}: no model.safetensors or model.safetensors.index.json")
    return read(single)[0]
