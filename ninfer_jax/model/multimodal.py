"""The vision tower of a multimodal checkpoint, and the whole-sequence reference pass with media.

`load_vision` reads a `Qwen3_5ForConditionalGeneration` / `Qwen3_5MoeForConditionalGeneration`
checkpoint's tower (`model.visual.*`) into a `Vision`: its parameters, `VisionConfig` and the
`VisionTokens` ids. `forward_media` is `Model.forward` with images and videos, as transformers'
`Qwen3_5Model.forward` does it:

- the prompt's token ids already hold the placeholder runs (`<|vision_start|>`, one image-pad id
  per merged token, `<|vision_end|>`; a video one such run per temporal patch, after its
  timestamp text), as the reference processor expands them;
- the tower encodes every image and video (`vision.encode_bucketed`, images first, each in
  order; images never attend to each other, so one call equals the reference's two);
- the image tokens replace the image-pad tokens' embeddings in order, then the video tokens
  the video-pad tokens' (`masked_scatter`);
- positions are the (t, h, w) triples of `rope_index` (`get_rope_index`), the attention layers'
  rope takes them as M-RoPE (`layers.rope_cos_sin(triples=True)`); the GDN layers have none.

Every input error is a typed error raised before any work (RequestError, ConfigError).
"""
from __future__ import annotations

import dataclasses
import functools
import logging
from typing import TYPE_CHECKING, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ninfer_jax.errors import ConfigError, RequestError
from ninfer_jax.model.config import ModelConfig
from ninfer_jax.model.rope_index import VisionTokens, rope_index
from ninfer_jax.model.vision import VisionConfig, check_grid, encode_bucketed, parse_vision_config
from ninfer_jax.model.vision_weights import vision_params
from ninfer_jax.model.weights import VISION_NAME, Tensors

if TYPE_CHECKING:  # flax is imported only when a model is first used
    from ninfer_jax.model.modules import Merger

log = logging.getLogger("ninfer_jax.model")

_WRAPPERS = ("qwen3_5", "qwen3_5_moe")


@dataclasses.dataclass(eq=False)
class Vision:
    """A loaded vision tower: parameters (device arrays, `vision_weights` layout), its config
    and the special token ids the prompt's placeholders use."""

    params: dict = dataclasses.field(repr=False)
    config: VisionConfig
    tokens: VisionTokens


def is_multimodal(raw: dict) -> bool:
    """Whether a config.json declares a vision tower (a multimodal wrapper with `vision_config`)."""
    return raw.get("model_type") in _WRAPPERS and isinstance(raw.get("vision_config"), dict)


def load_vision(folder: str, raw: dict, cfg: ModelConfig, dtype) -> Vision | None:
    """The tower of a multimodal checkpoint in numpy `dtype` (then on the device), or None when
    the config declares none or the checkpoint holds no vision tensors (a text-only extract).
    A tower that does not match its config is a CheckpointError / ConfigError."""
    if not is_multimodal(raw):
        return None
    tensors = Tensors(folder)
    names = sorted(n for n in tensors.names() if VISION_NAME.match(n))
    if not names:
        log.info("%s declares a vision tower but holds no vision tensors: text only", folder)
        return None
    vcfg = parse_vision_config(raw)
    if vcfg.out_hidden_size != cfg.hidden_size:
        raise ConfigError("vision_config.out_hidden_size",
                          f"{vcfg.out_hidden_size} must equal the text hidden_size {cfg.hidden_size}")
    spec = VisionTokens.from_config(raw)
    for field in ("image_token_id", "video_token_id", "vision_start_token_id"):
        if getattr(spec, field) >= cfg.vocab_size:
            raise ConfigError(field, f"{getattr(spec, field)} is outside the vocabulary [0, {cfg.vocab_size})")
    params = vision_params({n: tensors.get(n) for n in names}, vcfg, dtype)
    return Vision(params=jax.tree.map(jnp.asarray, params), config=vcfg, tokens=spec)


def has_placeholders(vision: Vision | None, tokens) -> bool:
    """Whether `tokens` hold an image- or video-pad id of `vision` (False without a tower)."""
    if vision is None:
        return False
    ids = np.asarray(tokens)
    return bool(((ids == vision.tokens.image_token_id) | (ids == vision.tokens.video_token_id)).any())


def _media(items: Sequence, kind: str, vcfg: VisionConfig) -> list[tuple[object, np.ndarray]]:
    """(pixel_values, grid `[1, 3]`) of each item: a (pixel_values, grid_thw) pair or an object
    with those attributes (`frontend.media.PreparedImage`); shapes checked (RequestError)."""
    out = []
    for i, item in enumerate(items):
        if hasattr(item, "pixel_values") and hasattr(item, "grid_thw"):
            pixels, grid = item.pixel_values, item.grid_thw
        else:
            try:
                pixels, grid = item
            except (TypeError, ValueError):
                raise RequestError(f"{kind} {i}: expected a (pixel_values, grid_thw) pair or a prepared "
                                   f"image, got {type(item).__name__}") from None
        try:
            grid = check_grid(vcfg, np.asarray(grid).reshape(1, -1))
        except RequestError as e:
            raise RequestError(f"{kind} {i}: {e}") from None
        n = int(np.prod(grid))
        if not isinstance(pixels, jax.Array):
            pixels = np.asarray(pixels)
        if pixels.ndim != 2 or tuple(pixels.shape) != (n, vcfg.patch_dim):
            raise RequestError(f"{kind} {i}: pixel_values must have shape ({n}, {vcfg.patch_dim}) for grid_thw "
                               f"{grid[0].tolist()}, got {tuple(pixels.shape)}")
        if not jnp.issubdtype(pixels.dtype, jnp.floating):
            raise RequestError(f"{kind} {i}: pixel_values must be floating point, got {pixels.dtype}")
        out.append((pixels, grid))
    return out


class MediaLayout(NamedTuple):
    """A prompt's media checked against its placeholders: the items (pixel_values, grid `[1, 3]`),
    images then videos; the M-RoPE `positions` `[3, T]` and the `next_position` after the
    prompt (`rope_index`); the placeholders' `rows` `[n]`, the image pads' then the video pads'."""
    items: list
    positions: np.ndarray
    next_position: int
    rows: np.ndarray


def media_layout(vision: Vision | None, cfg: ModelConfig, ids: np.ndarray, images: Sequence = (),
                 videos: Sequence = ()) -> MediaLayout:
    """Everything checked before any work (`MediaLayout`). RequestError for media given to a
    text-only model, malformed media, or placeholders that do not match the grids."""
    if vision is None:
        raise RequestError("images or videos were given, but the checkpoint is text-only (it holds no vision tower)")
    if cfg.mrope_section is None:
        raise ConfigError("rope_parameters.mrope_section", "is required to run a prompt with media (M-RoPE)")
    vcfg, spec = vision.config, vision.tokens
    image_items, video_items = _media(images, "image", vcfg), _media(videos, "video", vcfg)
    unit = vcfg.merge_unit
    for kind, items, token in (("image", image_items, spec.image_token_id),
                               ("video", video_items, spec.video_token_id)):
        need = sum(int(np.prod(g)) // unit for _, g in items)
        have = int((ids == token).sum())
        if have != need:
            raise RequestError(f"the prompt holds {have} {kind} placeholder tokens (id {token}), its "
                               f"{len(items)} {kind}(s) need {need} (one per merged token)")
    try:
        positions, next_position = rope_index(ids, spec, [g[0] for _, g in image_items],
                                              [g[0] for _, g in video_items])
    except ValueError as e:
        raise RequestError(f"the placeholders do not match the media: {e}") from None
    rows = np.concatenate([np.flatnonzero(ids == spec.image_token_id),
                           np.flatnonzero(ids == spec.video_token_id)]).astype(np.int32)
    return MediaLayout(image_items + video_items, positions, int(next_position), rows)


def encode_media(vision: Vision, items: list, executable=None) -> jax.Array:
    """The tower's tokens `[n, out_hidden_size]` of every item, in order (the tower's dtype).
    `executable`: `encode_bucketed`'s compiled buckets (the engine's counted ones)."""
    pixels = [p for p, _ in items]
    joined = (jnp.concatenate([jnp.asarray(p) for p in pixels]) if any(isinstance(p, jax.Array) for p in pixels)
              else pixels[0] if len(pixels) == 1 else np.concatenate(pixels))
    grid = np.concatenate([np.asarray(g).reshape(-1, 3) for _, g in items])
    return encode_bucketed(vision.params, vision.config, joined, grid, executable)


def forward_media(merger: Merger, leaves: tuple, cfg: ModelConfig, vision: Vision | None, tokens: jax.Array,
                  images: Sequence = (), videos: Sequence = ()) -> jax.Array:
    """Logits `[T, vocab]` (float32) of one whole uncached pass over `tokens` `[T]` (checked ids)
    with the media's tokens in its placeholders and M-RoPE positions (module docstring)."""
    items, positions, _, rows = media_layout(vision, cfg, np.asarray(tokens), images, videos)
    media = encode_media(vision, items)
    return forward_embedded(merger, leaves, tokens, jnp.asarray(rows), media, jnp.asarray(positions))


@functools.partial(jax.jit, static_argnames=("merger",))
def forward_embedded(merger: Merger, leaves: tuple, tokens: jax.Array, rows: jax.Array, media: jax.Array,
                     positions: jax.Array) -> jax.Array:
    """`HybridLM.__call__` with `media` `[n, H]` in the embeddings' `rows` `[n]` and M-RoPE
    `positions` `[3, T]`: the whole-sequence reference with media."""
    module = merger(leaves)
    embeds = module.embed_tokens(tokens)
    embeds = embeds.at[rows].set(media.astype(embeds.dtype))
    logits, _ = module(tokens, embeds, positions, triples=True)
    return logits
