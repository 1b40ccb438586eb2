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

from .errors import UsageError

__all__ = ["ID", "Fingerprint", "DType", "RopeStyle", "RopeScaling", "ModelSpec", "ContextKind", "Context", "Key",
           "content_id", "window_id", "window_context", "standalone_context", "prefix_root", "next_prefix",
           "prefix_context", "prefix_chain", "canonical", "window_or_prefix", "check_key", "token_bytes",
           "MAX_WINDOW"]

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
        raise UsageError(f"unknown dtype {name!r}: want f32, f16 or bf16")


class RopeStyle(enum.IntEnum):
    """How rotary embedding pairs dimensions (chunk.RopeStyle numbering)."""

    NEOX = 1  # rotate_half: dims i and i + rotary/2 (Llama, Qwen2, Mistral)
    GPTJ = 2  # interleaved: dims 2i and 2i + 1


class ContextKind(enum.IntEnum):
    """What a chunk was encoded after (chunk.ContextKind numbering)."""

    STANDALONE = 1
    WINDOW = 2
    PREFIX = 3
    OPAQUE = 4  # an opaque value of the Redis-protocol door (chunk/opaque.go), no chunk


@dataclasses.dataclass(frozen=True, order=True)
class ID:
    """A 128-bit content ID, context ID or model fingerprint: two u64 lanes.

    str() prints Hi then Lo as 32 lowercase hex digits, as Go's ID.String."""

    lo: int = 0
    hi: int = 0

    def __post_init__(self):
        for name in ("lo", "hi"):
            v = getattr(self, name)
            if not _is_int(v) or not 0 <= v <= M64:
                raise UsageError(f"ID.{name} must be an integer in 0..2^64-1, got {v!r}")

    def __str__(self) -> str:
        return f"{self.hi:016x}{self.lo:016x}"

    def __repr__(self) -> str:
        return f"ID({self})"

    @classmethod
    def parse(cls, s: str) -> "ID":
        if not isinstance(s, str) or len(s) != 32:
            raise UsageError(f"ID {s!r}: want a string of 32 hex digits")
        try:
            return cls(lo=int(s[16:], 16), hi=int(s[:16], 16))
        except ValueError:
            raise UsageError(f"ID {s!r}: want 32 hex digits") from None

    def is_zero(self) -> bool:
        """Both lanes are 0."""
        return self.lo == 0 and self.hi == 0

    def to_bytes(self) -> bytes:
        """The 16 bytes Lo then Hi, little-endian (as entries store IDs)."""
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
        try:
            object.__setattr__(self, "rope_style", RopeStyle(int(self.rope_style)))
        except (TypeError, ValueError):
            raise UsageError(f"rope_style {self.rope_style!r}: want RopeStyle.NEOX or RopeStyle.GPTJ") from None
        if not isinstance(self.scaling, RopeScaling):
            raise UsageError(f"scaling: want a RopeScaling, got {type(self.scaling).__name__}")

    @property
    def rotary(self) -> int:
        return self.rotary_dim or self.head_dim

    def validate(self) -> None:
        """Raises UsageError (a ValueError) with the first reason the spec is invalid, by
        the rules of Go's ModelSpec.Validate (docs/KEYS.md section 1): one
        model, one fingerprint."""
        bad = _spec_problem(self)
        if bad:
            raise UsageError("invalid model spec: " + bad)

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
        """The model's fingerprint: xxh64 of canonical_encoding() in two lanes."""
        e = self.canonical_encoding()
        return ID(xxh64(e, _SEED_FP_LO), xxh64(e, _SEED_FP_HI))

    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V one token takes over all layers."""
        return self.layers * 2 * self.kv_heads * self.head_dim * self.dtype.size


def tokens_array(tokens, what: str = "tokens") -> np.ndarray:
    """tokens (a list of ints, a 1-D integer numpy array or torch tensor)
    as an int64 numpy array, or UsageError saying what was expected."""
    if isinstance(tokens, (str, bytes, ID)) or _is_int(tokens):
        raise UsageError(f"{what}: want a list of token IDs (ints), got {type(tokens).__name__}")
    if hasattr(tokens, "detach") and hasattr(tokens, "cpu"):  # a torch tensor, without importing torch
        tokens = tokens.detach().cpu().numpy()
    try:
        a = np.asarray(tokens)
    except (TypeError, ValueError) as e:
        raise UsageError(f"{what}: want a list of token IDs (ints): {e}") from None
    if a.size == 0:
        return np.zeros(0, dtype=np.int64)
    if a.ndim != 1 or a.dtype.kind not in "iu":
        raise UsageError(f"{what}: want a flat list of token IDs (ints), got an array of shape {a.shape} "
                         f"and dtype {a.dtype}" + (" (a list of chunks? pass one chunk)" if a.ndim == 2 else ""))
    a = a.astype(np.int64)
    if a.min() < 0 or a.max() > 0xFFFFFFFF:
        raise UsageError(f"{what}: token IDs must fit in uint32")
    return a


def token_bytes(tokens: "Sequence[int] | np.ndarray") -> bytes:
    """Token IDs as consecutive u32 LE (no length prefix)."""
    return tokens_array(tokens).astype("<u4").tobytes()


def _fp(fp, what: str) -> "ID":
    if not isinstance(fp, ID):
        raise UsageError(f"{what}: want the model fingerprint (an ID: ModelSpec.fingerprint()), "
                         f"got {type(fp).__name__}")
    return fp


def _lanes(lo: int, hi: int, tokens) -> ID:
    b = token_bytes(tokens)
    return ID(xxh64(b, lo), xxh64(b, hi))


def content_id(fp: Fingerprint, tokens) -> ID:
    """Names a chunk's tokens for one model, wherever they appear."""
    _fp(fp, "content_id")
    return _lanes(fp.lo ^ _DOM_CONTENT[0], fp.hi ^ _DOM_CONTENT[1], tokens)


@dataclasses.dataclass(frozen=True)
class Context:
    """What a chunk was encoded after: standalone, a window of w tokens, or
    its whole prefix (EXACT for that prefix)."""

    kind: ContextKind
    window: int = 0
    id: ID = ID()

    def __post_init__(self):
        try:
            object.__setattr__(self, "kind", ContextKind(int(self.kind)))
        except (TypeError, ValueError):
            raise UsageError(f"Context kind {self.kind!r}: want a ContextKind (STANDALONE, WINDOW or PREFIX)") from None
        if not _is_int(self.window) or self.window < 0:
            raise UsageError(f"Context window {self.window!r}: want a non-negative int")
        if not isinstance(self.id, ID):
            raise UsageError(f"Context id: want an ID, got {type(self.id).__name__}")

    def __str__(self) -> str:
        if self.kind is ContextKind.STANDALONE:
            return "standalone"
        if self.kind is ContextKind.WINDOW:
            return f"window({self.window}):{self.id}"
        return f"prefix:{self.id}"


def standalone_context() -> Context:
    """The context of a chunk encoded with nothing before it."""
    return Context(ContextKind.STANDALONE)


def window_id(fp: Fingerprint, window_tokens) -> ID:
    """The context ID of a window of tokens."""
    _fp(fp, "window_id")
    return _lanes(fp.lo ^ _DOM_WINDOW[0], fp.hi ^ _DOM_WINDOW[1], window_tokens)


def window_context(fp: Fingerprint, w: int, window_tokens) -> Context:
    """The context of a chunk encoded after window_tokens, the last w tokens
    before it. An empty window is the standalone context; a window that
    holds every token before the chunk is its prefix encoding (use
    window_or_prefix, which keys it so)."""
    if len(tokens_array(window_tokens, "window_context: window tokens")) == 0:
        return standalone_context()
    return Context(ContextKind.WINDOW, w, window_id(fp, window_tokens))


def prefix_root(fp: Fingerprint) -> ID:
    """The chain ID before a prompt's first chunk."""
    _fp(fp, "prefix_root")
    return ID(fp.lo ^ _DOM_PREFIX[0], fp.hi ^ _DOM_PREFIX[1])


def next_prefix(prev: ID, tokens) -> ID:
    """The chain ID after one more chunk; an empty chunk leaves it as is."""
    if not isinstance(prev, ID):
        raise UsageError(f"next_prefix: want the chain ID so far (an ID), got {type(prev).__name__}")
    if len(tokens_array(tokens, "next_prefix: chunk")) == 0:
        return prev
    return _lanes(prev.lo ^ _DOM_PREFIX[0], prev.hi ^ _DOM_PREFIX[1], tokens)


def prefix_context(prefix: ID) -> Context:
    """The context of a chunk encoded after the prefix whose chain ID is prefix."""
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
    after the last one. chunks is a list of token lists."""
    root = p = prefix_root(fp)
    out = []
    if isinstance(chunks, (str, bytes)) or _is_int(chunks):
        raise UsageError(f"prefix_chain: want a list of chunks (token lists), got {type(chunks).__name__}")
    for i, c in enumerate(chunks):
        if _is_int(c):
            raise UsageError("prefix_chain: want a list of chunks (token lists), got a list of ints: "
                             "wrap one chunk as [tokens]")
        tokens_array(c, f"prefix_chain: chunk {i}")
        out.append(standalone_context() if p == root else prefix_context(p))
        p = next_prefix(p, c)
    return out, p


def window_or_prefix(fp: Fingerprint, w: int, before) -> Context:
    """The key context of a chunk encoded after the last w tokens of before,
    the chunks that precede it in its prompt (chunk.WindowOrPrefix): their
    prefix context when the window holds all of them, else the window."""
    if not _is_int(w) or w < 0:
        raise UsageError(f"window_or_prefix: window {w!r}: want a non-negative int")
    if any(_is_int(c) for c in before):
        raise UsageError("window_or_prefix: before is the list of chunks (token lists) before the chunk")
    before = [tokens_array(c, "window_or_prefix: chunk").tolist() for c in before]
    flat = [t for c in before for t in c]
    if len(flat) <= w:
        _, end = prefix_chain(fp, before)
        return canonical(fp, prefix_context(end))
    return window_context(fp, w, flat[len(flat) - w:])


def check_key(key: "Key", tokens) -> None:
    """Raises UsageError (a ValueError) unless key names an entry holding tokens
    (chunk.CheckKey): the content ID is the one tokens give, and the
    context is canonical in form and the one key of its computation."""
    c = key.context
    if c.kind is ContextKind.STANDALONE and (c.window != 0 or not c.id.is_zero()):
        raise UsageError(f"standalone context with ID {c.id} and window {c.window} (both must be zero)")
    if c.kind is ContextKind.WINDOW and not 1 <= c.window <= MAX_WINDOW:
        raise UsageError(f"window {c.window} out of range 1..{MAX_WINDOW}")
    if c.kind is ContextKind.PREFIX and c.window != 0:
        raise UsageError(f"prefix context with window {c.window} (must be zero)")
    if canonical(key.fingerprint, c) != c:
        raise UsageError(f"context {c} names the encoding of a chunk with nothing before it, which is keyed standalone")
    if content_id(key.fingerprint, tokens) != key.content:
        raise UsageError(f"content ID {key.content} is not the one the {len(tokens)} tokens give")


MAX_WINDOW = 1 << 24


def want_context(c, what: str) -> Context:
    """c if it is a Context, else UsageError naming the usual mistakes."""
    if isinstance(c, Context):
        return c
    if isinstance(c, tuple) and len(c) == 2 and isinstance(c[1], ID):
        raise UsageError(f"{what}: got the (contexts, end) pair that prefix_chain returns; "
                         "pass one chunk's context, contexts[i]")
    raise UsageError(f"{what}: want a kvmesh.Context (prefix_chain, window_or_prefix, standalone_context), "
                     f"got {type(c).__name__}")


def want_id(i, what: str) -> ID:
    """i if it is an ID, else UsageError (tokens passed where a content ID
    belongs is the usual mistake)."""
    if isinstance(i, ID):
        return i
    if isinstance(i, (list, tuple)) or hasattr(i, "shape"):
        raise UsageError(f"{what}: want the chunk's content ID (kvmesh.content_id(fp, tokens)), got its tokens")
    raise UsageError(f"{what}: want a kvmesh.ID, got {type(i).__name__}")


@dataclasses.dataclass(frozen=True)
class Key:
    """Names one stored encoding of a chunk: the model's fingerprint, the
    chunk's content ID and the context it was encoded after."""

    fingerprint: Fingerprint
    content: ID
    context: Context

    def __post_init__(self):
        _fp(self.fingerprint, "Key.fingerprint")
        want_id(self.content, "Key.content")
        want_context(self.context, "Key.context")

    def __str__(self) -> str:
        return f"{self.fingerprint}/{self.content}/{self.context}"
