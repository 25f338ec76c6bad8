"""`load_model` and the whole-sequence reference forward pass.

`Model.forward(token_ids)` runs one uncached pass with dense causal attention and the
token-by-token delta rule (`modules.HybridLM.__call__`): the reference that every cached path
(paged steps, reuse, replay) is compared with. It shares nothing with the paged steps but the
modules' per-layer projections, outputs and feed-forward. With images or videos (a checkpoint
with a vision tower, `Model.vision`) it is `multimodal.forward_media`.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import os
from typing import TYPE_CHECKING, Callable

import jax
import jax.numpy as jnp
import numpy as np

from ninfer_jax.errors import ConfigError, RequestError
from ninfer_jax.model import builtin
from ninfer_jax.model.config import ModelConfig, declared_dtype, parse_config, read_config_json
from ninfer_jax.model.multimodal import Vision, forward_media, has_placeholders, is_multimodal, load_vision
from ninfer_jax.model.weights import ShardProgress, load_params, stored_dtype

if TYPE_CHECKING:  # flax is imported only when a model is first used
    from ninfer_jax.model.modules import Merger

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
AUTO = "auto"  # the checkpoint's own dtype (resolve_dtype)
# A checkpoint's dtype → the engine dtype "auto" picks. float16 becomes bfloat16: the same
# bytes, float32's range (float16 activations overflow), 3 fewer mantissa bits.
_ENGINE_DTYPE = {"float32": "float32", "float64": "float32", "bfloat16": "bfloat16", "float16": "bfloat16"}

log = logging.getLogger("ninfer_jax.model")


@dataclasses.dataclass
class Model:
    """A loaded model: config, parameters (a pytree of device arrays) and MTP tensors.

    `params` stays the loader's dict (every caller reads it); the nnx module over the same
    arrays (`functional`: split once, no copies) is what the forward pass and the steps run.
    """

    config: ModelConfig
    params: dict
    dtype: jnp.dtype
    name: str
    mtp: dict | None = None  # kept by name for the speculative backend
    vision: Vision | None = dataclasses.field(default=None, repr=False)  # the tower; None: text only
    _split: tuple | None = dataclasses.field(default=None, init=False, repr=False, compare=False)

    @property
    def dtype_name(self) -> str:
        """"float32" or "bfloat16"."""
        return jnp.dtype(self.dtype).name

    @property
    def functional(self) -> tuple[Merger, tuple]:
        """(merger, leaves) of `HybridLM(config, params)`: `merger(leaves)` inside a jitted
        function is the module. Rebuilt only if `params` is replaced."""
        if self._split is None or self._split[0] is not self.params:
            from ninfer_jax.model.modules import HybridLM, split  # flax loads with the first model

            self._split = (self.params, *split(HybridLM(self.config, self.params)))
        return self._split[1], self._split[2]

    def forward(self, token_ids, images=(), videos=()) -> jax.Array:
        """Logits `[T, vocab]` (float32) of one whole uncached pass over `token_ids` `[T]`.

        `images` / `videos`: (pixel_values, grid_thw) pairs (or `PreparedImage`s) in order of
        appearance; `token_ids` then hold their placeholder runs, as the reference processor
        expands them (`multimodal.forward_media`). On a model with a tower, placeholders with no
        media are a RequestError; without media or placeholders this is the text-only pass."""
        tokens = jnp.asarray(token_ids, dtype=jnp.int32)
        if tokens.ndim != 1 or tokens.shape[0] == 0:
            raise RequestError(f"token_ids must be a non-empty 1-D sequence, got shape {tokens.shape}")
        bad = np.asarray((tokens < 0) | (tokens >= self.config.vocab_size))
        if bad.any():
            raise RequestError(f"token id {int(np.asarray(tokens)[bad][0])} outside the vocabulary "
                               f"[0, {self.config.vocab_size})")
        merger, leaves = self.functional
        images, videos = tuple(images or ()), tuple(videos or ())
        if images or videos or has_placeholders(self.vision, tokens):
            return forward_media(merger, leaves, self.config, self.vision, tokens, images, videos)
        return _forward(merger, leaves, tokens)


def lm_head(params: dict, x: jax.Array) -> jax.Array:
    """Final hidden `[..., H]` → logits `[..., V]` in float32 (tied or separate head)."""
    from ninfer_jax.model.modules import lm_head_logits

    return lm_head_logits(params["embed"], params.get("lm_head"), x)


@functools.partial(jax.jit, static_argnames=("merger",))
def _forward(merger: Merger, leaves: tuple, tokens: jax.Array) -> jax.Array:
    """The whole-sequence reference: `HybridLM.__call__` (dense causal attention, token-by-token
    delta rule)."""
    logits, _ = merger(leaves)(tokens)
    return logits


def checkpoint_dtype(path_or_name: str) -> str:
    """The dtype a model's weights are stored in: `config.json`'s `dtype` (or legacy
    `torch_dtype`), else the dtype holding most bytes in its safetensors headers;
    float32 for the built-in model."""
    if path_or_name.startswith("builtin:"):
        check_builtin(path_or_name)
        return "float32"
    check_folder(path_or_name)
    raw = read_config_json(path_or_name)
    parse_config(raw)  # a bad config is reported before anything about the weights
    declared = declared_dtype(raw)
    if declared is not None:
        return declared
    stored = stored_dtype(path_or_name)
    if stored is None:
        raise ConfigError("dtype", f"auto: {path_or_name!r} declares no dtype and holds no floating tensors; "
                                   f"pass one of {sorted(DTYPES)}")
    return stored


def resolve_dtype(path_or_name: str, dtype: str = AUTO) -> str:
    """The engine dtype (float32 or bfloat16) a model runs in: `dtype` when given, for "auto"
    the checkpoint's own (float16 → bfloat16, float64 → float32)."""
    if dtype != AUTO:
        if dtype not in DTYPES:
            raise ConfigError("dtype", f"must be {AUTO!r} or one of {sorted(DTYPES)}, got {dtype!r}")
        return dtype
    stored = checkpoint_dtype(path_or_name)
    engine = _ENGINE_DTYPE.get(stored)
    if engine is None:
        raise ConfigError("dtype", f"auto: the checkpoint is stored in {stored}, which the engine does not run; "
                                   f"pass one of {sorted(DTYPES)}")
    if engine != stored:
        log.warning("%s is stored in %s: running it in %s (auto)", path_or_name, stored, engine)
    return engine


def check_builtin(name: str) -> None:
    if name != builtin.NAME:
        raise ConfigError("model", f"unknown built-in model {name!r}; available: {builtin.NAME}")


def check_folder(path: str) -> None:
    if not os.path.isdir(path):
        raise ConfigError("model", f"{path!r} is neither a folder nor {builtin.NAME}")


def load_model(path_or_name: str = builtin.NAME, dtype: str = AUTO,
               progress: Callable[[ShardProgress], None] | None = None) -> Model:
    """A `Model` from a checkpoint folder (HF config.json + safetensors) or `builtin:tiny-hybrid`,
    in `dtype` ("auto": the checkpoint's own, `resolve_dtype`). `progress` hears of each
    safetensors shard as it is read (`ShardProgress.line()` is the engine's stderr line)."""
    dtype = resolve_dtype(path_or_name, dtype)
    np_dtype = np.dtype(jnp.dtype(DTYPES[dtype]))
    if path_or_name.startswith("builtin:"):
        check_builtin(path_or_name)  # the shipped HF folder, read by the ordinary path
        folder, cfg, raw = builtin.trained_folder(), builtin.config(), {}
    else:
        check_folder(path_or_name)
        raw = read_config_json(path_or_name)
        folder, cfg = path_or_name, parse_config(raw)
    params, mtp = load_params(folder, cfg, np_dtype, progress=progress, vision=is_multimodal(raw))
    params = jax.tree.map(jnp.asarray, params)
    vision = load_vision(folder, raw, cfg, np_dtype)
    return Model(config=cfg, params=params, dtype=DTYPES[dtype], name=path_or_name, mtp=mtp, vision=vision)
