"""DFlash block-diffusion drafter (issue 35, first piece): config, weights, forward.

A published DFlash drafter folder loads as it is: `config.json` is a Qwen3 config with
`"architectures": ["DFlashDraftModel"]` and `"dflash_config": {"mask_token_id",
"target_layer_ids", "block_size"}` (`block_size` may sit at the top level instead; a folder may
hold the drafter one level down, in a single subfolder). Tensor names carry no prefix: `fc.*`,
`hidden_norm.*`, `norm.*`, `layers.{i}.*`; no embedding and no LM head (the target's are used).

Public code read for the formulas (nothing copied):
- z-lab/dflash `dflash/model.py` (the torch reference, `DFlashDraftModel`,
  `Qwen3DFlashAttention`, `Qwen3DFlashDecoderLayer`, `dflash_generate`) and
  `dflash/model_mlx.py` (the same drafter written with an explicit context KV cache). Taken:
  target features = concat of `hidden_states[i + 1]` for i in target_layer_ids, then
  `hidden_norm(fc(.))`; that projected context goes straight into every layer's k_proj/v_proj
  (no input_layernorm), k_norm per head, RoPE at its absolute positions; the block goes through
  input_layernorm, q/k/v, q_norm/k_norm, RoPE; keys/values = [context ; block]; scale
  head_dim^-0.5; GQA by repeating kv heads; o_proj; residual; post_attention_layernorm, SiLU-gated
  MLP, residual; final `norm`; logits from the target's head. Qwen3RMSNorm is
  `w · (x·rsqrt(mean x² + eps))` rounded to x's dtype before the weight. The newer reference
  also scales the block embeddings (`input_embedding_scale`) and the logits
  (`output_multiplier`, `final_logit_softcapping`), read from dflash_config or the top level.
- vLLM `vllm/model_executor/models/qwen3_dflash.py` (`_resolve_layer_attention`,
  `precompute_and_store_context_kv`): sliding-attention layers are causal inside the block and
  windowed, full layers non-causal (`dflash_config.causal` overrides; z-lab's newer code reads a
  top-level `is_causal`), and context K/V can be computed once from the target features and
  cached. The window rule `q_pos - k_pos < window` is the reference's explicit mask.
- transformers' Qwen3Config: without `layer_types`, layer i slides iff `use_sliding_window` and
  i >= `max_window_layers` (default 28); `sliding_window` counts only with `use_sliding_window`.

Not built here: YaRN or other rope scaling (a ConfigError), attention bias, DFlash2, the engine.
Parameters are stored `[in, out]` like `weights.py`; every function is pure and jit-able with
the config static.
"""
from __future__ import annotations

import dataclasses
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ninfer_jax.errors import CheckpointError, ConfigError
from ninfer_jax.model.config import ModelConfig, read_config_json
from ninfer_jax.model.layers import apply_rope, matmul
from ninfer_jax.model.weights import Tensors
from pallas_kernels._common import softmax, tree_sum

ARCHITECTURE = "DFlashDraftModel"
SLIDING, FULL = "sliding_attention", "full_attention"
# dflash_config keys whose meaning this module implements; any other one is refused rather
# than silently ignored (it could change the drafter's math: DFlash2's convolutions, sinks...).
_DFLASH_KEYS = frozenset({"mask_token_id", "target_layer_ids", "block_size", "causal",
                          "input_embedding_scale", "output_multiplier", "final_logit_softcapping"})


@dataclasses.dataclass(frozen=True)
class DFlashConfig:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    layer_windows: tuple[int | None, ...]  # per layer: sliding window, None for full attention
    layer_causal: tuple[bool, ...]  # per layer: causal inside the block
    vocab_size: int | None = None
    num_target_layers: int | None = None
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None

    def kv_bytes_per_token(self, itemsize: int) -> int:
        """Drafter context K and V bytes per token over all its layers (for a later pool)."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * itemsize


# ---- config -------------------------------------------------------------------------------

def _int(raw: dict, key: str, field: str, default=..., minimum: int = 1) -> int:
    value = raw.get(key)
    if value is None:
        if default is ...:
            raise ConfigError(field, "is required and missing")
        return default
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(field, f"expected an int, got {value!r}")
    if value < minimum:
        raise ConfigError(field, f"must be >= {minimum}, got {value}")
    return value


def _num(raw: dict, key: str, field: str, default=...) -> float:
    value = raw.get(key)
    if value is None:
        if default is ...:
            raise ConfigError(field, "is required and missing")
        return default
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not np.isfinite(value) or value <= 0:
        raise ConfigError(field, f"expected a positive number, got {value!r}")
    return float(value)


def _draft_value(raw: dict, sub: dict, key: str):
    """The reference's lookup: dflash_config first, then the top level. Both set and different
    is ambiguous, so refused."""
    inner, outer = sub.get(key), raw.get(key)
    if inner is not None and outer is not None and inner != outer:
        raise ConfigError(f"dflash_config.{key}", f"{inner!r} differs from the top-level {key}={outer!r}")
    return inner if inner is not None else outer


def _rope_theta(raw: dict) -> float:
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise ConfigError("rope_parameters", f"expected an object, got {params!r}")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise ConfigError("rope_parameters.rope_type", f"{rope_type!r} is not supported for a drafter (only 'default')")
    if params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ConfigError("partial_rotary_factor", "a DFlash drafter ropes its full head dim")
    merged = {"rope_theta": params.get("rope_theta", raw.get("rope_theta"))}
    return _num(merged, "rope_theta", "rope_theta")


def _attention_layout(raw: dict, sub: dict, layers: int) -> tuple[tuple, tuple]:
    """(window per layer, causal per layer), as the reference resolves them."""
    types = raw.get("layer_types")
    use_swa = raw.get("use_sliding_window", False)
    window = raw.get("sliding_window") if use_swa else None
    if types is None:
        first = _int(raw, "max_window_layers", "max_window_layers", 28, minimum=0)
        types = [SLIDING if window is not None and i >= first else FULL for i in range(layers)]
    if not isinstance(types, list) or len(types) != layers or any(t not in (SLIDING, FULL) for t in types):
        raise ConfigError("layer_types", f"needs {layers} entries of {SLIDING!r} or {FULL!r}, got {types!r}")
    if SLIDING in types:
        window = _int({"w": window}, "w", "sliding_window", None)
        if window is None:
            raise ConfigError("sliding_window", "sliding_attention layers need use_sliding_window and a window")
    override = sub.get("causal", raw.get("is_causal"))
    if sub.get("causal") is not None and raw.get("is_causal") is not None and sub["causal"] != raw["is_causal"]:
        raise ConfigError("dflash_config.causal", "disagrees with the top-level is_causal")
    if override is not None and not isinstance(override, bool):
        raise ConfigError("dflash_config.causal", f"expected a bool, got {override!r}")
    windows = tuple(window if t == SLIDING else None for t in types)
    causal = tuple(override if override is not None else t == SLIDING for t in types)
    return windows, causal


def parse_dflash_config(raw: dict) -> DFlashConfig:
    """A DFlashConfig from a drafter's parsed `config.json`; ConfigError names a bad field."""
    if not isinstance(raw, dict):
        raise ConfigError("config", "expected a JSON object")
    arch = raw.get("architectures")
    if not isinstance(arch, list) or ARCHITECTURE not in arch:
        if isinstance(arch, list) and "DFlash2DraftModel" in arch:
            raise ConfigError("architectures", "DFlash2DraftModel drafters are not supported yet")
        raise ConfigError("architectures", f"expected [{ARCHITECTURE!r}], got {arch!r}")
    if raw.get("model_type", "qwen3") != "qwen3":
        raise ConfigError("model_type", f"a DFlash drafter is a Qwen3 stack, got {raw['model_type']!r}")
    if raw.get("hidden_act", "silu") != "silu":
        raise ConfigError("hidden_act", f"only 'silu' is supported, got {raw['hidden_act']!r}")
    if raw.get("attention_bias", False):
        raise ConfigError("attention_bias", "attention projections with bias are not supported")
    sub = raw.get("dflash_config")
    if not isinstance(sub, dict):
        raise ConfigError("dflash_config", f"expected an object, got {sub!r}")
    unknown = sorted(set(sub) - _DFLASH_KEYS)
    if unknown:
        raise ConfigError(f"dflash_config.{unknown[0]}", f"unknown field (known: {', '.join(sorted(_DFLASH_KEYS))})")

    hidden = _int(raw, "hidden_size", "hidden_size")
    if raw.get("target_hidden_size", hidden) != hidden:
        raise ConfigError("target_hidden_size", "must equal hidden_size (the target's embeddings feed the drafter)")
    layers = _int(raw, "num_hidden_layers", "num_hidden_layers")
    heads = _int(raw, "num_attention_heads", "num_attention_heads")
    kv_heads = _int(raw, "num_key_value_heads", "num_key_value_heads", heads)
    if heads % kv_heads:
        raise ConfigError("num_key_value_heads", f"{kv_heads} does not divide num_attention_heads={heads}")
    head_dim = _int(raw, "head_dim", "head_dim", hidden // heads)
    if head_dim % 2:
        raise ConfigError("head_dim", f"must be even for RoPE, got {head_dim}")

    ids = _draft_value(raw, sub, "target_layer_ids")
    if ids is None:
        raise ConfigError("dflash_config.target_layer_ids", "is required and missing")
    if (not isinstance(ids, list) or not ids
            or any(not isinstance(i, int) or isinstance(i, bool) or i < 0 for i in ids)):
        raise ConfigError("dflash_config.target_layer_ids", f"expected a non-empty list of layer indices, got {ids!r}")
    block = _draft_value(raw, sub, "block_size")
    block = _int({"b": block}, "b", "dflash_config.block_size", minimum=2)
    mask = _int({"m": _draft_value(raw, sub, "mask_token_id")}, "m", "dflash_config.mask_token_id", minimum=0)
    softcap = _draft_value(raw, sub, "final_logit_softcapping")
    windows, causal = _attention_layout(raw, sub, layers)
    return DFlashConfig(
        hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv_heads, head_dim=head_dim,
        intermediate_size=_int(raw, "intermediate_size", "intermediate_size"),
        rms_norm_eps=_num(raw, "rms_norm_eps", "rms_norm_eps", 1e-6),
        rope_theta=_rope_theta(raw), block_size=block, mask_token_id=mask,
        target_layer_ids=tuple(ids), layer_windows=windows, layer_causal=causal,
        vocab_size=_int(raw, "vocab_size", "vocab_size", None),
        num_target_layers=_int(raw, "num_target_layers", "num_target_layers", None),
        input_embedding_scale=_num({"s": _draft_value(raw, sub, "input_embedding_scale")}, "s",
                                   "input_embedding_scale", 1.0),
        output_multiplier=_num({"m": _draft_value(raw, sub, "output_multiplier")}, "m", "output_multiplier", 1.0),
        final_logit_softcapping=None if not softcap else _num({"c": softcap}, "c", "final_logit_softcapping"),
    )


def _is_drafter_config(path: str) -> bool:
    try:
        raw = read_config_json(path)
    except ConfigError:
        return False
    return isinstance(raw, dict) and isinstance(raw.get("architectures"), list) and any(
        "DFlash" in str(a) for a in raw["architectures"])


def find_drafter_folder(folder: str) -> str:
    """`folder` itself when its config.json is a drafter's, else its one subfolder that holds
    one (some published folders nest the drafter one level down). `builtin.DRAFTER_NAME` names
    the built-in model's shipped drafter."""
    from ninfer_jax.model import builtin

    if folder == builtin.DRAFTER_NAME:
        folder = builtin.drafter_folder()
    if not os.path.isdir(folder):
        raise ConfigError("draft_model", f"{folder!r} is not a folder")
    if _is_drafter_config(folder):
        return folder
    subs = sorted(os.path.join(folder, d) for d in os.listdir(folder)
                  if os.path.isdir(os.path.join(folder, d)) and _is_drafter_config(os.path.join(folder, d)))
    if len(subs) == 1:
        return subs[0]
    if subs:
        raise ConfigError("draft_model", f"{folder!r} holds several drafters: {', '.join(subs)}")
    if os.path.exists(os.path.join(folder, "config.json")):
        return folder  # parse it, so the error names the field that is wrong
    raise ConfigError("config.json", f"no drafter config.json in {folder!r} nor one level down")


def load_dflash_config(folder: str) -> tuple[DFlashConfig, str]:
    """(config, the folder that holds it)."""
    folder = find_drafter_folder(folder)
    return parse_dflash_config(read_config_json(folder)), folder


def check_drafter_fits(cfg: DFlashConfig, target: ModelConfig) -> None:
    """ConfigError unless the drafter fits the target: same hidden size (the target's embedding
    and head wrap it), the target's vocabulary (mask token inside it), its decoder layers."""
    if cfg.hidden_size != target.hidden_size:
        raise ConfigError("hidden_size", f"drafter {cfg.hidden_size} != target {target.hidden_size}")
    if cfg.vocab_size is not None and cfg.vocab_size != target.vocab_size:
        raise ConfigError("vocab_size", f"drafter {cfg.vocab_size} != target {target.vocab_size}")
    if not cfg.mask_token_id < target.vocab_size:
        raise ConfigError("dflash_config.mask_token_id",
                          f"{cfg.mask_token_id} lies outside the target's vocabulary ({target.vocab_size})")
    bad = [i for i in cfg.target_layer_ids if not i < target.num_layers]
    if bad:
        raise ConfigError("dflash_config.target_layer_ids",
                          f"{bad} do not index the target's {target.num_layers} decoder layers")
    if cfg.num_target_layers is not None and cfg.num_target_layers != target.num_layers:
        raise ConfigError("num_target_layers", f"drafter made for {cfg.num_target_layers} layers, "
                          f"the target has {target.num_layers}")


# ---- weights ------------------------------------------------------------------------------

def _linear(n_in: int, n_out: int) -> tuple:
    return (n_out, n_in)  # HF Linear weights are stored [out, in]


def hf_shapes(cfg: DFlashConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of the published layout, by name, as stored."""
    h, d, i = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    shapes = {"fc.weight": _linear(len(cfg.target_layer_ids) * h, h), "hidden_norm.weight": (h,), "norm.weight": (h,)}
    for n in range(cfg.num_hidden_layers):
        p = f"layers.{n}."
        shapes.update({
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": _linear(h, q), p + "self_attn.k_proj.weight": _linear(h, kv),
            p + "self_attn.v_proj.weight": _linear(h, kv), p + "self_attn.o_proj.weight": _linear(q, h),
            p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,),
            p + "mlp.gate_proj.weight": _linear(h, i), p + "mlp.up_proj.weight": _linear(h, i),
            p + "mlp.down_proj.weight": _linear(i, h)})
    return shapes


# pytree leaf of one layer ← HF name under `layers.{n}.`, transposed when it is a Linear.
_LAYER = {"input_norm": ("input_layernorm.weight", False), "post_norm": ("post_attention_layernorm.weight", False),
          "q_proj": ("self_attn.q_proj.weight", True), "k_proj": ("self_attn.k_proj.weight", True),
          "v_proj": ("self_attn.v_proj.weight", True), "o_proj": ("self_attn.o_proj.weight", True),
          "q_norm": ("self_attn.q_norm.weight", False), "k_norm": ("self_attn.k_norm.weight", False),
          "gate_proj": ("mlp.gate_proj.weight", True), "up_proj": ("mlp.up_proj.weight", True),
          "down_proj": ("mlp.down_proj.weight", True)}


class Drafter(NamedTuple):
    config: DFlashConfig
    params: dict  # numpy arrays of the asked dtype, matmul weights [in, out]
    folder: str  # where the config and tensors were found


def load_drafter(folder: str, dtype) -> Drafter:
    """Read and check a drafter folder. Pytree: fc [n·H, H], hidden_norm [H], norm [H],
    layers: list of dicts (input_norm, post_norm, q/k/v/o_proj, q_norm, k_norm, gate/up/down_proj)."""
    cfg, folder = load_dflash_config(folder)
    tensors = Tensors(folder)
    names, expected = tensors.names(), hf_shapes(cfg)
    missing = [n for n in expected if n not in names]
    unexpected = sorted(names - set(expected))
    misshapen = [f"{n} {tensors.shape(n)}, expected {expected[n]}" for n in expected
                 if n in names and tensors.shape(n) != expected[n]]
    if missing or unexpected or misshapen:
        raise CheckpointError(f"drafter {folder!r} does not match its config", missing=missing,
                              unexpected=unexpected, misshapen=misshapen)

    def get(name: str, transpose: bool) -> np.ndarray:
        w = np.asarray(tensors.get(name))
        return (w.T if transpose else w).astype(dtype)

    return Drafter(cfg, _layout(cfg, get), folder)


def param_shapes(cfg: DFlashConfig) -> dict:
    """The drafter's params pytree (`load_drafter`'s layout) with each leaf's shape instead of an
    array: what `ninfer lower` traces the DFlash steps over, from the config alone."""
    hf = hf_shapes(cfg)
    return _layout(cfg, lambda name, transpose: hf[name][::-1] if transpose else hf[name])


def hf_tensors(cfg: DFlashConfig, params: dict) -> dict[str, np.ndarray]:
    """`params` (`load_drafter`'s layout) as the published tensors by name: Linears back to
    `[out, in]` (what a trained drafter is saved as; `load_drafter` reads it back)."""
    out = {"fc.weight": params["fc"].T, "hidden_norm.weight": params["hidden_norm"], "norm.weight": params["norm"]}
    for n, layer in enumerate(params["layers"]):
        out.update({f"layers.{n}.{name}": (layer[k].T if t else layer[k]) for k, (name, t) in _LAYER.items()})
    return {k: np.ascontiguousarray(np.asarray(v)) for k, v in out.items()}


def _layout(cfg: DFlashConfig, get) -> dict:
    """The params pytree with `get(hf_name, transposed)` at each leaf."""
    return {"fc": get("fc.weight", True), "hidden_norm": get("hidden_norm.weight", False),
            "norm": get("norm.weight", False),
            "layers": [{k: get(f"layers.{n}.{name}", t) for k, (name, t) in _LAYER.items()}
                       for n in range(cfg.num_hidden_layers)]}


# ---- forward ------------------------------------------------------------------------------

def rms_norm(x: jax.Array, w: jax.Array, eps: float) -> jax.Array:
    """Qwen3RMSNorm: plain weight (x·w, not x·(1+w)), normalised in float32 and rounded to x's
    dtype before the weight, as transformers does."""
    x32 = x.astype(jnp.float32)
    y = (x32 * jax.lax.rsqrt(tree_sum(x32 * x32)[..., None] / x.shape[-1] + eps)).astype(x.dtype)
    return w.astype(x.dtype) * y


def _rope(x: jax.Array, positions: jax.Array, cfg: DFlashConfig) -> jax.Array:
    """NeoX rotate-half RoPE over the full head dim at absolute `positions` `[...]`."""
    d = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return apply_rope(x, jnp.cos(emb).astype(x.dtype), jnp.sin(emb).astype(x.dtype))


def _heads(x: jax.Array, w: jax.Array, heads: int, d: int) -> jax.Array:
    return matmul(x, w).reshape(*x.shape[:-1], heads, d)


def project_context(params: dict, cfg: DFlashConfig, target_features: jax.Array) -> jax.Array:
    """Target features `[T, n·H]` (the configured layers' outputs, concatenated in
    target_layer_ids order) → the drafter's context hidden `[T, H]`: hidden_norm(fc(.))."""
    return rms_norm(matmul(target_features, params["fc"]), params["hidden_norm"], cfg.rms_norm_eps)


def context_kv(params: dict, cfg: DFlashConfig, target_features: jax.Array,
               positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Context K, V for every drafter layer, `[L, T, Hkv, D]` each (K normed and roped at the
    absolute `positions` `[T]`). They depend on nothing else, so they can be cached and appended
    to as positions are accepted."""
    ctx = project_context(params, cfg, target_features)
    ks, vs = [], []
    for p in params["layers"]:
        k = _heads(ctx, p["k_proj"], cfg.num_key_value_heads, cfg.head_dim)
        ks.append(_rope(rms_norm(k, p["k_norm"], cfg.rms_norm_eps), positions, cfg))
        vs.append(_heads(ctx, p["v_proj"], cfg.num_key_value_heads, cfg.head_dim))
    return jnp.stack(ks), jnp.stack(vs)


def _visible(q_pos: jax.Array, k_pos: jax.Array, window: int | None, causal: bool) -> jax.Array:
    """[B, S] mask from absolute positions: causal (k <= q) only where the layer is, and the
    sliding window q - k < window (both ways when not causal, as the reference's mask)."""
    q, k = q_pos[:, None], k_pos[None, :]
    ok = jnp.ones((q_pos.shape[0], k_pos.shape[0]), dtype=bool)
    if causal:
        ok &= k <= q
    if window is not None:
        ok &= q - k < window
        if not causal:
            ok &= k - q < window
    return ok


def _attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """q `[B, Hq, D]`, k/v `[S, Hkv, D]`, mask `[B, S]` → `[B, Hq, D]`; float32 scores."""
    groups = q.shape[1] // k.shape[1]
    k, v = jnp.repeat(k, groups, axis=1), jnp.repeat(v, groups, axis=1)
    hi = jax.lax.Precision.HIGHEST
    s = jnp.einsum("bhd,shd->hbs", q.astype(jnp.float32), k.astype(jnp.float32), precision=hi)
    s = jnp.where(mask[None], s * q.shape[-1] ** -0.5, -jnp.inf)
    o = jnp.einsum("hbs,shd->bhd", softmax(s), v.astype(jnp.float32), precision=hi)
    return o.astype(q.dtype)


def draft_block(params: dict, cfg: DFlashConfig, ctx_k: jax.Array, ctx_v: jax.Array, ctx_len: jax.Array,
                block_embeds: jax.Array, block_positions: jax.Array,
                ctx_positions: jax.Array | None = None) -> jax.Array:
    """One block through the drafter → its final hidden states `[B, H]` (after `norm`).

    ctx_k/ctx_v `[L, S, Hkv, D]` from `context_kv`, of which the first `ctx_len` (traced int)
    rows are valid, at `ctx_positions` `[S]` (default 0..S-1); block_embeds `[B, H]` are the
    TARGET's embeddings of [last accepted token, mask × (B-1)] at block_positions `[B]`. The
    block's own K/V are used here and never kept. Logits: `draft_logits(cfg, out[1:], head)`."""
    s = ctx_k.shape[1]
    if ctx_positions is None:
        ctx_positions = jnp.arange(s, dtype=jnp.int32)
    valid = jnp.arange(s) < ctx_len
    key_pos = jnp.concatenate([ctx_positions.astype(jnp.int32), block_positions.astype(jnp.int32)])
    keep = jnp.concatenate([valid, jnp.ones(block_positions.shape, dtype=bool)])
    h = block_embeds * jnp.asarray(cfg.input_embedding_scale, block_embeds.dtype)
    hq, hkv, d, eps = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps
    for n, p in enumerate(params["layers"]):
        x = rms_norm(h, p["input_norm"], eps)
        q = _rope(rms_norm(_heads(x, p["q_proj"], hq, d), p["q_norm"], eps), block_positions, cfg)
        k = _rope(rms_norm(_heads(x, p["k_proj"], hkv, d), p["k_norm"], eps), block_positions, cfg)
        v = _heads(x, p["v_proj"], hkv, d)
        # Padding rows past ctx_len are zeroed as well as masked: 0·NaN would still poison.
        cv = jnp.where(valid[:, None, None], ctx_v[n], 0)
        mask = keep[None, :] & _visible(block_positions, key_pos, cfg.layer_windows[n], cfg.layer_causal[n])
        o = _attend(q, jnp.concatenate([ctx_k[n], k]), jnp.concatenate([cv, v]), mask)
        h = h + matmul(o.reshape(o.shape[0], -1), p["o_proj"])
        x = rms_norm(h, p["post_norm"], eps)
        h = h + matmul(jax.nn.silu(matmul(x, p["gate_proj"])) * matmul(x, p["up_proj"]), p["down_proj"])
    return rms_norm(h, params["norm"], eps)


def forward(params: dict, cfg: DFlashConfig, target_features: jax.Array, ctx_positions: jax.Array,
            block_embeds: jax.Array, block_positions: jax.Array) -> jax.Array:
    """Everything at once (context K/V not cached): `draft_block` over `context_kv`."""
    k, v = context_kv(params, cfg, target_features, ctx_positions)
    return draft_block(params, cfg, k, v, target_features.shape[0], block_embeds, block_positions, ctx_positions)


def draft_logits(cfg: DFlashConfig, hidden: jax.Array, lm_head: jax.Array, *, tied: bool = False) -> jax.Array:
    """float32 logits `[..., V]` from the TARGET's head: lm_head `[H, V]`, or with `tied` its
    embedding `[V, H]`; then the drafter's output_multiplier and softcap when it declares them."""
    return scale_logits(cfg, matmul(hidden, lm_head, w_nk=tied))


def scale_logits(cfg: DFlashConfig, logits: jax.Array) -> jax.Array:
    """The target head's logits as the drafter uses them: float32, times its output_multiplier,
    softcapped where it declares final_logit_softcapping."""
    logits = logits.astype(jnp.float32) * cfg.output_multiplier
    if cfg.final_logit_softcapping:
        c = cfg.final_logit_softcapping
        logits = jnp.tanh(logits / c) * c
    return logits
