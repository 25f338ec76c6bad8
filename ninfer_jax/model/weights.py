"""Safetensors checkpoints → the parameter pytree.

Reads a single `model.safetensors` or a sharded set with `model.safetensors.index.json`; HF
key names with or without the `model.language_model.` prefix; Qwen3-Next's grouped
`in_proj_qkvz`/`in_proj_ba` (regrouped here into the plain Qwen3.5 layout) or the plain
Qwen3.5 projections; MoE experts as per-expert keys or as fused 3-D tensors; float32 and
bfloat16. `mtp.*` tensors are kept for the speculative backend; an incomplete MTP set disables
MTP with a warning; vision tensors are ignored with a warning. Missing, unexpected or
misshapen tensors are reported together in one `CheckpointError`.

The pytree (matmul weights stored `[in, out]`):
  embed [V, H], lm_head [H, V] (absent when tied), norm [H], layers: list of dicts.
"""
from __future__ import annotations

import json
import logging
import os
import re
from typing import Callable

import numpy as np
from safetensors import SafetensorError, safe_open

from ninfer_jax.errors import CheckpointError
from ninfer_jax.model.config import LINEAR, ModelConfig

log = logging.getLogger("ninfer_jax.model")

_VISION = re.compile(r"^(model\.)?(visual|vision_tower|model\.visual)\.")
_PREFIXES = ("model.language_model.", "language_model.model.", "language_model.")


def param_shapes(cfg: ModelConfig) -> dict:
    """The shape of every parameter, as the pytree `load_params` returns."""
    h, d = cfg.hidden_size, cfg.head_dim
    layers = []
    for i, kind in enumerate(cfg.layer_types):
        p = {"input_norm": (h,), "post_norm": (h,)}
        if kind == LINEAR:
            hv, dv = cfg.linear_num_value_heads, cfg.linear_value_head_dim
            p.update(in_proj_qkv=(h, cfg.conv_dim), in_proj_z=(h, hv * dv), in_proj_b=(h, hv),
                     in_proj_a=(h, hv), conv=(cfg.conv_dim, cfg.linear_conv_kernel_dim),
                     dt_bias=(hv,), A_log=(hv,), norm=(dv,), out_proj=(hv * dv, h))
        else:
            hq, hkv = cfg.num_attention_heads, cfg.num_key_value_heads
            p.update(q_proj=(h, 2 * hq * d), k_proj=(h, hkv * d), v_proj=(h, hkv * d),
                     o_proj=(hq * d, h), q_norm=(d,), k_norm=(d,))
        if cfg.mlp_types[i] == "moe":
            e, im = cfg.num_experts, cfg.moe_intermediate_size
            p.update(router=(h, e), experts_gate=(e, h, im), experts_up=(e, h, im), experts_down=(e, im, h))
            if cfg.shared_expert_intermediate_size:
                s = cfg.shared_expert_intermediate_size
                p.update(shared_gate_proj=(h, s), shared_up_proj=(h, s), shared_down_proj=(s, h),
                         shared_expert_gate=(h, 1))
        else:
            i_size = cfg.intermediate_size
            p.update(gate_proj=(h, i_size), up_proj=(h, i_size), down_proj=(i_size, h))
        layers.append(p)
    shapes = {"embed": (cfg.vocab_size, h), "norm": (h,), "layers": layers}
    if not cfg.tie_word_embeddings:
        shapes["lm_head"] = (h, cfg.vocab_size)
    return shapes


# ---- reading files ----------------------------------------------------------------------

class _Tensors:
    """Lazy access to every tensor of a checkpoint folder, by (prefix-stripped) HF name."""

    def __init__(self, folder: str):
        index = os.path.join(folder, "model.safetensors.index.json")
        single = os.path.join(folder, "model.safetensors")
        if os.path.exists(index):
            try:
                with open(index, encoding="utf-8") as f:
                    weight_map = json.load(f)["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise CheckpointError(f"{index}: not a valid safetensors index ({e})") from None
            files = sorted(set(weight_map.values()))
        elif os.path.exists(single):
            files = ["model.safetensors"]
        else:
            raise CheckpointError(f"{folder!r} holds no model.safetensors nor model.safetensors.index.json")
        self._where: dict[str, tuple[str, str]] = {}
        for name in files:
            path = os.path.join(folder, name)
            if not os.path.exists(path):
                raise CheckpointError(f"shard {name!r} named by the index is missing from {folder!r}")
            try:
                with safe_open(path, framework="numpy") as f:
                    keys = list(f.keys())
                # The header can be intact while the data is cut short: check the byte span.
                _check_length(path)
            except (SafetensorError, OSError, ValueError) as e:
                raise CheckpointError(f"{path}: unreadable or truncated safetensors file ({e})") from None
            for key in keys:
                self._where[_strip(key)] = (path, key)

    def names(self) -> set[str]:
        return set(self._where)

    def shape(self, name: str) -> tuple[int, ...]:
        path, key = self._where[name]
        with safe_open(path, framework="numpy") as f:
            return tuple(f.get_slice(key).get_shape())

    def get(self, name: str) -> np.ndarray:
        path, key = self._where[name]
        try:
            with safe_open(path, framework="numpy") as f:
                return f.get_tensor(key)
        except (SafetensorError, OSError, ValueError) as e:
            raise CheckpointError(f"{path}: cannot read tensor {key!r} ({e})") from None


def _check_length(path: str) -> None:
    with open(path, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(header_len))
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    actual = os.path.getsize(path) - 8 - header_len
    if actual < end:
        raise ValueError(f"data section holds {actual} bytes, the header needs {end}")


def _strip(key: str) -> str:
    for prefix in _PREFIXES:
        if key.startswith(prefix):
            return "model." + key[len(prefix):]
    return key


# ---- mapping HF names to the pytree -------------------------------------------------------

def _sources(cfg: ModelConfig, names: set[str]) -> dict:
    """For each pytree leaf: (HF names it reads, transform from those arrays to the leaf)."""
    t = lambda w: w.T  # noqa: E731 — HF Linear weights are [out, in]
    out: dict = {"embed": (["model.embed_tokens.weight"], lambda w: w),
                 "norm": (["model.norm.weight"], lambda w: w), "layers": []}
    if not cfg.tie_word_embeddings:
        out["lm_head"] = (["lm_head.weight"], t)
    for i, kind in enumerate(cfg.layer_types):
        pre = f"model.layers.{i}."
        p = {"input_norm": ([pre + "input_layernorm.weight"], lambda w: w),
             "post_norm": ([pre + "post_attention_layernorm.weight"], lambda w: w)}
        if kind == LINEAR:
            la = pre + "linear_attn."
            if la + "in_proj_qkvz.weight" in names or la + "in_proj_ba.weight" in names:
                qkv, z, b, a = _regroup_next(cfg)
                p.update(in_proj_qkv=([la + "in_proj_qkvz.weight"], qkv),
                         in_proj_z=([la + "in_proj_qkvz.weight"], z),
                         in_proj_b=([la + "in_proj_ba.weight"], b),
                         in_proj_a=([la + "in_proj_ba.weight"], a))
            else:
                p.update({f"in_proj_{n}": ([la + f"in_proj_{n}.weight"], t) for n in ("qkv", "z", "b", "a")})
            p.update(conv=([la + "conv1d.weight"], lambda w: w.reshape(w.shape[0], w.shape[-1])),
                     dt_bias=([la + "dt_bias"], lambda w: w), A_log=([la + "A_log"], lambda w: w),
                     norm=([la + "norm.weight"], lambda w: w), out_proj=([la + "out_proj.weight"], t))
        else:
            sa = pre + "self_attn."
            p.update({n: ([sa + n + ".weight"], t) for n in ("q_proj", "k_proj", "v_proj", "o_proj")})
            p.update(q_norm=([sa + "q_norm.weight"], lambda w: w), k_norm=([sa + "k_norm.weight"], lambda w: w))
        mlp = pre + "mlp."
        if cfg.mlp_types[i] == "moe":
            p["router"] = ([mlp + "gate.weight"], t)
            ex = mlp + "experts."
            if ex + "gate_up_proj" in names or ex + "down_proj" in names:
                im = cfg.moe_intermediate_size
                # Fused: gate_up [E, 2I, H] (gate first), down [E, H, I].
                p.update(experts_gate=([ex + "gate_up_proj"], lambda w, im=im: np.swapaxes(w[:, :im], 1, 2)),
                         experts_up=([ex + "gate_up_proj"], lambda w, im=im: np.swapaxes(w[:, im:], 1, 2)),
                         experts_down=([ex + "down_proj"], lambda w: np.swapaxes(w, 1, 2)))
            else:
                stack = lambda *ws: np.stack([w.T for w in ws])  # noqa: E731
                for leaf, proj in (("experts_gate", "gate_proj"), ("experts_up", "up_proj"),
                                   ("experts_down", "down_proj")):
                    p[leaf] = ([f"{ex}{e}.{proj}.weight" for e in range(cfg.num_experts)], stack)
            if cfg.shared_expert_intermediate_size:
                se = mlp + "shared_expert."
                p.update(shared_gate_proj=([se + "gate_proj.weight"], t), shared_up_proj=([se + "up_proj.weight"], t),
                         shared_down_proj=([se + "down_proj.weight"], t),
                         shared_expert_gate=([mlp + "shared_expert_gate.weight"], t))
        else:
            p.update({n: ([mlp + n + ".weight"], t) for n in ("gate_proj", "up_proj", "down_proj")})
        out["layers"].append(p)
    return out


def _regroup_next(cfg: ModelConfig) -> tuple[Callable, ...]:
    """Qwen3-Next groups q,k,v,z (and b,a) per key head; split them into the plain layout."""
    hk, dk, dv = cfg.linear_num_key_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
    r = cfg.linear_num_value_heads // hk

    def qkvz_parts(w):  # w [2Kd+2Vd, H] → per key head [Hk, 2dk + 2 r dv, H]
        g = w.reshape(hk, 2 * dk + 2 * r * dv, w.shape[-1])
        q, k = g[:, :dk], g[:, dk:2 * dk]
        v, z = g[:, 2 * dk:2 * dk + r * dv], g[:, 2 * dk + r * dv:]
        flat = lambda x: x.reshape(-1, w.shape[-1])  # noqa: E731
        return flat(q), flat(k), flat(v), flat(z)

    def qkv(w):
        q, k, v, _ = qkvz_parts(w)
        return np.concatenate([q, k, v], axis=0).T

    def z(w):
        return qkvz_parts(w)[3].T

    def ba(which):
        def f(w):  # [2 Hv, H] → per key head [Hk, 2r, H]
            g = w.reshape(hk, 2 * r, w.shape[-1])
            return (g[:, :r] if which == "b" else g[:, r:]).reshape(-1, w.shape[-1]).T
        return f

    return qkv, z, ba("b"), ba("a")


def load_params(folder: str, cfg: ModelConfig, dtype) -> tuple[dict, dict | None]:
    """Read, check and convert every tensor. Returns (params as numpy arrays of `dtype`, mtp)."""
    tensors = _Tensors(folder)
    names = tensors.names()
    sources = _sources(cfg, names)
    shapes = param_shapes(cfg)

    missing: list[str] = []
    misshapen: list[str] = []
    used: set[str] = set()

    def build(src, shape):
        keys, fn = src
        absent = [k for k in keys if k not in names]
        if absent:
            missing.extend(absent)
            return None
        used.update(keys)
        try:
            value = fn(*[tensors.get(k) for k in keys])
        except ValueError as e:  # a reshape of a wrongly sized grouped tensor
            misshapen.append(f"{keys[0]} {tensors.shape(keys[0])} ({e})")
            return None
        if tuple(value.shape) != tuple(shape):
            got = ", ".join(f"{k} {tensors.shape(k)}" for k in keys[:2])
            misshapen.append(f"{got} → {tuple(value.shape)}, expected {tuple(shape)} in [in, out] layout")
            return None
        return np.asarray(value).astype(dtype)

    params = {k: build(sources[k], shapes[k]) for k in shapes if k != "layers"}
    params["layers"] = [{k: build(src[k], shp[k]) for k in shp}
                        for src, shp in zip(sources["layers"], shapes["layers"])]
    if cfg.tie_word_embeddings and "lm_head.weight" in names:
        used.add("lm_head.weight")  # some tied checkpoints still store the copy

    vision = sorted(n for n in names - used if _VISION.match(n))
    if vision:
        log.warning("ignoring %d vision tensors (%s, ...): vision input is not supported yet",
                    len(vision), vision[0])
    mtp_names = sorted(n for n in names - used if n.startswith("mtp."))
    unexpected = sorted(names - used - set(vision) - set(mtp_names))
    if missing or unexpected or misshapen:
        raise CheckpointError(f"checkpoint {folder!r} does not match its config ({cfg.model_type})",
                              missing=missing, unexpected=unexpected, misshapen=misshapen)
    return params, _load_mtp(cfg, tensors, mtp_names, dtype)


_MTP_REQUIRED = ("mtp.fc.weight", "mtp.norm.weight", "mtp.pre_fc_norm_embedding.weight",
                 "mtp.pre_fc_norm_hidden.weight")
_MTP_LAYER_REQUIRED = ("input_layernorm.weight", "post_attention_layernorm.weight",
                       "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                       "self_attn.o_proj.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight")


def _load_mtp(cfg: ModelConfig, tensors: _Tensors, mtp_names: list[str], dtype) -> dict | None:
    """Keep the MTP tensors by name when the set is complete; otherwise warn and disable MTP."""
    if not mtp_names and not cfg.mtp_num_hidden_layers:
        return None
    if not cfg.mtp_num_hidden_layers:
        log.warning("ignoring %d mtp.* tensors: the config declares no MTP layers", len(mtp_names))
        return None
    present = set(mtp_names)
    required = list(_MTP_REQUIRED)
    for i in range(cfg.mtp_num_hidden_layers):
        required += [f"mtp.layers.{i}.{n}" for n in _MTP_LAYER_REQUIRED]
    lacking = [n for n in required if n not in present]
    lacking += [f"mtp.layers.{i}.mlp.*" for i in range(cfg.mtp_num_hidden_layers)
                if not any(n.startswith(f"mtp.layers.{i}.mlp.") for n in present)]
    if lacking:
        log.warning("MTP disabled: the checkpoint's MTP set is incomplete (missing %s); "
                    "the main model loads normally", ", ".join(lacking[:6]) + (" ..." if len(lacking) > 6 else ""))
        return None
    return {n: np.asarray(tensors.get(n)).astype(dtype) for n in mtp_names}
