"""The vision tower's parameters: shapes, the checkpoint's names, the loader and the inverse.

Hub checkpoints (`Qwen3_5ForConditionalGeneration`) store the tower under `model.visual.`
(`visual.` alone, or no prefix, are read too). The pytree (matmul weights stored `[in, out]`):

  patch_embed [C*T*P*P, H] (the Conv3d kernel `[H, C, T, P, P]` flattened and transposed),
  patch_embed_bias [H], pos_embed [S*S, H],
  blocks: one dict a block: norm1_weight, norm1_bias, qkv [H, 3H] (q | k | v, head-major),
    qkv_bias, proj [H, H], proj_bias, norm2_weight, norm2_bias, fc1 [H, I], fc1_bias,
    fc2 [I, H], fc2_bias;
  merger: norm_weight [H], norm_bias, fc1 [4H, 4H], fc1_bias, fc2 [4H, out], fc2_bias.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ninfer_jax.errors import CheckpointError
from ninfer_jax.model.vision import VisionConfig

PREFIX = "model.visual."
_PREFIXES = (PREFIX, "visual.")


def vision_param_shapes(vcfg: VisionConfig) -> dict:
    """The shape of every parameter, as the pytree `vision_params` returns."""
    h, i, u = vcfg.hidden_size, vcfg.intermediate_size, vcfg.merge_unit * vcfg.hidden_size
    block = {"norm1_weight": (h,), "norm1_bias": (h,), "qkv": (h, 3 * h), "qkv_bias": (3 * h,),
             "proj": (h, h), "proj_bias": (h,), "norm2_weight": (h,), "norm2_bias": (h,),
             "fc1": (h, i), "fc1_bias": (i,), "fc2": (i, h), "fc2_bias": (h,)}
    return {"patch_embed": (vcfg.patch_dim, h), "patch_embed_bias": (h,),
            "pos_embed": (vcfg.num_position_embeddings, h),
            "blocks": [dict(block) for _ in range(vcfg.depth)],
            "merger": {"norm_weight": (h,), "norm_bias": (h,), "fc1": (u, u), "fc1_bias": (u,),
                       "fc2": (u, vcfg.out_hidden_size), "fc2_bias": (vcfg.out_hidden_size,)}}


_T = lambda w: np.swapaxes(w, -1, -2)  # noqa: E731 — torch Linear weights are [out, in]
_SAME = lambda w: w  # noqa: E731

# Leaf -> (name after the prefix, to our layout, back to the checkpoint's), for one block.
_BLOCK = {"norm1_weight": "norm1.weight", "norm1_bias": "norm1.bias", "norm2_weight": "norm2.weight",
          "norm2_bias": "norm2.bias", "qkv": "attn.qkv.weight", "qkv_bias": "attn.qkv.bias",
          "proj": "attn.proj.weight", "proj_bias": "attn.proj.bias", "fc1": "mlp.linear_fc1.weight",
          "fc1_bias": "mlp.linear_fc1.bias", "fc2": "mlp.linear_fc2.weight", "fc2_bias": "mlp.linear_fc2.bias"}
_MERGER = {"norm_weight": "norm.weight", "norm_bias": "norm.bias", "fc1": "linear_fc1.weight",
           "fc1_bias": "linear_fc1.bias", "fc2": "linear_fc2.weight", "fc2_bias": "linear_fc2.bias"}


def _mapping(vcfg: VisionConfig) -> list[tuple[tuple, str, Callable, Callable]]:
    """(path in the pytree, checkpoint name without prefix, to ours, back), in pytree order."""
    h = vcfg.hidden_size
    kernel = (vcfg.in_channels, vcfg.temporal_patch_size, vcfg.patch_size, vcfg.patch_size)
    out = [(("patch_embed",), "patch_embed.proj.weight", lambda w: w.reshape(w.shape[0], -1).T,
            lambda w: np.asarray(w).T.reshape(h, *kernel)),
           (("patch_embed_bias",), "patch_embed.proj.bias", _SAME, _SAME),
           (("pos_embed",), "pos_embed.weight", _SAME, _SAME)]
    linear = lambda leaf: leaf in ("qkv", "proj", "fc1", "fc2")  # noqa: E731
    for b in range(vcfg.depth):
        out += [(("blocks", b, leaf), f"blocks.{b}.{name}", *((_T, _T) if linear(leaf) else (_SAME, _SAME)))
                for leaf, name in _BLOCK.items()]
    out += [(("merger", leaf), f"merger.{name}", *((_T, _T) if linear(leaf) else (_SAME, _SAME)))
            for leaf, name in _MERGER.items()]
    return out


def _strip(name: str) -> str:
    for prefix in _PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def _empty(shapes: dict) -> dict:
    return {"blocks": [{} for _ in shapes["blocks"]], "merger": {}}


def _put(tree: dict, path: tuple, value) -> None:
    node = tree
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


def vision_params(raw: dict[str, np.ndarray], vcfg: VisionConfig, dtype) -> dict:
    """The tower's checkpoint tensors by name (`model.visual.*`, as a safetensors file holds
    them) → the pytree (`vision_param_shapes`) as numpy arrays of `dtype`. Missing, unexpected
    or misshapen tensors are reported together in one `CheckpointError`."""
    tensors = {_strip(k): v for k, v in raw.items()}
    shapes = vision_param_shapes(vcfg)
    params = _empty(shapes)
    missing, misshapen, used = [], [], set()
    for path, name, to_ours, _ in _mapping(vcfg):
        expected = _get(shapes, path)
        if name not in tensors:
            missing.append(PREFIX + name)
            continue
        used.add(name)
        value = np.asarray(tensors[name])
        try:
            value = to_ours(value)
        except ValueError as e:
            misshapen.append(f"{PREFIX}{name} {tuple(np.shape(tensors[name]))} ({e})")
            continue
        if tuple(value.shape) != tuple(expected):
            misshapen.append(f"{PREFIX}{name} {tuple(np.shape(tensors[name]))} → {tuple(value.shape)}, "
                             f"expected {tuple(expected)} in [in, out] layout")
            continue
        _put(params, path, np.ascontiguousarray(value.astype(dtype)))
    unexpected = sorted(PREFIX + n for n in set(tensors) - used)
    if missing or misshapen or unexpected:
        raise CheckpointError(f"the vision tensors do not match the vision config (depth {vcfg.depth}, "
                              f"hidden {vcfg.hidden_size})", missing=missing, unexpected=unexpected,
                              misshapen=misshapen)
    return params


def _get(tree, path: tuple):
    for key in path:
        tree = tree[key]
    return tree


def vision_hf_tensors(params: dict, vcfg: VisionConfig) -> dict[str, np.ndarray]:
    """The pytree → the checkpoint's tensors under `model.visual.` (contiguous numpy, dtype
    kept), which `vision_params` reads back to the same arrays."""
    return {PREFIX + name: np.ascontiguousarray(back(np.asarray(_get(params, path))))
            for path, name, _, back in _mapping(vcfg)}
