"""Safetensors checkpoints → the parameter pytree.

Reads a single `model.safetensors` or a sharded set with `model.safetensors.index.json`; HF
key names with or without the `model.language_model.` prefix; Qwen3-Next's grouped
`in_proj_qkvz`/`in_proj_ba` (regrouped here into the plain Qwen3.5 layout) or the plain
Qwen3.5 projections; MoE experts as per-expert keys or as fused 3-D tensors; float32 and
bfloat16. `mtp.*` tensors are kept for the speculative backend; an incomplete MTP set disables
MTP with a warning; vision tensors are skipped (loaded by `multimodal.load_vision` for a
multimodal config, else ignored with a warning). Missing, unexpected or
misshapen tensors are reported together in one `CheckpointError`.

Tensors are read in file order (shard by shard, by offset), and a `progress` callback hears
of each shard as it is finished (`ShardProgress`: its size, the bytes so far, an ETA).

The pytree (matmul weights stored `[in, out]`):
  embed [V, H], lm_head [H, V] (absent when tied), norm [H], layers: list of dicts.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import time
from typing import Callable

import numpy as np
from safetensors import SafetensorError, safe_open

from ninfer_jax.errors import CheckpointError
from ninfer_jax.model.config import FULL, LINEAR, ModelConfig

log = logging.getLogger("ninfer_jax.model")

# A vision tower tensor (prefix-stripped name): read by multimodal.load_vision, never here.
VISION_NAME = re.compile(r"^(model\.)?(visual|vision_tower|model\.visual)\.")
_PREFIXES = ("model.language_model.", "language_model.model.", "language_model.")


def is_shape(x) -> bool:
    """A leaf of a shapes tree (`param_shapes`, `dflash.param_shapes`): a tuple of ints."""
    return isinstance(x, tuple) and all(isinstance(d, int) for d in x)


def param_shapes(cfg: ModelConfig) -> dict:
    """The shape of every parameter, as the pytree `load_params` returns."""
    h = cfg.hidden_size
    layers = [layer_shapes(cfg, kind, cfg.mlp_types[i]) for i, kind in enumerate(cfg.layer_types)]
    shapes = {"embed": (cfg.vocab_size, h), "norm": (h,), "layers": layers}
    if not cfg.tie_word_embeddings:
        shapes["lm_head"] = (h, cfg.vocab_size)
    return shapes


def layer_shapes(cfg: ModelConfig, kind: str, mlp_kind: str) -> dict:
    """One decoder layer's parameter shapes: token mixer `kind` (LINEAR or FULL), feed-forward
    `mlp_kind` ("dense" or "moe"). Shared by the main layers and the MTP layers."""
    h, d = cfg.hidden_size, cfg.head_dim
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
    if mlp_kind == "moe":
        e, im = cfg.num_experts, cfg.moe_intermediate_size
        p.update(router=(h, e), experts_gate=(e, h, im), experts_up=(e, h, im), experts_down=(e, im, h))
        if cfg.shared_expert_intermediate_size:
            s = cfg.shared_expert_intermediate_size
            p.update(shared_gate_proj=(h, s), shared_up_proj=(h, s), shared_down_proj=(s, h),
                     shared_expert_gate=(h, 1))
    else:
        i_size = cfg.intermediate_size
        p.update(gate_proj=(h, i_size), up_proj=(h, i_size), down_proj=(i_size, h))
    return p


def mtp_mlp_kind(cfg: ModelConfig) -> str:
    """The MTP layers' feed-forward: MoE when the model has experts (Qwen3-Next), else dense."""
    return "moe" if cfg.num_experts else "dense"


def mtp_shapes(cfg: ModelConfig) -> dict:
    """The shapes of the internal MTP pytree (matmul weights `[in, out]`): `fc` maps
    concat([pre_fc_norm_embedding(embed), pre_fc_norm_hidden(hidden)]) `[2H]` to `[H]`; each
    of `layers` is a full-attention layer in the `layer_shapes` layout."""
    h = cfg.hidden_size
    return {"pre_fc_norm_embedding": (h,), "pre_fc_norm_hidden": (h,), "fc": (2 * h, h),
            "layers": [layer_shapes(cfg, FULL, mtp_mlp_kind(cfg)) for _ in range(cfg.mtp_num_hidden_layers)],
            "norm": (h,)}


# ---- reading files ----------------------------------------------------------------------

# Safetensors header dtypes of floating tensors, by numpy-style name.
_HEADER_DTYPES = {"F64": "float64", "F32": "float32", "BF16": "bfloat16", "F16": "float16",
                  "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}


@dataclasses.dataclass(frozen=True)
class _Entry:
    path: str
    key: str  # the name in the file (with its prefix)
    offset: int  # start of its bytes in the file's data section
    nbytes: int
    dtype: str  # the header's dtype code (F32, BF16, ...)


class Tensors:
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
        self.files: list[str] = []  # shard paths, in name order
        self._where: dict[str, _Entry] = {}
        self._on_read: Callable[[str], None] | None = None
        for name in files:
            path = os.path.join(folder, name)
            if not os.path.exists(path):
                raise CheckpointError(f"shard {name!r} named by the index is missing from {folder!r}")
            try:
                with safe_open(path, framework="numpy"):
                    pass  # the library's own checks of the header
                # The header can be intact while the data is cut short: check the byte span.
                header = _read_header(path)
            except (SafetensorError, OSError, ValueError) as e:
                raise CheckpointError(f"{path}: unreadable or truncated safetensors file ({e})") from None
            self.files.append(path)
            for key, info in header.items():
                start, end = info["data_offsets"]
                self._where[_strip(key)] = _Entry(path, key, start, end - start, info["dtype"])

    def names(self) -> set[str]:
        return set(self._where)

    def entry(self, name: str) -> _Entry:
        return self._where[name]

    def position(self, name: str) -> tuple[int, int]:
        """Where the tensor's bytes lie: (shard number, offset), for reading in file order."""
        e = self._where[name]
        return self.files.index(e.path), e.offset

    def shape(self, name: str) -> tuple[int, ...]:
        e = self._where[name]
        with safe_open(e.path, framework="numpy") as f:
            return tuple(f.get_slice(e.key).get_shape())

    def get(self, name: str) -> np.ndarray:
        e = self._where[name]
        try:
            with safe_open(e.path, framework="numpy") as f:
                value = f.get_tensor(e.key)
        except (SafetensorError, OSError, ValueError) as err:
            raise CheckpointError(f"{e.path}: cannot read tensor {e.key!r} ({err})") from None
        if self._on_read is not None:
            self._on_read(name)
        return value

    def stored_dtype(self) -> str | None:
        """The floating dtype holding most of the checkpoint's bytes ("bfloat16", ...), or None."""
        by_dtype: dict[str, int] = {}
        for e in self._where.values():
            if e.dtype in _HEADER_DTYPES:
                by_dtype[e.dtype] = by_dtype.get(e.dtype, 0) + e.nbytes
        if not by_dtype:
            return None
        return _HEADER_DTYPES[max(sorted(by_dtype), key=by_dtype.get)]


def _read_header(path: str) -> dict:
    """The tensors of a safetensors file's header (no `__metadata__`), checked against the
    file's length."""
    with open(path, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(header_len))
    header.pop("__metadata__", None)
    end = max((v["data_offsets"][1] for v in header.values()), default=0)
    actual = os.path.getsize(path) - 8 - header_len
    if actual < end:
        raise ValueError(f"data section holds {actual} bytes, the header needs {end}")
    return header


def stored_dtype(folder: str) -> str | None:
    """The dtype a checkpoint folder's safetensors hold most of their floating bytes in."""
    return Tensors(folder).stored_dtype()


# ---- loading progress ------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ShardProgress:
    """One shard finished: `done` of `count` shards, `done_bytes` of `total_bytes` (file sizes)."""

    done: int
    count: int
    name: str  # the shard's file name
    shard_bytes: int
    done_bytes: int
    total_bytes: int
    elapsed_s: float

    @property
    def eta_s(self) -> float:
        """Seconds left at the rate so far (0 when finished)."""
        left = self.total_bytes - self.done_bytes
        return self.elapsed_s * left / self.done_bytes if self.done_bytes and left > 0 else 0.0

    def line(self) -> str:
        """`[ninfer] weights 2/5 model-00002-of-00005.safetensors (4.9 GB) 3.9/9.8 GB, ETA 12 s`"""
        scale, unit = next((s, u) for s, u in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB"), (1, "B"))
                           if self.total_bytes >= s or s == 1)
        size = lambda n: f"{n / scale:.1f}" if scale > 1 else str(n)  # noqa: E731
        tail = (f"ETA {self.eta_s:.0f} s" if self.done < self.count
                else f"done in {self.elapsed_s:.1f} s")
        return (f"[ninfer] weights {self.done}/{self.count} {self.name} ({size(self.shard_bytes)} {unit}) "
                f"{size(self.done_bytes)}/{size(self.total_bytes)} {unit}, {tail}")


class _ShardTracker:
    """Reports each shard once every tensor to be read from it has been read."""

    def __init__(self, tensors: Tensors, reads: set[str], callback: Callable[[ShardProgress], None]):
        self._callback = callback
        self._sizes = {p: os.path.getsize(p) for p in tensors.files}
        self._total = sum(self._sizes.values())
        self._pending = {p: set() for p in tensors.files}
        for name in reads:
            self._pending[tensors.entry(name).path].add(name)
        self._shard_of = {name: tensors.entry(name).path for name in reads}
        self._reported: list[str] = []
        self._done_bytes = 0
        self._start = time.perf_counter()

    def read(self, name: str) -> None:
        path = self._shard_of.get(name)
        if path is None:
            return
        pending = self._pending[path]
        pending.discard(name)
        if not pending and path not in self._reported:
            self._report(path)

    def finish(self) -> None:
        """Shards nothing was read from (only ignored tensors) count as finished at the end."""
        for path in self._sizes:
            if path not in self._reported:
                self._report(path)

    def _report(self, path: str) -> None:
        self._reported.append(path)
        self._done_bytes += self._sizes[path]
        self._callback(ShardProgress(len(self._reported), len(self._sizes), os.path.basename(path),
                                     self._sizes[path], self._done_bytes, self._total,
                                     time.perf_counter() - self._start))


def _strip(key: str) -> str:
    for prefix in _PREFIXES:
        if key.startswith(prefix):
            return "model." + key[len(prefix):]
    return key


# ---- mapping HF names to the pytree -------------------------------------------------------

_T = lambda w: w.T  # noqa: E731 — HF Linear weights are [out, in]
_SAME = lambda w: w  # noqa: E731


def _sources(cfg: ModelConfig, names: set[str]) -> dict:
    """For each pytree leaf: (HF names it reads, transform from those arrays to the leaf)."""
    out: dict = {"embed": (["model.embed_tokens.weight"], _SAME),
                 "norm": (["model.norm.weight"], _SAME), "layers": []}
    if not cfg.tie_word_embeddings:
        out["lm_head"] = (["lm_head.weight"], _T)
    for i, kind in enumerate(cfg.layer_types):
        out["layers"].append(_layer_sources(cfg, f"model.layers.{i}.", kind, cfg.mlp_types[i], names))
    return out


def _layer_sources(cfg: ModelConfig, pre: str, kind: str, mlp_kind: str, names: set[str]) -> dict:
    """One layer's leaves from the HF names under `pre` (`model.layers.3.`, `mtp.layers.0.`)."""
    t = _T
    p = {"input_norm": ([pre + "input_layernorm.weight"], _SAME),
         "post_norm": ([pre + "post_attention_layernorm.weight"], _SAME)}
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
                 dt_bias=([la + "dt_bias"], _SAME), A_log=([la + "A_log"], _SAME),
                 norm=([la + "norm.weight"], _SAME), out_proj=([la + "out_proj.weight"], t))
    else:
        sa = pre + "self_attn."
        p.update({n: ([sa + n + ".weight"], t) for n in ("q_proj", "k_proj", "v_proj", "o_proj")})
        p.update(q_norm=([sa + "q_norm.weight"], _SAME), k_norm=([sa + "k_norm.weight"], _SAME))
    mlp = pre + "mlp."
    if mlp_kind == "moe":
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
    return p


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


def load_params(folder: str, cfg: ModelConfig, dtype, progress: Callable[[ShardProgress], None] | None = None,
                *, vision: bool = False) -> tuple[dict, dict | None]:
    """Read, check and convert every tensor. Returns (params as numpy arrays of `dtype`, mtp).
    `progress` is called once per shard, as each one is finished. Vision tensors are skipped,
    with a warning unless `vision` (the caller loads them: `multimodal.load_vision`)."""
    tensors = Tensors(folder)
    names = tensors.names()
    sources = _sources(cfg, names)
    shapes = param_shapes(cfg)

    # Every leaf with where it goes; read in file order, errors listed in pytree order.
    leaves = [(("top", k), sources[k], shapes[k]) for k in shapes if k != "layers"]
    leaves += [(("layer", i, k), src[k], shp[k])
               for i, (src, shp) in enumerate(zip(sources["layers"], shapes["layers"])) for k in shp]
    complete = [keys for _, (keys, _), _ in leaves if all(k in names for k in keys)]
    reads: set[str] = {k for keys in complete for k in keys}
    used = set(reads)
    if cfg.tie_word_embeddings and "lm_head.weight" in names:
        used.add("lm_head.weight")  # some tied checkpoints still store the copy
    vision_names = sorted(n for n in names - used if VISION_NAME.match(n))
    mtp_names = sorted(n for n in names - used if n.startswith("mtp."))
    unexpected = sorted(names - used - set(vision_names) - set(mtp_names))
    mtp_load, mtp_warning = _mtp_plan(cfg, mtp_names)
    tracker = None
    if progress is not None:
        tracker = _ShardTracker(tensors, reads | set(mtp_load or ()), progress)
        tensors._on_read = tracker.read

    missing: list[tuple[int, str]] = []
    misshapen: list[tuple[int, str]] = []

    def build(order, src, shape):
        keys, fn = src
        absent = [k for k in keys if k not in names]
        if absent:
            missing.extend((order, k) for k in absent)
            return None
        try:
            value = fn(*[tensors.get(k) for k in keys])
        except ValueError as e:  # a reshape of a wrongly sized grouped tensor
            misshapen.append((order, f"{keys[0]} {tensors.shape(keys[0])} ({e})"))
            return None
        if tuple(value.shape) != tuple(shape):
            got = ", ".join(f"{k} {tensors.shape(k)}" for k in keys[:2])
            misshapen.append((order, f"{got} → {tuple(value.shape)}, expected {tuple(shape)} in [in, out] layout"))
            return None
        return np.asarray(value).astype(dtype)

    def position(order: int) -> tuple[int, int]:
        keys = [k for k in leaves[order][1][0] if k in names]
        return min(tensors.position(k) for k in keys) if keys else (len(tensors.files), 0)

    params: dict = {"layers": [{} for _ in shapes["layers"]]}
    for order in sorted(range(len(leaves)), key=position):
        where, src, shape = leaves[order]
        value = build(order, src, shape)
        if where[0] == "top":
            params[where[1]] = value
        else:
            params["layers"][where[1]][where[2]] = value
    params["layers"] = [{k: layer[k] for k in shp} for layer, shp in zip(params["layers"], shapes["layers"])]
    params = {k: params[k] for k in shapes}

    if vision_names and not vision:
        log.warning("ignoring %d vision tensors (%s, ...): the config declares no vision tower",
                    len(vision_names), vision_names[0])
    if missing or unexpected or misshapen:
        raise CheckpointError(f"checkpoint {folder!r} does not match its config ({cfg.model_type})",
                              missing=[m for _, m in sorted(missing, key=lambda x: x[0])], unexpected=unexpected,
                              misshapen=[m for _, m in sorted(misshapen, key=lambda x: x[0])])
    if mtp_warning:
        log.warning("%s", mtp_warning)
    mtp = None if mtp_load is None else {n: np.asarray(tensors.get(n)).astype(dtype) for n in mtp_load}
    if tracker is not None:
        tracker.finish()
    return params, mtp


_MTP_REQUIRED = ("mtp.fc.weight", "mtp.norm.weight", "mtp.pre_fc_norm_embedding.weight",
                 "mtp.pre_fc_norm_hidden.weight")
_MTP_LAYER_REQUIRED = ("input_layernorm.weight", "post_attention_layernorm.weight",
                       "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                       "self_attn.o_proj.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight")


def _mtp_plan(cfg: ModelConfig, mtp_names: list[str]) -> tuple[list[str] | None, str | None]:
    """The MTP tensors to keep by name (None: no MTP) and the warning to give, if any: the set
    is kept only when complete; otherwise MTP is disabled and the main model loads normally."""
    if not mtp_names and not cfg.mtp_num_hidden_layers:
        return None, None
    if not cfg.mtp_num_hidden_layers:
        return None, f"ignoring {len(mtp_names)} mtp.* tensors: the config declares no MTP layers"
    present = set(mtp_names)
    required = list(_MTP_REQUIRED)
    for i in range(cfg.mtp_num_hidden_layers):
        required += [f"mtp.layers.{i}.{n}" for n in _MTP_LAYER_REQUIRED]
    lacking = [n for n in required if n not in present]
    lacking += [f"mtp.layers.{i}.mlp.*" for i in range(cfg.mtp_num_hidden_layers)
                if not any(n.startswith(f"mtp.layers.{i}.mlp.") for n in present)]
    if lacking:
        return None, ("MTP disabled: the checkpoint's MTP set is incomplete (missing "
                      + ", ".join(lacking[:6]) + (" ..." if len(lacking) > 6 else "")
                      + "); the main model loads normally")
    return mtp_names, None


# ---- the MTP head and export ------------------------------------------------------------

def mtp_params(raw: dict[str, np.ndarray], cfg: ModelConfig) -> dict:
    """The MTP tensors kept by HF name (`load_params`' second result) → the internal MTP
    pytree (`mtp_shapes`): `mtp.fc.weight` `[H, 2H]` transposed to `[2H, H]`, each
    `mtp.layers.{i}.*` through the main loader's per-layer mapping (a full-attention layer,
    dense or MoE, per-expert or fused experts), the three norms as stored."""
    raw = {_strip(k): v for k, v in raw.items()}
    names = set(raw)
    shapes = mtp_shapes(cfg)
    sources = {"pre_fc_norm_embedding": (["mtp.pre_fc_norm_embedding.weight"], _SAME),
               "pre_fc_norm_hidden": (["mtp.pre_fc_norm_hidden.weight"], _SAME),
               "fc": (["mtp.fc.weight"], _T), "norm": (["mtp.norm.weight"], _SAME),
               "layers": [_layer_sources(cfg, f"mtp.layers.{i}.", FULL, mtp_mlp_kind(cfg), names)
                          for i in range(cfg.mtp_num_hidden_layers)]}
    missing: list[str] = []
    misshapen: list[str] = []

    def build(src, shape):
        keys, fn = src
        absent = [k for k in keys if k not in names]
        if absent:
            missing.extend(absent)
            return None
        try:
            value = np.asarray(fn(*[raw[k] for k in keys]))
        except ValueError as e:
            misshapen.append(f"{keys[0]} {tuple(raw[keys[0]].shape)} ({e})")
            return None
        if tuple(value.shape) != tuple(shape):
            misshapen.append(f"{keys[0]} {tuple(raw[keys[0]].shape)} → {tuple(value.shape)}, "
                             f"expected {tuple(shape)} in [in, out] layout")
        return value

    out = {k: build(sources[k], shapes[k]) for k in shapes if k != "layers"}
    out["layers"] = [{k: build(src[k], shp[k]) for k in shp} for src, shp in zip(sources["layers"], shapes["layers"])]
    out = {k: out[k] for k in shapes}
    if missing or misshapen:
        raise CheckpointError(f"the MTP tensors do not match the config ({cfg.model_type}, "
                              f"{cfg.mtp_num_hidden_layers} MTP layers)", missing=missing, unexpected=[],
                              misshapen=misshapen)
    return out


def _layer_tensors(p: dict, pre: str, kind: str, mlp_kind: str) -> dict[str, np.ndarray]:
    """One layer's pytree → HF tensors under `pre`, in the plain Qwen3.5 layout (the inverse
    of `_layer_sources` for plain projections and per-expert MoE keys)."""
    t = lambda w: np.ascontiguousarray(np.asarray(w).T)  # noqa: E731
    same = lambda w: np.ascontiguousarray(np.asarray(w))  # noqa: E731
    out = {pre + "input_layernorm.weight": same(p["input_norm"]),
           pre + "post_attention_layernorm.weight": same(p["post_norm"])}
    if kind == LINEAR:
        la = pre + "linear_attn."
        out.update({la + f"in_proj_{n}.weight": t(p[f"in_proj_{n}"]) for n in ("qkv", "z", "b", "a")})
        conv = np.asarray(p["conv"])
        out.update({la + "conv1d.weight": same(conv.reshape(conv.shape[0], 1, conv.shape[1])),
                    la + "dt_bias": same(p["dt_bias"]), la + "A_log": same(p["A_log"]),
                    la + "norm.weight": same(p["norm"]), la + "out_proj.weight": t(p["out_proj"])})
    else:
        sa = pre + "self_attn."
        out.update({sa + n + ".weight": t(p[n]) for n in ("q_proj", "k_proj", "v_proj", "o_proj")})
        out.update({sa + "q_norm.weight": same(p["q_norm"]), sa + "k_norm.weight": same(p["k_norm"])})
    mlp = pre + "mlp."
    if mlp_kind == "moe":
        out[mlp + "gate.weight"] = t(p["router"])
        for leaf, proj in (("experts_gate", "gate_proj"), ("experts_up", "up_proj"), ("experts_down", "down_proj")):
            for e, w in enumerate(np.asarray(p[leaf])):
                out[f"{mlp}experts.{e}.{proj}.weight"] = t(w)
        if "shared_gate_proj" in p:
            se = mlp + "shared_expert."
            out.update({se + "gate_proj.weight": t(p["shared_gate_proj"]),
                        se + "up_proj.weight": t(p["shared_up_proj"]),
                        se + "down_proj.weight": t(p["shared_down_proj"]),
                        mlp + "shared_expert_gate.weight": t(p["shared_expert_gate"])})
    else:
        out.update({mlp + n + ".weight": t(p[n]) for n in ("gate_proj", "up_proj", "down_proj")})
    return out


def hf_tensors(params: dict, mtp: dict | None, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """The pytrees → a complete HF tensor dict (`model.` prefix, plain Qwen3.5 projections,
    per-expert MoE keys, `mtp.*` when `mtp` is given), which `load_params` reads back to the
    same arrays. Arrays keep their dtype (numpy, contiguous)."""
    same = lambda w: np.ascontiguousarray(np.asarray(w))  # noqa: E731
    out = {"model.embed_tokens.weight": same(params["embed"]), "model.norm.weight": same(params["norm"])}
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = same(np.asarray(params["lm_head"]).T)
    for i, p in enumerate(params["layers"]):
        out.update(_layer_tensors(p, f"model.layers.{i}.", cfg.layer_types[i], cfg.mlp_types[i]))
    if mtp is not None:
        out.update({"mtp.fc.weight": same(np.asarray(mtp["fc"]).T), "mtp.norm.weight": same(mtp["norm"]),
                    "mtp.pre_fc_norm_embedding.weight": same(mtp["pre_fc_norm_embedding"]),
                    "mtp.pre_fc_norm_hidden.weight": same(mtp["pre_fc_norm_hidden"])})
        for i, p in enumerate(mtp["layers"]):
            out.update(_layer_tensors(p, f"mtp.layers.{i}.", FULL, mtp_mlp_kind(cfg)))
    return out
