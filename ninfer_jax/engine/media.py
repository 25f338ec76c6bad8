"""One request's media, as the engine runs it (issue 34): what each prefill chunk feeds the model
in place of the placeholders, the rotary positions of every token, and the media ranges that
enter the request's identity.

`RequestMedia.of(model, prompt, images, videos, ranges)` checks the media against the prompt's
placeholders (`multimodal.media_layout`'s typed errors) and lays the prompt out once:

- `rope` `[3, n]` and `next_position` (`rope_index`): text after the prompt (and every decoded
  token) continues at `next_position`, so a token at cache position p >= n has rotary position
  p + `delta`. Both are functions of the prompt and its media alone, so a paused, replayed or
  reused request continues with exactly the positions of an uninterrupted one;
- `source` `[n]`: for each placeholder token the row of the media tokens that replaces its
  embedding (the image pads' rows, then the video pads', as the reference scatters them);
- `ranges`: each item's `(start, end, "kind:digest")`, the media identity the ledger keeps in
  every frontier identity that covers the item (CKP-4, SH-7). A frontier strictly inside a
  range is never a recovery point (`inside`): the item is saved whole or not at all.

The pixels stay with the request; the tower's output is fetched per chunk from the engine's
`MediaCache` (engine/media_cache.py) and encoded again when it is gone (PAUSE-6).
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from ninfer_jax.errors import RequestError
from ninfer_jax.model.media_inputs import ChunkMedia, PromptPositions
from ninfer_jax.model.multimodal import media_layout
from ninfer_jax.model.rope_index import text_positions

if TYPE_CHECKING:
    from ninfer_jax.model.model import Model


def _digest(pixels, grid) -> str:
    """The content digest of an item given as a bare (pixel_values, grid_thw) pair."""
    h = hashlib.sha256(np.asarray(grid, np.int64).tobytes())
    h.update(np.ascontiguousarray(np.asarray(pixels, np.float32)).tobytes())
    return h.hexdigest()


@dataclasses.dataclass(frozen=True, eq=False)
class RequestMedia(PromptPositions):
    keys: tuple[str, ...]  # per item ("kind:digest"), images then videos
    pixels: tuple = dataclasses.field(repr=False)  # per item (pixel_values, grid `[1, 3]`)
    offsets: np.ndarray = dataclasses.field(repr=False)  # [m + 1]: item i owns media rows offsets[i]:offsets[i+1]
    source: np.ndarray = dataclasses.field(repr=False)  # [n]: media row of each token, -1 for text
    rope: np.ndarray = dataclasses.field(repr=False)  # [3, n]
    next_position: int
    ranges: tuple  # ((start, end, key), ...) sorted by start: the identity's media

    @classmethod
    def of(cls, model: Model, prompt: Sequence[int], images: Sequence = (), videos: Sequence = (),
           ranges: Sequence | None = None) -> "RequestMedia":
        """`images` / `videos`: (pixel_values, grid_thw) pairs or prepared items (with a
        `digest`); `ranges`: the frontend's `MediaRange`s in prompt order (a rendered chat),
        or None: each item's range is its placeholder rows' span."""
        vision = model.vision if model is not None else None
        ids = np.asarray(prompt, np.int64)
        layout = media_layout(vision, model.config if model is not None else None, ids, images, videos)
        given = tuple(images) + tuple(videos)
        kinds = ("image",) * len(images) + ("video",) * len(videos)
        counts = [int(np.prod(g)) // vision.config.merge_unit for _, g in layout.items]
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        keys = tuple(f"{k}:{getattr(item, 'digest', None) or _digest(p, g)}"
                     for k, item, (p, g) in zip(kinds, given, layout.items))
        source = np.full(ids.size, -1, np.int32)
        source[layout.rows] = np.arange(layout.rows.size, dtype=np.int32)
        if ranges is None:
            spans = [(int(layout.rows[offsets[i]]), int(layout.rows[offsets[i + 1] - 1]) + 1, keys[i])
                     for i in range(len(keys)) if counts[i]]
        else:
            spans = cls._given_ranges(ranges, kinds, keys)
        return cls(keys, tuple(layout.items), offsets, source, layout.positions, layout.next_position,
                   tuple(sorted(spans)))

    @staticmethod
    def _given_ranges(ranges, kinds, keys) -> list:
        """The frontend's ranges (prompt order) paired with the items (images, then videos)."""
        by_kind = {k: [key for kk, key in zip(kinds, keys) if kk == k] for k in ("image", "video")}
        out = []
        for r in ranges:
            queue = by_kind.get(r.kind)
            if not queue:
                raise RequestError(f"a {r.kind} range [{r.start}, {r.end}) has no {r.kind} item")
            key = queue.pop(0)
            if key != f"{r.kind}:{r.digest}":
                raise RequestError(f"the {r.kind} range [{r.start}, {r.end}) names another item than the media given")
            out.append((int(r.start), int(r.end), key))
        if any(by_kind.values()):
            raise RequestError("more media items than media ranges")
        return out

    def inside(self, frontier: int) -> bool:
        """Whether `frontier` lies strictly inside a media range (never a recovery point, SH-7)."""
        return any(s < frontier < e for s, e, _ in self.ranges)

    def items_in(self, start: int, end: int) -> list[int]:
        """The items whose media rows feed tokens [start, end) of the prompt."""
        src = self.source[min(start, self.length):min(end, self.length)]
        src = src[src >= 0]
        return sorted({int(i) - 1 for i in np.searchsorted(self.offsets, src, side="right")})

    def rotary(self, start: int, n: int) -> np.ndarray:
        """The rotary triples `[3, n]` of cache positions [start, start + n)."""
        out = np.empty((3, n), np.int32)
        inside = max(0, min(start + n, self.length) - start)
        out[:, :inside] = self.rope[:, start:start + inside]
        if n > inside:
            out[:, inside:] = text_positions(self.decode_rope(start + inside), n - inside)
        return out

    def chunk(self, start: int, n: int, width: int, embed_of: Callable[[int], np.ndarray], hidden: int,
              dtype) -> ChunkMedia:
        """The media inputs of tokens [start, start + n) as one row of width `width`: each
        covered item's tower tokens come from `embed_of(item)` (the media cache)."""
        rope = np.zeros((3, width), np.int32)
        rope[:, :n] = self.rotary(start, n)
        mtp_rope = np.zeros((3, width), np.int32)  # index start-1+t: its token's position (-1: never read)
        if start > 0:
            mtp_rope[:, :n] = self.rotary(start - 1, n)
        else:
            mtp_rope[:, 0] = -1
            mtp_rope[:, 1:n] = rope[:, :n - 1]
        src = np.full(width, -1, np.int64)
        inside = max(0, min(start + n, self.length) - start)
        src[:inside] = self.source[start:start + inside]
        rows = src >= 0
        # Built on the Host with numpy (the step takes Host arrays): eager device ops here would
        # compile anew for each item size on the request path.
        embeds = np.zeros((width, hidden), dtype)
        if not rows.any():
            return ChunkMedia(embeds, rows, rope, mtp_rope)
        for i in self.items_in(start, start + inside):
            lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
            mine = rows & (src >= lo) & (src < hi)
            embeds[mine] = np.asarray(embed_of(i))[src[mine] - lo]
        return ChunkMedia(embeds, rows, rope, mtp_rope)
