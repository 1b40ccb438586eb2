"""Model fingerprints, content IDs and contexts, byte for byte as Go's chunk
package computes them (docs/KEYS.md is the specification)."""

from __future__ import annotations

import dataclasses
import enum
import math
import struct
from typing import Iterable, Sequence

import numpy as np
import xxhash

M64 = (1 << 64) - 1

# Lane seeds and domain tags: ASCII strings read as big-endian u64.
_SEED_FP_LO = 0x6B766D6573682D30  # "kvmesh-0"
_SEED_FP_HI = 0x6B766D6573682D31  # "kvmesh-1"
_DOM_CONTENT = (0x636F6E74656E742E, 0x2E636F6E74656E74)  # "content." ".content"
_DOM_WINDOW = (0x77696E646F772E2E, 0x2E2E77696E646F77)  # "window.." "..window"
_DOM_PREFIX = (0x7072656669782E2E, 0x2E2E707265666978)  # "prefix.." "..prefix"


def xxh64(data: bytes, seed: int = 0) -> int:
    """Standard XXH64 of data with a 64-bit seed."""
    return xxhash.xxh64_intdigest(data, seed=seed & M64)


class DType(enum.IntEnum):
    """Element type of stored K and V (chunk.DType numbering)."""

    F32 = 1
    F16 = 2
    BF16 = 3

    @property
    def size(self) -> int:
        return 4 if self is DType.F32 else 2

    @classmethod
    def parse(cls, name: "str | DType | int") -> "DType":
        if isinstance(name, (DType, int)):
            return cls(int(name))
        n = str(name).lower().removeprefix("torch.")
        for d, names in ((cls.F32, ("f32", "float32")), (cls.F16, ("f16", "float16", "half")),
                         (cls.BF16, ("bf16", "bfloat16"))):
            if n in names:
                return d
        raise ValueError(f"unknown dtype {name!r}: want f32, f16 or bf16")


class RopeStyle(enum.IntEnum):
    """How rotary embedding pairs dimensions (chunk.RopeStyle numbering)."""

    NEOX = 1  # rotate_half: dims i and i + rotary/2 (Llama, Qwen2, Mistral)
    GPTJ = 2  # interleaved: dims 2i and 2i + 1


class ContextKind(enum.IntEnum):
    STANDALONE = 1
    WINDOW = 2
    PREFIX = 3


@dataclasses.dataclass(frozen=True, order=True)
class ID:
    """A 128-bit content ID, context ID or model fingerprint: two u64 lanes.

    str() prints Hi then Lo as 32 lowercase hex digits, as Go's ID.String."""

    lo: int = 0
    hi: int = 0

    def __str__(self) -> str:
        return f"{self.hi:016x}{self.lo:016x}"

    def __repr__(self) -> str:
        return f"ID({self})"

    @classmethod
    def parse(cls, s: str) -> "ID":
        if len(s) != 32:
            raise ValueError(f"ID {s!r}: want 32 hex digits")
        return cls(lo=int(s[16:], 16), hi=int(s[:16], 16))

    def is_zero(self) -> bool:
        return self.lo == 0 and self.hi == 0

    def to_bytes(self) -> bytes:
        return struct.pack("<QQ", self.lo, self.hi)

    @classmethod
    def from_bytes(cls, b: bytes) -> "ID":
        lo, hi = struct.unpack("<QQ", b[:16])
        return cls(lo, hi)


# A fingerprint is an ID that names a model.
Fingerprint = ID


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """A transformers rope_type and its parameters; unused fields stay 0."""

    type: str = ""
    factor: float = 0.0
    low_freq_factor: float = 0.0
    high_freq_factor: float = 0.0
    original_max_positions: int = 0
    beta_fast: float = 0.0
    beta_slow: float = 0.0
    attention_factor: float = 0.0
    max_positions: int = 0


MAX_SPEC_STRING = 256  # bytes of UTF-8 in each string field
MAX_SPEC_POSITIONS = (1 << 31) - 1  # the position fields travel as int32

# Per scaling type, the fields it uses; every other one must be 0.
_SCALING_FIELDS = {
    "": (), "default": (), "linear": ("factor",), "dynamic": ("factor", "max_positions"),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_positions"),
    "yarn": ("factor", "original_max_positions", "beta_fast", "beta_slow", "attention_factor"),
}
_SCALING_ORDER = ("factor", "low_freq_factor", "high_freq_factor", "original_max_positions", "beta_fast",
                  "beta_slow", "attention_factor", "max_positions")


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _spec_problem(sp: "ModelSpec") -> str:
    """The first reason sp is invalid, in the order of Go's Validate, or ""."""
    sc = sp.scaling
    for name, v in (("family", sp.family), ("scaling type", sc.type), ("weights revision", sp.weights_revision),
                    ("tokenizer id", sp.tokenizer_id), ("salt", sp.salt)):
        try:
            n = len(v.encode("utf-8")) if isinstance(v, str) else -1
        except UnicodeEncodeError:
            n = -1
        if not 0 <= n <= MAX_SPEC_STRING:
            return f"{name}: must be UTF-8 of at most {MAX_SPEC_STRING} bytes"
    for name in ("layers", "kv_heads", "head_dim", "rotary_dim"):
        if not _is_int(getattr(sp, name)):
            return f"{name} {getattr(sp, name)!r} is not an integer"
    theta = sp.rope_theta
    if not sp.family:
        return "family is empty"
    if not 0 < sp.layers <= 1024:
        return f"layers {sp.layers} out of range 1..1024"
    if not 0 < sp.kv_heads <= 1024:
        return f"kv heads {sp.kv_heads} out of range 1..1024"
    if not (0 < sp.head_dim <= 4096 and sp.head_dim % 2 == 0):
        return f"head dim {sp.head_dim} must be even and in 2..4096"
    if not (isinstance(theta, (int, float)) and theta > 1 and math.isfinite(theta)):
        return f"rope theta {theta} must be finite and > 1"
    if not (0 <= sp.rotary_dim <= sp.head_dim and sp.rotary_dim % 2 == 0):
        return f"rotary dim {sp.rotary_dim} must be even and at most head dim {sp.head_dim}"
    used = _SCALING_FIELDS.get(sc.type)
    if used is None:
        return f"unknown rope scaling type {sc.type!r}"
    for name in _SCALING_ORDER:
        v = getattr(sc, name)
        if name.endswith("positions"):
            if not _is_int(v):
                return f"scaling {name} {v!r} is not an integer"
        elif not isinstance(v, (int, float)) or isinstance(v, bool):
            return f"scaling {name} {v!r} is not a number"
        if name not in used and v != 0:
            return f"{sc.type!r} scaling does not use {name} ({v}): it must be 0"
        if not math.isfinite(v) or v < 0:
            return f"scaling {name} {v} must be finite and not negative"
    if sc.original_max_positions > MAX_SPEC_POSITIONS or sc.max_positions > MAX_SPEC_POSITIONS:
        return (f"scaling positions {sc.original_max_positions}, {sc.max_positions} out of range "
                f"0..{MAX_SPEC_POSITIONS}")
    if sc.type in ("linear", "dynamic"):
        if not sc.factor > 0:
            return f"{sc.type} scaling needs factor > 0"
        if sc.type == "dynamic" and sc.max_positions <= 0:
            return "dynamic scaling needs max positions"
    elif sc.type == "llama3":
        if not (sc.factor > 0 and 0 < sc.low_freq_factor < sc.high_freq_factor and sc.original_max_positions > 0):
            return ("llama3 scaling needs factor > 0, 0 < low_freq_factor < high_freq_factor, "
                    "original max positions")
    elif sc.type == "yarn":
        if not (sc.factor > 0 and sc.original_max_positions > 0):
            return "yarn scaling needs factor > 0 and original max positions"
    return ""


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """Everything that changes a model's KV bytes (chunk.ModelSpec)."""

    family: str
    layers: int
    kv_heads: int
    head_dim: int
    dtype: DType
    rope_style: RopeStyle
    rope_theta: float
    rotary_dim: int = 0  # 0: head_dim
    scaling: RopeScaling = RopeScaling()
    weights_revision: str = ""
    tokenizer_id: str = ""
    salt: str = ""

    def __post_init__(self):
        object.__setattr__(self, "dtype", DType.parse(self.dtype))
        object.__setattr__(self, "rope_style", RopeStyle(int(self.rope_style)))

    @property
    def rotary(self) -> int:
        return self.rotary_dim or self.head_dim

    def validate(self) -> None:
        """Raises ValueError with the first reason the spec is invalid, by
        the rules of Go's ModelSpec.Validate (docs/KEYS.md section 1): one
        model, one fingerprint."""
        bad = _spec_problem(self)
        if bad:
            raise ValueError("invalid model spec: " + bad)

    def canonical_encoding(self) -> bytes:
        """The bytes the fingerprint hashes (docs/KEYS.md section 1)."""
        sc = self.scaling

        def s(v: str) -> bytes:
            b = v.encode()
            return struct.pack("<I", len(b)) + b

        u32 = lambda v: struct.pack("<I", v & 0xFFFFFFFF)
        f64 = lambda v: struct.pack("<d", float(v) + 0.0)  # + 0.0: -0.0 is written as 0.0
        return b"".join([
            s("kvmesh-spec-v1"), s(self.family), u32(self.layers), u32(self.kv_heads), u32(self.head_dim),
            bytes([int(self.dtype), int(self.rope_style)]), f64(self.rope_theta), u32(self.rotary),
            s(sc.type or "default"), f64(sc.factor), f64(sc.low_freq_factor), f64(sc.high_freq_factor),
            u32(sc.original_max_positions), f64(sc.beta_fast), f64(sc.beta_slow), f64(sc.attention_factor),
            u32(sc.max_positions), s(self.weights_revision), s(self.tokenizer_id), s(self.salt),
        ])

    def fingerprint(self) -> Fingerprint:
        e = self.canonical_encoding()
        return ID(xxh64(e, _SEED_FP_LO), xxh64(e, _SEED_FP_HI))

    def kv_bytes_per_token(self) -> int:
        return self.layers * 2 * self.kv_heads * self.head_dim * self.dtype.size


def token_bytes(tokens: "Sequence[int] | np.ndarray") -> bytes:
    """Token IDs as consecutive u32 LE (no length prefix)."""
    a = np.asarray(tokens, dtype=np.int64)
    if a.size and (a.min() < 0 or a.max() > 0xFFFFFFFF):
        raise ValueError("token IDs must fit in uint32")
    return a.astype("<u4").tobytes()


def _lanes(lo: int, hi: int, tokens) -> ID:
    b = token_bytes(tokens)
    return ID(xxh64(b, lo), xxh64(b, hi))


def content_id(fp: Fingerprint, tokens) -> ID:
    """Names a chunk's tokens for one model, wherever they appear."""
    return _lanes(fp.lo ^ _DOM_CONTENT[0], fp.hi ^ _DOM_CONTENT[1], tokens)


@dataclasses.dataclass(frozen=True)
class Context:
    """What a chunk was encoded after: standalone, a window of w tokens, or
    its whole prefix (EXACT for that prefix)."""

    kind: ContextKind
    window: int = 0
    id: ID = ID()

    def __post_init__(self):
        object.__setattr__(self, "kind", ContextKind(int(self.kind)))

    def __str__(self) -> str:
        if self.kind is ContextKind.STANDALONE:
            return "standalone"
        if self.kind is ContextKind.WINDOW:
            return f"window({self.window}):{self.id}"
        return f"prefix:{self.id}"


def standalone_context() -> Context:
    return Context(ContextKind.STANDALONE)


def window_id(fp: Fingerprint, window_tokens) -> ID:
    return _lanes(fp.lo ^ _DOM_WINDOW[0], fp.hi ^ _DOM_WINDOW[1], window_tokens)


def window_context(fp: Fingerprint, w: int, window_tokens) -> Context:
    """The context of a chunk encoded after window_tokens, the last w tokens
    before it. An empty window is the standalone context; a window that
    holds every token before the chunk is its prefix encoding (use
    window_or_prefix, which keys it so)."""
    if len(window_tokens) == 0:
        return standalone_context()
    return Context(ContextKind.WINDOW, w, window_id(fp, window_tokens))


def prefix_root(fp: Fingerprint) -> ID:
    return ID(fp.lo ^ _DOM_PREFIX[0], fp.hi ^ _DOM_PREFIX[1])


def next_prefix(prev: ID, tokens) -> ID:
    """The chain ID after one more chunk; an empty chunk leaves it as is."""
    if len(tokens) == 0:
        return prev
    return _lanes(prev.lo ^ _DOM_PREFIX[0], prev.hi ^ _DOM_PREFIX[1], tokens)


def prefix_context(prefix: ID) -> Context:
    return Context(ContextKind.PREFIX, 0, prefix)


def canonical(fp: Fingerprint, c: Context) -> Context:
    """The one key context of the computation c names (chunk.Canonical): a
    chunk with nothing before it is standalone, however it is asked for
    (the root of a prefix chain, a window of no tokens)."""
    if (c.kind is ContextKind.PREFIX and c.window == 0 and c.id == prefix_root(fp)) or (
            c.kind is ContextKind.WINDOW and c.id == window_id(fp, [])):
        return standalone_context()
    return c


def prefix_chain(fp: Fingerprint, chunks: Iterable) -> "tuple[list[Context], ID]":
    """The context of each chunk of a prompt cut into chunks (standalone
    while no token precedes it, else its prefix context), and the chain ID
    after the last one."""
    root = p = prefix_root(fp)
    out = []
    for c in chunks:
        out.append(standalone_context() if p == root else prefix_context(p))
        p = next_prefix(p, c)
    return out, p


def window_or_prefix(fp: Fingerprint, w: int, before) -> Context:
    """The key context of a chunk encoded after the last w tokens of before,
    the chunks that precede it in its prompt (chunk.WindowOrPrefix): their
    prefix context when the window holds all of them, else the window."""
    before = [list(c) for c in before]
    flat = [t for c in before for t in c]
    if len(flat) <= w:
        _, end = prefix_chain(fp, before)
        return canonical(fp, prefix_context(end))
    return window_context(fp, w, flat[len(flat) - w:])


def check_key(key: "Key", tokens) -> None:
    """Raises ValueError unless key names an entry holding tokens
    (chunk.CheckKey): the content ID is the one tokens give, and the
    context is canonical in form and the one key of its computation."""
    c = key.context
    if c.kind is ContextKind.STANDALONE and (c.window != 0 or not c.id.is_zero()):
        raise ValueError(f"standalone context with ID {c.id} and window {c.window} (both must be zero)")
    if c.kind is ContextKind.WINDOW and not 1 <= c.window <= MAX_WINDOW:
        raise ValueError(f"window {c.window} out of range 1..{MAX_WINDOW}")
    if c.kind is ContextKind.PREFIX and c.window != 0:
        raise ValueError(f"prefix context with window {c.window} (must be zero)")
    if canonical(key.fingerprint, c) != c:
        raise ValueError(f"context {c} names the encoding of a chunk with nothing before it, which is keyed standalone")
    if content_id(key.fingerprint, tokens) != key.content:
        raise ValueError(f"content ID {key.content} is not the one the {len(tokens)} tokens give")


MAX_WINDOW = 1 << 24


@dataclasses.dataclass(frozen=True)
class Key:
    """Names one stored encoding of a chunk."""

    fingerprint: Fingerprint
    content: ID
    context: Context

    def __str__(self) -> str:
        return f"{self.fingerprint}/{self.content}/{self.context}"
