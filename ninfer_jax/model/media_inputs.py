"""One request's media as the paged steps take them: per prefill chunk, the tower's tokens in the
placeholders' rows and the M-RoPE positions; per decoded token, its rotary position.

The steps keep two positions apart (steps.py): the cache index of a token (its place in the
request, `start_pos + t` / `positions`) and its rotary position. Without media they are equal.
With media the rotary positions are `rope_index`'s (t, h, w) triples, and the text after the
prompt continues at `next_position`, which is not the prompt's length (an image of merged grid
(h, w) advances the position by max(h, w), not by h * w tokens). A decoded token is text: its
three axes are equal, so one rotary position per row is exact, and it is its cache position
plus the request's `delta` (= next_position - prompt length, fixed once the prompt is laid out).

```python
mp = MediaPrompt.prepare(model, token_ids, images=[...], videos=[...])   # tower runs once
embeds, embed_rows, rope = mp.chunk(start, end, width)    # [W, H], [W], [3, W]: one row
rope_b = mp.decode_rope(cache_position)                   # int: the decode step's `rope`
```

A chunk may cut through a placeholder run: the computation is exact (every position's rotary
triple and embedding are per token), only a saved frontier there is forbidden
(`rope_index.is_frontier`).
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ninfer_jax.model.multimodal import encode_media, media_layout
from ninfer_jax.model.rope_index import VisionTokens, text_positions

if TYPE_CHECKING:
    from ninfer_jax.model.model import Model


class ChunkMedia(NamedTuple):
    """One row of a prefill chunk's media inputs, padded to the chunk's width W: `embeds`
    `[W, H]` (zeros outside the placeholders), `embed_rows` `[W]` bool, `rope` `[3, W]` int32
    (zeros past the chunk's tokens). Stack rows on axis 0 (rope: axis 1) for the steps'
    `[R, T, H]`, `[R, T]`, `[3, R, T]`. `mtp_rope` `[3, W]` (speculative decoding): the rotary
    triples of the MTP indices start-1 .. (each token's predecessor's position)."""
    embeds: jax.Array
    embed_rows: np.ndarray
    rope: np.ndarray
    mtp_rope: np.ndarray | None = None

    def cut(self, width: int) -> "ChunkMedia":
        """The first `width` positions (a shorter chunk program; the chunk's tokens fit in them)."""
        return ChunkMedia(self.embeds[:width], self.embed_rows[:width], self.rope[:, :width],
                          None if self.mtp_rope is None else self.mtp_rope[:, :width])


class PromptPositions:
    """What a prompt laid out with media says of positions (`source` `[n]`, `next_position`):
    shared by `MediaPrompt` and the engine's `RequestMedia` (engine/media.py)."""

    source: np.ndarray
    next_position: int

    @property
    def length(self) -> int:
        return int(self.source.size)

    @property
    def delta(self) -> int:
        """Rotary minus cache position of every token after the prompt."""
        return self.next_position - self.length

    def decode_rope(self, cache_position: int) -> int:
        """The rotary position of the (text) token at `cache_position` >= the prompt's length:
        the decode step's `rope` for that row."""
        if cache_position < self.length:
            raise ValueError(f"cache position {cache_position} lies inside the prompt of {self.length} tokens")
        return cache_position + self.delta


@dataclasses.dataclass(frozen=True, eq=False)
class MediaPrompt(PromptPositions):
    """A prompt with media laid out for the paged steps: `rope` `[3, n]` (`rope_index`),
    `next_position`, `source` `[n]` (the row of `media` each token's embedding comes from, -1:
    the token's own) and `media` `[m, H]` (the tower's tokens: the images', then the videos')."""

    rope: np.ndarray
    next_position: int
    source: np.ndarray
    media: jax.Array

    @classmethod
    def build(cls, token_ids, spec: VisionTokens, media, positions: np.ndarray, next_position: int) -> "MediaPrompt":
        """From the token ids, the tower's tokens in order (every image's, then every video's,
        as `multimodal.encode_media` gives them) and `rope_index`'s positions and next position."""
        ids = np.asarray(token_ids).reshape(-1)
        positions = np.asarray(positions, np.int32)
        if positions.shape != (3, ids.size):
            raise ValueError(f"positions must have shape (3, {ids.size}), got {positions.shape}")
        rows = np.concatenate([np.flatnonzero(ids == spec.image_token_id), np.flatnonzero(ids == spec.video_token_id)])
        if rows.size != media.shape[0]:
            raise ValueError(f"{rows.size} placeholder tokens but {media.shape[0]} media tokens")
        source = np.full(ids.size, -1, np.int32)
        source[rows] = np.arange(rows.size, dtype=np.int32)
        return cls(positions, int(next_position), source, media)

    @classmethod
    def prepare(cls, model: Model, token_ids, images: Sequence = (), videos: Sequence = ()) -> "MediaPrompt":
        """Check the media against the placeholders (`multimodal.media_layout`'s typed errors),
        run the tower once, and lay the prompt out."""
        ids = np.asarray(token_ids, np.int64).reshape(-1)
        images, videos = tuple(images), tuple(videos)
        layout = media_layout(model.vision, model.config, ids, images, videos)
        return cls.build(ids, model.vision.tokens, encode_media(model.vision, layout.items), layout.positions,
                         layout.next_position)

    def chunk(self, start: int, end: int, width: int | None = None, dtype=None) -> ChunkMedia:
        """The media inputs of tokens [start, end) as one row of width `width` (default end -
        start); positions past the prompt continue as text (`decode_rope`'s), so a chunk may
        run on into the generated tokens. `dtype`: the embeddings' (default the tower's)."""
        width = end - start if width is None else width
        if not 0 <= start <= end or end - start > width:
            raise ValueError(f"chunk [{start}, {end}) does not fit width {width}")
        n = end - start
        inside = min(end, self.length) - min(start, self.length)
        source = np.full(width, -1, np.int32)
        source[:inside] = self.source[start:start + inside]
        rope = np.zeros((3, width), np.int32)
        rope[:, :inside] = self.rope[:, start:start + inside]
        if n > inside:
            rope[:, inside:n] = text_positions(self.decode_rope(start + inside), n - inside)
        rows = source >= 0
        media = self.media if dtype is None else self.media.astype(dtype)
        embeds = jnp.where(jnp.asarray(rows)[:, None], jnp.take(media, jnp.asarray(np.maximum(source, 0)), axis=0),
                           jnp.zeros((), media.dtype))
        return ChunkMedia(embeds, rows, rope)


def text_chunk(start: int, n: int, width: int, hidden: int, dtype) -> ChunkMedia:
    """The media inputs of a text-only row (no media, rotary = cache positions) in a media chunk."""
    rope = np.zeros((3, width), np.int32)
    rope[:, :n] = text_positions(start, n)
    return ChunkMedia(jnp.zeros((width, hidden), dtype), np.zeros(width, bool), rope)
