"""Encoded chunk entries, byte for byte as Go's chunk package writes them
(docs/KEYS.md section 6 is the specification).

An entry holds one chunk's key, tokens and pre-RoPE K and V in the layout
[layer][K|V][token][kv_head][head_dim]. Python encodes raw entries byte for
byte as Go does, and lossless entries that Go decodes (their byte planes are
stored raw or run-length, not huff0-coded, so they are larger than Go's; f16
in the first lossless layout, high and low byte, which readers keep reading);
it decodes every codec (raw, lossless with its huff0 planes, int8, int4,
fp8) to the same bits as Go.
"""

from __future__ import annotations

import dataclasses
import enum
import struct

import numpy as np

from . import huff0, quant
from .errors import CorruptEntry, EntryTooLarge, InvalidEntry, UnsupportedEntry, UsageError
from .keys import ID, Context, ContextKind, DType, Key, check_key, xxh64

__all__ = ["Codec", "Limits", "DEFAULT_LIMITS", "Shape", "Range", "Entry", "Header", "encode", "decode",
           "decode_range", "parse_header", "verify"]

MAGIC = b"KVMC"
VERSION = 1
_FIXED = 88
_LAYER_REF = 24


class Codec(enum.IntEnum):
    """How an entry's layers are coded: raw, lossless, or quantised (int8, int4, fp8)."""

    RAW = 1
    LOSSLESS = 2
    INT8 = 3
    INT4 = 4
    FP8 = 5

    @classmethod
    def parse(cls, v: "str | int | Codec") -> "Codec":
        names = ", ".join(c.name.lower() for c in cls)
        if isinstance(v, str):
            try:
                return cls[v.upper()]
            except KeyError:
                raise UsageError(f"unknown codec {v!r}: want one of {names}") from None
        try:
            return cls(int(v))
        except (TypeError, ValueError):
            raise UsageError(f"unknown codec {v!r}: want one of {names}") from None


@dataclasses.dataclass(frozen=True)
class Limits:
    """Bounds a decoder checks before it allocates (chunk.DefaultLimits)."""

    max_blob_bytes: int = 512 << 20
    max_raw_bytes: int = 256 << 20
    max_tokens: int = 1 << 16
    max_layers: int = 1024
    max_kv_heads: int = 1024
    max_head_dim: int = 4096


DEFAULT_LIMITS = Limits()


@dataclasses.dataclass(frozen=True)
class Shape:
    dtype: DType
    tokens: int
    layers: int
    kv_heads: int
    head_dim: int

    @property
    def layer_bytes(self) -> int:
        return 2 * self.tokens * self.kv_heads * self.head_dim * self.dtype.size

    @property
    def raw_bytes(self) -> int:
        return self.layers * self.layer_bytes


@dataclasses.dataclass(frozen=True)
class Range:
    """Layers [layer_lo, layer_hi) and KV heads [head_lo, head_hi); zero hi
    bounds mean "to the end"."""

    layer_lo: int = 0
    layer_hi: int = 0
    head_lo: int = 0
    head_hi: int = 0

    def resolve(self, s: Shape) -> "Range":
        """The range with its hi bounds filled in for s; InvalidEntry if outside s."""
        r = Range(self.layer_lo, self.layer_hi or s.layers, self.head_lo, self.head_hi or s.kv_heads)
        if not (0 <= r.layer_lo < r.layer_hi <= s.layers and 0 <= r.head_lo < r.head_hi <= s.kv_heads):
            raise InvalidEntry(f"range layers [{r.layer_lo},{r.layer_hi}) heads [{r.head_lo},{r.head_hi}) "
                               f"of {s.layers} layers, {s.kv_heads} heads")
        return r


def _np_dtype(d: DType):
    """The numpy dtype that holds d's bits: bf16 is held as uint16."""
    return {DType.F32: np.dtype("<f4"), DType.F16: np.dtype("<f2"), DType.BF16: np.dtype("<u2")}[d]


@dataclasses.dataclass
class Entry:
    """A decoded chunk. kv has shape [layers, 2, tokens, kv_heads, head_dim];
    its numpy dtype is float32, float16, or uint16 holding bf16 bits."""

    key: Key
    dtype: DType
    tokens: np.ndarray  # uint32
    kv: np.ndarray

    @property
    def shape(self) -> Shape:
        L, two, T, H, D = self.kv.shape
        return Shape(self.dtype, T, L, H, D)

    @classmethod
    def from_kv(cls, key: Key, tokens, kv, dtype: "DType | str | None" = None) -> "Entry":
        """Builds an entry from a [layers, 2, tokens, kv_heads, head_dim]
        array (numpy, or anything with __array__). bf16 data must be given
        as uint16 bits with dtype=BF16 (kvmesh.torch converts tensors)."""
        if not isinstance(key, Key):
            raise InvalidEntry(f"Entry.from_kv: want a kvmesh.Key, got {type(key).__name__}")
        a = np.asarray(kv)
        if dtype is None:
            dtype = {np.dtype("float32"): DType.F32, np.dtype("float16"): DType.F16}.get(a.dtype)
            if dtype is None:
                raise InvalidEntry(f"cannot tell the dtype of a {a.dtype} array: pass dtype")
        dtype = DType.parse(dtype)
        want = _np_dtype(dtype)
        if a.dtype.itemsize != want.itemsize:
            raise InvalidEntry(f"{a.dtype} array for dtype {dtype.name}")
        a = np.ascontiguousarray(a).view(want)
        t = np.asarray(tokens, dtype=np.uint32)
        if a.ndim != 5 or a.shape[1] != 2 or a.shape[2] != len(t):
            raise InvalidEntry(f"kv of shape {a.shape}: want [layers, 2, {len(t)}, kv_heads, head_dim]")
        return cls(key, dtype, t, a)


@dataclasses.dataclass(frozen=True)
class LayerRef:
    offset: int
    length: int
    checksum: int


@dataclasses.dataclass(frozen=True)
class Header:
    key: Key
    codec: Codec
    shape: Shape
    layers: tuple
    tokens: np.ndarray
    checksum: int  # of the whole entry
    payload_start: int
    blob_bytes: int


def _check_shape(s: Shape, lim: Limits, err=InvalidEntry) -> None:
    if s.dtype not in (DType.F32, DType.F16, DType.BF16):
        raise err(f"dtype {s.dtype}")
    if min(s.tokens, s.layers, s.kv_heads, s.head_dim) <= 0:
        raise err(f"empty shape {s}")
    if (s.tokens > lim.max_tokens or s.layers > lim.max_layers or s.kv_heads > lim.max_kv_heads
            or s.head_dim > lim.max_head_dim or s.raw_bytes > lim.max_raw_bytes):
        raise EntryTooLarge(f"shape {s} exceeds limits")


def encode(e: Entry, codec: "Codec | str" = Codec.RAW) -> bytes:
    """Encodes e. RAW output is byte-identical to Go's chunk.Encode."""
    if not isinstance(e, Entry):
        raise UsageError(f"encode: want a kvmesh.Entry, got {type(e).__name__}")
    codec = Codec.parse(codec)
    s = e.shape
    _check_shape(s, Limits(max_raw_bytes=1 << 62))
    kind = ContextKind(e.key.context.kind)
    try:
        check_key(e.key, e.tokens)
    except ValueError as err:
        raise InvalidEntry(f"key does not name the entry: {err}") from None
    kv = np.ascontiguousarray(e.kv).view(_np_dtype(e.dtype))
    layers = []
    for layer in range(s.layers):
        raw = kv[layer].tobytes()
        if codec is Codec.RAW:
            layers.append(raw)
        elif codec is Codec.LOSSLESS:
            layers.append(_lossless_encode(raw, e.dtype))
        else:
            raise UnsupportedEntry(f"Python encodes raw and lossless entries, not {codec.name.lower()}")
    head = bytearray(_FIXED)
    head[0:4] = MAGIC
    struct.pack_into("<HBB", head, 4, VERSION, int(codec), int(e.dtype))
    head[8:24] = e.key.fingerprint.to_bytes()
    head[24:40] = e.key.content.to_bytes()
    head[40] = int(kind)
    struct.pack_into("<I", head, 44, e.key.context.window)
    head[48:64] = e.key.context.id.to_bytes()
    payload = sum(len(p) for p in layers)
    struct.pack_into("<IIIIQ", head, 64, s.tokens, s.layers, s.kv_heads, s.head_dim, payload)
    off = 0
    for p in layers:
        head += struct.pack("<QQQ", off, len(p), xxh64(p))
        off += len(p)
    head += np.asarray(e.tokens, dtype="<u4").tobytes()
    head += struct.pack("<Q", xxh64(bytes(head)))
    return bytes(head) + b"".join(layers)


def parse_header(blob: bytes, limits: Limits = DEFAULT_LIMITS) -> Header:
    """Reads and verifies an entry's header (not its payload)."""
    try:
        blob = memoryview(blob).cast("B")
    except TypeError:
        raise UsageError(f"want an encoded entry (bytes), got {type(blob).__name__}") from None
    if len(blob) > limits.max_blob_bytes:
        raise EntryTooLarge(f"blob of {len(blob)} bytes")
    if len(blob) < _FIXED:
        raise CorruptEntry(f"{len(blob)} bytes is shorter than a header")
    if bytes(blob[:4]) != MAGIC:
        raise CorruptEntry(f"bad magic {bytes(blob[:4])!r}")
    version, codec, dtype = struct.unpack_from("<HBB", blob, 4)
    if version != VERSION:
        raise UnsupportedEntry(f"version {version}")
    T, L, H, D, payload = struct.unpack_from("<IIIIQ", blob, 64)
    try:
        dt = DType(dtype)
    except ValueError:
        raise CorruptEntry(f"dtype {dtype}") from None
    s = Shape(dt, T, L, H, D)
    _check_shape(s, limits, CorruptEntry)
    try:
        codec = Codec(codec)
    except ValueError:
        raise UnsupportedEntry(f"codec {codec}") from None
    head_len = _FIXED + _LAYER_REF * L + 4 * T + 8
    if len(blob) < head_len:
        raise CorruptEntry("truncated header")
    (checksum,) = struct.unpack_from("<Q", blob, head_len - 8)
    if xxh64(bytes(blob[:head_len - 8])) != checksum:
        raise CorruptEntry("header checksum mismatch")
    kind = blob[40]
    if kind not in (1, 2, 3):
        raise CorruptEntry(f"context kind {kind}")
    key = Key(ID.from_bytes(bytes(blob[8:24])), ID.from_bytes(bytes(blob[24:40])),
              Context(ContextKind(kind), struct.unpack_from("<I", blob, 44)[0], ID.from_bytes(bytes(blob[48:64]))))
    if payload != len(blob) - head_len:
        raise CorruptEntry(f"payload of {payload} bytes, blob holds {len(blob) - head_len}")
    refs, nxt = [], 0
    for layer in range(L):
        r = LayerRef(*struct.unpack_from("<QQQ", blob, _FIXED + _LAYER_REF * layer))
        if r.offset != nxt or r.length > payload - r.offset:
            raise CorruptEntry(f"layer {layer} at {r.offset}+{r.length} outside payload")
        nxt = r.offset + r.length
        refs.append(r)
    if nxt != payload:
        raise CorruptEntry(f"layers cover {nxt} of {payload} payload bytes")
    tokens = np.frombuffer(blob, dtype="<u4", count=T, offset=_FIXED + _LAYER_REF * L).astype(np.uint32)
    if any(blob[41:44]):
        raise CorruptEntry("reserved header bytes 41..43 are not zero")
    try:
        check_key(key, tokens)
    except ValueError as err:
        raise CorruptEntry(f"key does not name the entry: {err}") from None
    return Header(key, codec, s, tuple(refs), tokens, checksum, head_len, len(blob))


def _layer_payload(blob, hd: Header, layer: int) -> memoryview:
    r = hd.layers[layer]
    p = memoryview(blob)[hd.payload_start + r.offset: hd.payload_start + r.offset + r.length]
    if xxh64(p) != r.checksum:
        raise CorruptEntry(f"layer {layer} checksum mismatch")
    return p


def verify(blob: bytes, limits: Limits = DEFAULT_LIMITS) -> Header:
    """Checks every checksum of blob without decoding it."""
    hd = parse_header(blob, limits)
    for layer in range(hd.shape.layers):
        _layer_payload(blob, hd, layer)
    return hd


def decode_range(blob: bytes, r: Range = Range(), limits: Limits = DEFAULT_LIMITS) -> "tuple[Header, np.ndarray]":
    """Decodes layers and heads r of blob: an array of shape
    [layers, 2, tokens, heads, head_dim] over the range."""
    hd = parse_header(blob, limits)
    s = hd.shape
    r = r.resolve(s)
    nd = _np_dtype(s.dtype)
    out = []
    for layer in range(r.layer_lo, r.layer_hi):
        p = _layer_payload(blob, hd, layer)
        raw = _decode_layer(hd.codec, s, p)
        a = np.frombuffer(raw, dtype=nd).reshape(2, s.tokens, s.kv_heads, s.head_dim)
        out.append(a[:, :, r.head_lo:r.head_hi])
    return hd, np.ascontiguousarray(np.stack(out))


def decode(blob: bytes, limits: Limits = DEFAULT_LIMITS) -> Entry:
    """Verifies and decodes a whole entry."""
    hd, kv = decode_range(blob, Range(), limits)
    return Entry(hd.key, hd.shape.dtype, hd.tokens, kv)


def _decode_layer(codec: Codec, s: Shape, p: memoryview) -> bytes:
    if codec is Codec.RAW:
        if len(p) != s.layer_bytes:
            raise CorruptEntry(f"raw layer of {len(p)} bytes, want {s.layer_bytes}")
        return bytes(p)
    if codec is Codec.LOSSLESS:
        return _lossless_decode(p, s)
    return quant.decode_layer(p, codec.name.lower(), s.dtype, s.tokens, s.kv_heads, s.head_dim)


# Lossless: planes in blocks of 65536 elements, the K half then the V half;
# per block and plane: mode u8, length u32, body. Go writes f16 layers in the
# exponent layout (they start with _LAYOUT_F16_EXP; planes exponent, low
# byte, bits); an f16 layer starting with a mode is in the first layout
# (high byte, low byte), which Python writes and every reader decodes.
_BLOCK = 1 << 16
_PLANE_RAW, _PLANE_RLE, _PLANE_HUFF1X, _PLANE_HUFF4X = 0, 1, 2, 3
_LAYOUT_F16_EXP = 0x10


def _split(raw: bytes, dt: DType) -> "list[np.ndarray]":
    if dt is DType.F32:
        u = np.frombuffer(raw, dtype="<u4")
        return [(u >> 23).astype(np.uint8), (((u >> 24) & 0x80) | ((u >> 16) & 0x7F)).astype(np.uint8),
                (u >> 8).astype(np.uint8), u.astype(np.uint8)]
    u = np.frombuffer(raw, dtype="<u2")
    if dt is DType.BF16:
        return [(u >> 7).astype(np.uint8), (((u >> 8) & 0x80) | (u & 0x7F)).astype(np.uint8)]
    return [(u >> 8).astype(np.uint8), u.astype(np.uint8)]


def _merge(planes: "list[np.ndarray]", dt: DType) -> np.ndarray:
    if dt is DType.F32:
        p0, p1, p2, p3 = (p.astype(np.uint32) for p in planes)
        return ((p1 & 0x80) << 24) | (p0 << 23) | ((p1 & 0x7F) << 16) | (p2 << 8) | p3
    p0, p1 = (p.astype(np.uint16) for p in planes)
    if dt is DType.BF16:
        return ((p1 & 0x80) << 8) | (p0 << 7) | (p1 & 0x7F)
    return (p0 << 8) | p1


def _blocks(n: int):
    half = n // 2
    for h in range(2):
        for b in range(h * half, (h + 1) * half, _BLOCK):
            yield b, min(_BLOCK, (h + 1) * half - b)


def _lossless_encode(raw: bytes, dt: DType) -> bytes:
    es = dt.size
    out = bytearray()
    for b, m in _blocks(len(raw) // es):
        for plane in _split(raw[b * es:(b + m) * es], dt):
            if m > 0 and (plane == plane[0]).all():
                out += struct.pack("<BI", _PLANE_RLE, 1) + plane[:1].tobytes()
            else:
                out += struct.pack("<BI", _PLANE_RAW, m) + plane.tobytes()
    return bytes(out)


def _f16_bits_bytes(m: int) -> int:
    return 6 * ((m + 15) // 16)


def _merge_f16_exp(exp: np.ndarray, lo: np.ndarray, bits: np.ndarray) -> np.ndarray:
    """The f16 elements of the exponent layout's planes: per group of 16,
    three u16 words (signs, mantissa bits 9, mantissa bits 8), element j in
    bit j."""
    m = len(exp)
    if m and int(exp.max()) > 31:
        raise CorruptEntry("f16 exponent over 31")
    words = bits.view("<u2").reshape(-1, 3).astype(np.uint16)
    j = np.arange(m)
    g, k = j >> 4, (j & 15).astype(np.uint16)
    if m % 16 and (words[-1] >> np.uint16(m % 16)).any():
        raise CorruptEntry("f16 bits past the block's end")
    bit = lambda w: (words[g, w] >> k) & np.uint16(1)  # noqa: E731
    return (bit(0) << 15) | (exp.astype(np.uint16) << 10) | (bit(1) << 9) | (bit(2) << 8) | lo.astype(np.uint16)


def _lossless_decode(enc: memoryview, s: Shape) -> bytes:
    dt = s.dtype
    es = dt.size
    n = s.layer_bytes // es
    out = np.empty(n, dtype="<u4" if es == 4 else "<u2")
    exp_layout = dt is DType.F16 and len(enc) > 0 and enc[0] == _LAYOUT_F16_EXP
    pos = 1 if exp_layout else 0
    for b, m in _blocks(n):
        planes = []
        sizes = [m, m, _f16_bits_bytes(m)] if exp_layout else [m] * es
        for p, size in enumerate(sizes):
            if len(enc) - pos < 5:
                raise CorruptEntry(f"block at element {b}, plane {p}: truncated plane header")
            mode, ln = struct.unpack_from("<BI", enc, pos)
            pos += 5
            if ln > len(enc) - pos:
                raise CorruptEntry(f"block at element {b}, plane {p}: plane of {ln} bytes, {len(enc) - pos} left")
            body = enc[pos:pos + ln]
            pos += ln
            try:
                planes.append(_read_plane(mode, body, size))
            except huff0.Huff0Error as e:
                raise CorruptEntry(f"block at element {b}, plane {p}: {e}") from None
        out[b:b + m] = _merge_f16_exp(*planes) if exp_layout else _merge(planes, dt)
    if pos != len(enc):
        raise CorruptEntry(f"{len(enc) - pos} trailing bytes in lossless layer")
    return out.tobytes()


def _read_plane(mode: int, body: memoryview, m: int) -> np.ndarray:
    if mode == _PLANE_RAW:
        if len(body) != m:
            raise CorruptEntry(f"raw plane of {len(body)} bytes, want {m}")
        return np.frombuffer(body, dtype=np.uint8)
    if mode == _PLANE_RLE:
        if len(body) != 1:
            raise CorruptEntry(f"rle plane of {len(body)} bytes")
        return np.full(m, body[0], dtype=np.uint8)
    if mode in (_PLANE_HUFF1X, _PLANE_HUFF4X):
        return huff0.decompress(bytes(body), m, four_streams=(mode == _PLANE_HUFF4X))
    raise CorruptEntry(f"plane mode {mode}")
