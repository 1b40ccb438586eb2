"""A Hugging Face transformers config.json of the decoder families kvmesh
knows, read as Go's hfconfig package reads it, and the ModelSpec of the KV
such a model produces (docs/KEYS.md, section 1b). Members it does not read
are ignored, as transformers does."""

from __future__ import annotations

import dataclasses
import json
import math
import os

from .errors import ModelError
from .keys import DType, ModelSpec, RopeScaling, RopeStyle

__all__ = ["FAMILIES", "Config", "parse", "load"]

# model_type values Go's hfconfig accepts.
FAMILIES = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe")


@dataclasses.dataclass(frozen=True)
class Config:
    """The part of a config.json kvmesh reads (hfconfig.Config)."""

    model_type: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float = 10000.0
    partial_rotary_factor: float = 0.0  # 0 means 1
    rope_scaling: RopeScaling = RopeScaling()
    rope_style: RopeStyle = RopeStyle.NEOX
    max_position_embeddings: int = 0
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q, k, v biases; and o_proj's, except in Qwen2
    mlp_bias: bool = False
    hidden_act: str = ""
    qk_norm: bool = False  # Qwen3: RMSNorm over head_dim of q and k before RoPE
    sliding_window: int = 0
    dtype: DType = DType.F32  # of the weights (torch_dtype)

    @property
    def output_bias(self) -> bool:
        """o_proj has a bias: attention_bias in every family but Qwen2."""
        return self.attention_bias and self.model_type != "qwen2"

    @property
    def rotary_dim(self) -> int:
        """The number of head dims RoPE rotates."""
        return int(self.head_dim * (self.partial_rotary_factor or 1))

    def spec(self, kv_dtype: "DType | str" = DType.F32, weights_revision: str = "", tokenizer_id: str = "",
             salt: str = "") -> ModelSpec:
        """The ModelSpec of the KV this model produces, stored in kv_dtype
        (hfconfig.Config.Spec); a config.json names neither its weights nor
        its tokenizer, so the caller gives them."""
        rd = self.rotary_dim
        return ModelSpec(self.model_type, self.num_layers, self.num_kv_heads, self.head_dim, DType.parse(kv_dtype),
                         self.rope_style, self.rope_theta, 0 if rd == self.head_dim else rd, self.rope_scaling,
                         weights_revision, tokenizer_id, salt)

    def validate(self) -> None:
        """Raises ModelError with the first reason the config cannot be a
        model of FAMILIES (hfconfig.Config.Validate)."""
        if self.model_type not in FAMILIES:
            raise ModelError(f"unsupported model_type {self.model_type!r} (want one of {', '.join(FAMILIES)})")
        bad = ""
        if self.hidden_size <= 0 or self.num_layers <= 0:
            bad = f"hidden_size {self.hidden_size} and num_hidden_layers {self.num_layers} must be positive"
        elif self.num_heads <= 0 or self.num_kv_heads <= 0 or self.num_heads % self.num_kv_heads:
            bad = (f"num_attention_heads {self.num_heads} must be a positive multiple of num_key_value_heads "
                   f"{self.num_kv_heads}")
        elif self.head_dim <= 0 or self.head_dim % 2:
            bad = f"head dim {self.head_dim} must be even and positive"
        elif not 0 <= self.partial_rotary_factor <= 1:
            bad = f"partial_rotary_factor {self.partial_rotary_factor} out of [0, 1]"
        elif self.rotary_dim % 2 or self.rotary_dim == 0:
            bad = f"rotary dim {self.rotary_dim} must be even and positive"
        elif min(self.intermediate_size, self.vocab_size, self.max_position_embeddings, self.sliding_window,
                 self.rms_norm_eps) < 0:
            bad = "negative size"
        if bad:
            raise ModelError("invalid config.json: " + bad)
        try:
            self.spec().validate()
        except ValueError as e:
            raise ModelError(f"invalid config.json: {e}") from None


def _rope(r: dict, h: dict, theta: float, partial: float):
    if not isinstance(r, dict):
        raise ModelError("invalid config.json: rope parameters are not an object")
    if r.get("rope_theta") is not None:
        if h.get("rope_theta") is not None and h["rope_theta"] != r["rope_theta"]:
            raise ModelError(f"invalid config.json: rope_theta {h['rope_theta']} and rope_parameters.rope_theta "
                             f"{r['rope_theta']} disagree")
        theta = float(r["rope_theta"])
    if r.get("partial_rotary_factor") is not None:
        partial = float(r["partial_rotary_factor"])
    typ, legacy = r.get("rope_type") or "", r.get("type") or ""
    if not typ:
        typ = legacy
    elif legacy and legacy != typ:
        raise ModelError(f"invalid config.json: rope type {legacy!r} and rope_type {typ!r} disagree")
    g = lambda k: float(r.get(k) or 0)  # noqa: E731
    mpe = int(h.get("max_position_embeddings") or 0)
    if typ in ("", "default"):
        sc = RopeScaling()
    elif typ == "linear":
        sc = RopeScaling("linear", factor=g("factor"))
    elif typ == "dynamic":
        sc = RopeScaling("dynamic", factor=g("factor"), max_positions=mpe)
    elif typ == "llama3":
        sc = RopeScaling("llama3", factor=g("factor"), low_freq_factor=g("low_freq_factor"),
                         high_freq_factor=g("high_freq_factor"),
                         original_max_positions=int(r.get("original_max_position_embeddings") or 0))
    elif typ == "yarn":
        sc = RopeScaling("yarn", factor=g("factor"), beta_fast=g("beta_fast"), beta_slow=g("beta_slow"),
                         attention_factor=g("attention_factor"),
                         original_max_positions=int(r.get("original_max_position_embeddings") or 0) or mpe)
    else:
        raise ModelError(f"unsupported rope type {typ!r} (want default, linear, dynamic, llama3 or yarn)")
    return sc, theta, partial


def parse(data: "str | bytes | dict") -> Config:
    """Reads a config.json (its text, or the parsed object) as Go's
    hfconfig.Parse does, and validates it."""
    if isinstance(data, dict):
        h = data
    else:
        try:
            h = json.loads(data)
        except ValueError as e:
            raise ModelError(f"invalid config.json: {e}") from None
    if not isinstance(h, dict):
        raise ModelError("invalid config.json: not a JSON object")
    mt = h.get("model_type", "")
    if mt not in FAMILIES:
        raise ModelError(f"unsupported model_type {mt!r} (want one of {', '.join(FAMILIES)})")
    i = lambda k: int(h.get(k) or 0)  # noqa: E731
    heads, hidden = i("num_attention_heads"), i("hidden_size")
    kv = h.get("num_key_value_heads")
    kv = heads if kv is None else int(kv)
    if h.get("head_dim"):
        hd = int(h["head_dim"])
    elif heads > 0 and hidden % heads:
        raise ModelError(f"invalid config.json: no head_dim, and hidden_size {hidden} is not a multiple of "
                         f"num_attention_heads {heads}")
    else:
        hd = hidden // heads if heads > 0 else 0
    theta = float(h["rope_theta"]) if h.get("rope_theta") is not None else 10000.0
    partial = float(h["partial_rotary_factor"]) if h.get("partial_rotary_factor") is not None else 0.0
    bias = mt in ("qwen2", "qwen2_moe")
    if h.get("attention_bias") is not None:
        bias = bool(h["attention_bias"])
    sw = h.get("sliding_window")
    use_sw = h.get("use_sliding_window")
    window = int(sw) if sw and sw > 0 and (use_sw is None or use_sw) else 0
    style = {"": RopeStyle.NEOX, "neox": RopeStyle.NEOX, "gptj": RopeStyle.GPTJ}.get(h.get("kvmesh_rope_style") or "")
    if style is None:
        raise ModelError(f"unsupported kvmesh_rope_style {h['kvmesh_rope_style']!r} (want neox or gptj)")
    td, dt2 = h.get("torch_dtype") or "", h.get("dtype") or ""
    if td and dt2 and td != dt2:
        raise ModelError(f"invalid config.json: torch_dtype {td!r} and dtype {dt2!r} disagree")
    try:
        dtype = DType.parse(td or dt2) if (td or dt2) else DType.F32
    except ValueError:
        raise ModelError(f"unsupported torch_dtype {td or dt2!r}") from None
    rope, params = h.get("rope_scaling"), h.get("rope_parameters")
    if params is not None:
        if rope is not None:
            raise ModelError("invalid config.json: both rope_scaling and rope_parameters")
        rope = params
    sc = RopeScaling()
    if rope is not None:
        sc, theta, partial = _rope(rope, h, theta, partial)
    c = Config(mt, hidden, i("intermediate_size"), i("num_hidden_layers"), heads, kv, hd, i("vocab_size"),
               float(h.get("rms_norm_eps") or 0), theta, partial, sc, style, i("max_position_embeddings"),
               bool(h.get("tie_word_embeddings", False)), bias, bool(h.get("mlp_bias", False)),
               h.get("hidden_act") or "", mt in ("qwen3", "qwen3_moe"), window, dtype)
    c.validate()
    if not math.isfinite(c.rope_theta):
        raise ModelError("invalid config.json: rope_theta is not finite")
    return c


def load(path: str) -> Config:
    """Reads path/config.json (or path itself, if it is a file)."""
    p = os.path.join(path, "config.json") if os.path.isdir(path) else path
    try:
        with open(p, "rb") as f:
            return parse(f.read())
    except OSError as e:
        raise ModelError(f"read config: {e}") from None
