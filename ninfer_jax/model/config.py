"""Model configuration from a Hugging Face `config.json`, in both published styles.

Accepted: `qwen3_next`, `qwen3_5_text`, `qwen3_5_moe_text`, and the nested multimodal wrappers
`qwen3_5` / `qwen3_5_moe` (their `text_config` is used; the `vision_config` and the media
token ids are read by `vision.parse_vision_config` / `rope_index.VisionTokens`). Both the
current fields (`layer_types`, `rope_parameters`) and the legacy ones
(`full_attention_interval`, top-level `rope_theta` / `partial_rotary_factor`, `mtp_*`) load.
Anything unknown or inconsistent is a `ConfigError` naming the field.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from ninfer_jax.errors import ConfigError

LINEAR = "linear_attention"
FULL = "full_attention"
ARCHITECTURES = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")
_WRAPPERS = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    layer_types: tuple[str, ...]
    # Gated full attention.
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope_theta: float
    partial_rotary_factor: float
    # Gated DeltaNet.
    linear_conv_kernel_dim: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    # Feed-forward: "dense" or "moe" per layer.
    mlp_types: tuple[str, ...]
    intermediate_size: int
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    norm_topk_prob: bool = True
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 32768
    eos_token_id: tuple[int, ...] = ()
    mtp_num_hidden_layers: int = 0
    # M-RoPE: how many of the rotary_dim/2 frequencies follow the (t, h, w) position axes
    # (None: plain 1-D RoPE), and whether they interleave (t h w t h w ...) or run contiguously.
    mrope_section: tuple[int, int, int] | None = None
    mrope_interleaved: bool = False

    # ---- derived sizes -------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return len(self.layer_types)

    @property
    def linear_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == LINEAR)

    @property
    def attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == FULL)

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.linear_key_dim + self.linear_value_dim

    @property
    def grouped_projections(self) -> bool:
        """Qwen3-Next stores `in_proj_qkvz`/`in_proj_ba` grouped per key head."""
        return self.model_type == "qwen3_next"

    def kv_bytes_per_token(self, itemsize: int) -> int:
        """Main KV bytes per token over all full-attention layers (K and V)."""
        return 2 * len(self.attention_layers) * self.num_key_value_heads * self.head_dim * itemsize

    def state_image_bytes(self, itemsize: int) -> int:
        """Bytes of one StateImage: conv + float32 recurrent state per GDN layer, plus the
        continuation hidden."""
        per_layer = (self.linear_conv_kernel_dim - 1) * self.conv_dim * itemsize + 4 * (
            self.linear_num_value_heads * self.linear_key_head_dim * self.linear_value_head_dim
        )
        return len(self.linear_layers) * per_layer + self.hidden_size * itemsize

    def param_count(self) -> int:
        """Parameters the engine keeps on the device, from the geometry alone: the embedding, the
        head (unless tied), the final norm and every layer's mixer, feed-forward and two norms.
        `mtp.*` tensors stay on the Host (weights.py) and are not counted."""
        h = self.hidden_size
        n = self.vocab_size * h * (1 if self.tie_word_embeddings else 2) + h
        for kind, mlp in zip(self.layer_types, self.mlp_types):
            n += 2 * h  # input and post-attention norms
            if kind == LINEAR:
                hv = self.linear_num_value_heads
                n += h * (self.conv_dim + self.linear_value_dim + 2 * hv)  # in_proj qkv, z, b, a
                n += self.conv_dim * self.linear_conv_kernel_dim  # depthwise conv
                n += 2 * hv + self.linear_value_head_dim  # dt_bias, A_log, output norm
                n += self.linear_value_dim * h  # out_proj
            else:
                hq, hkv, d = self.num_attention_heads, self.num_key_value_heads, self.head_dim
                n += h * (2 * hq * d + 2 * hkv * d) + hq * d * h + 2 * d  # q|gate, k, v, o, q/k norms
            if mlp == "moe":
                e, i, s = self.num_experts, self.moe_intermediate_size, self.shared_expert_intermediate_size
                n += h * e + 3 * e * h * i  # router, experts' gate, up and down
                if s:
                    n += 3 * h * s + h  # shared expert and its gate
            else:
                n += 3 * h * self.intermediate_size
        return n

    def weights_bytes(self, itemsize: int) -> int:
        """Device bytes of the parameters at `itemsize` bytes each (CFG-6: the weights share
        device memory with everything else)."""
        return self.param_count() * itemsize


# ---- parsing ---------------------------------------------------------------------------

def _get(raw: dict, field: str, kind: type | tuple, default: Any = ...) -> Any:
    if field not in raw or raw[field] is None:
        if default is ...:
            raise ConfigError(field, "is required and missing")
        return default
    value = raw[field]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ConfigError(field, f"expected {getattr(kind, '__name__', kind)}, got {value!r}")
    return value


def _positive(raw: dict, field: str, default: Any = ...) -> int:
    value = _get(raw, field, int, default)
    if value <= 0:
        raise ConfigError(field, f"must be positive, got {value}")
    return value


def _layer_types(raw: dict, num_layers: int) -> tuple[str, ...]:
    if raw.get("layer_types") is not None:
        types = raw["layer_types"]
        if not isinstance(types, list) or len(types) != num_layers:
            raise ConfigError(
                "layer_types", f"needs one entry per layer ({num_layers}), got {types!r}")
        for t in types:
            if t not in (LINEAR, FULL):
                raise ConfigError("layer_types", f"unknown layer type {t!r}; expected {LINEAR!r} or {FULL!r}")
        return tuple(types)
    interval = _positive(raw, "full_attention_interval", 4)  # legacy field
    return tuple(LINEAR if (i + 1) % interval else FULL for i in range(num_layers))


def _rope_params(raw: dict) -> dict:
    params = raw.get("rope_parameters")
    if params is None:
        params = raw.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise ConfigError("rope_parameters", f"expected an object, got {params!r}")
    return params


def _rope(raw: dict) -> tuple[float, float]:
    params = _rope_params(raw)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise ConfigError("rope_parameters.rope_type", f"{rope_type!r} is not supported (only 'default')")
    theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
    factor = params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 0.25))
    if not isinstance(theta, (int, float)) or theta <= 0:
        raise ConfigError("rope_theta", f"must be a positive number, got {theta!r}")
    if not isinstance(factor, (int, float)) or not 0 < factor <= 1:
        raise ConfigError("partial_rotary_factor", f"must lie in (0, 1], got {factor!r}")
    return float(theta), float(factor)


def _mrope(raw: dict, rotary_dim: int) -> tuple[tuple[int, int, int] | None, bool]:
    """`rope_parameters.mrope_section` (three non-negative ints summing to rotary_dim/2, or
    absent) and `rope_parameters.mrope_interleaved` (a bool, default False)."""
    params = _rope_params(raw)
    interleaved = params.get("mrope_interleaved")
    if interleaved is None:
        interleaved = False
    elif not isinstance(interleaved, bool):
        raise ConfigError("rope_parameters.mrope_interleaved", f"expected a bool, got {interleaved!r}")
    section = params.get("mrope_section")
    if section is None:
        return None, interleaved
    field = "rope_parameters.mrope_section"
    if (not isinstance(section, (list, tuple)) or len(section) != 3
            or any(not isinstance(s, int) or isinstance(s, bool) or s < 0 for s in section)):
        raise ConfigError(field, f"expected a list of 3 non-negative ints, got {section!r}")
    if sum(section) != rotary_dim // 2:
        raise ConfigError(field, f"{section} must sum to rotary_dim/2 = {rotary_dim // 2}, got {sum(section)}")
    return tuple(section), interleaved


def _eos(raw: dict) -> tuple[int, ...]:
    eos = raw.get("eos_token_id")
    if eos is None:
        return ()
    eos = [eos] if isinstance(eos, int) else eos
    if not isinstance(eos, list) or not all(isinstance(e, int) for e in eos):
        raise ConfigError("eos_token_id", f"expected an int or a list of ints, got {eos!r}")
    return tuple(eos)


def parse_config(raw: dict) -> ModelConfig:
    """A `ModelConfig` from the parsed JSON of a Hugging Face `config.json`."""
    if not isinstance(raw, dict):
        raise ConfigError("config", "expected a JSON object")
    model_type = raw.get("model_type")
    if model_type in _WRAPPERS:
        outer = raw
        raw = dict(_get(outer, "text_config", dict))
        raw.setdefault("model_type", _WRAPPERS[model_type])
        for key in ("tie_word_embeddings", "eos_token_id"):
            if raw.get(key) is None and outer.get(key) is not None:
                raw[key] = outer[key]
        model_type = raw["model_type"]
    if model_type not in ARCHITECTURES:
        raise ConfigError(
            "model_type", f"unknown {model_type!r}; supported: {', '.join(ARCHITECTURES + tuple(_WRAPPERS))}")
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise ConfigError("hidden_act", f"only 'silu' is supported, got {act!r}")
    if raw.get("attention_bias", False):
        raise ConfigError("attention_bias", "attention projections with bias are not supported")

    num_layers = _positive(raw, "num_hidden_layers")
    layer_types = _layer_types(raw, num_layers)
    hidden = _positive(raw, "hidden_size")
    heads = _positive(raw, "num_attention_heads")
    kv_heads = _positive(raw, "num_key_value_heads", heads)
    if heads % kv_heads:
        raise ConfigError("num_key_value_heads", f"{kv_heads} does not divide num_attention_heads={heads}")
    head_dim = _positive(raw, "head_dim", hidden // heads)
    theta, factor = _rope(raw)
    if int(head_dim * factor) % 2:
        raise ConfigError("partial_rotary_factor", f"head_dim*factor = {head_dim * factor} must be even")
    mrope_section, mrope_interleaved = _mrope(raw, int(head_dim * factor))
    k_heads = _positive(raw, "linear_num_key_heads")
    v_heads = _positive(raw, "linear_num_value_heads")
    if v_heads % k_heads:
        raise ConfigError("linear_num_value_heads", f"{v_heads} is not a multiple of linear_num_key_heads={k_heads}")

    moe_fields: dict[str, Any] = {}
    if model_type == "qwen3_5_text":
        mlp_types = ("dense",) * num_layers
    else:
        num_experts = _positive(raw, "num_experts")
        top_k = _positive(raw, "num_experts_per_tok")
        if top_k > num_experts:
            raise ConfigError("num_experts_per_tok", f"{top_k} exceeds num_experts={num_experts}")
        moe_fields = dict(
            num_experts=num_experts,
            num_experts_per_tok=top_k,
            moe_intermediate_size=_positive(raw, "moe_intermediate_size"),
            shared_expert_intermediate_size=_get(raw, "shared_expert_intermediate_size", int, 0),
            # Qwen3.5-MoE always renormalises the top-k weights.
            norm_topk_prob=_get(raw, "norm_topk_prob", bool, True) if model_type == "qwen3_next" else True,
        )
        if model_type == "qwen3_next":
            step = _positive(raw, "decoder_sparse_step", 1)
            only = _get(raw, "mlp_only_layers", list, [])
            if any(not isinstance(i, int) or not 0 <= i < num_layers for i in only):
                raise ConfigError("mlp_only_layers", f"entries must be layer indices < {num_layers}, got {only!r}")
            mlp_types = tuple(
                "moe" if i not in only and (i + 1) % step == 0 else "dense" for i in range(num_layers))
        else:
            mlp_types = ("moe",) * num_layers
    intermediate = _positive(raw, "intermediate_size", 0) if "dense" in mlp_types else _get(
        raw, "intermediate_size", int, 0)

    mtp_layers = _get(raw, "mtp_num_hidden_layers", int, _get(raw, "num_nextn_predict_layers", int, 0))
    return ModelConfig(
        model_type=model_type,
        vocab_size=_positive(raw, "vocab_size"),
        hidden_size=hidden,
        layer_types=layer_types,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        rope_theta=theta,
        partial_rotary_factor=factor,
        linear_conv_kernel_dim=_positive(raw, "linear_conv_kernel_dim", 4),
        linear_key_head_dim=_positive(raw, "linear_key_head_dim"),
        linear_value_head_dim=_positive(raw, "linear_value_head_dim"),
        linear_num_key_heads=k_heads,
        linear_num_value_heads=v_heads,
        mlp_types=mlp_types,
        intermediate_size=intermediate,
        rms_norm_eps=_get(raw, "rms_norm_eps", float, 1e-6),
        tie_word_embeddings=_get(raw, "tie_word_embeddings", bool, False),
        max_position_embeddings=_positive(raw, "max_position_embeddings", 32768),
        eos_token_id=_eos(raw),
        mtp_num_hidden_layers=max(0, mtp_layers),
        mrope_section=mrope_section,
        mrope_interleaved=mrope_interleaved,
        **moe_fields,
    )


def declared_dtype(raw: dict) -> str | None:
    """The dtype a `config.json` declares for its weights (`dtype`, or the legacy `torch_dtype`;
    the wrapper's own, else its `text_config`'s), as a numpy-style name such as "bfloat16";
    None when it declares none (or "auto")."""
    for obj in (raw, raw.get("text_config") if isinstance(raw, dict) else None):
        if not isinstance(obj, dict):
            continue
        for key in ("dtype", "torch_dtype"):
            value = obj.get(key)
            if isinstance(value, str) and value.strip():
                name = value.strip().lower().removeprefix("torch.")
                name = _DTYPE_ALIASES.get(name, name)
                if name != "auto":
                    return name
    return None


_DTYPE_ALIASES = {"float": "float32", "half": "float16", "bf16": "bfloat16", "fp16": "float16",
                  "fp32": "float32", "double": "float64"}


def read_config_json(folder: str) -> dict:
    """The parsed `config.json` of a checkpoint folder, or a ConfigError."""
    path = os.path.join(folder, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise ConfigError("config.json", f"not found in {folder!r}") from None
    except json.JSONDecodeError as e:
        raise ConfigError("config.json", f"is not valid JSON ({e})") from None


def load_config(folder: str) -> ModelConfig:
    return parse_config(read_config_json(folder))
