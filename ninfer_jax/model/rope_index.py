"""Multimodal rotary positions for Qwen3.5's interleaved M-RoPE (the rope-index rule), numpy only.

Every token carries a (t, h, w) position triple, returned as `positions [3, n]` int32:

* a text token takes the running position `p` on all three axes, and `p` advances by one;
* a media run (the consecutive image- or video-placeholder tokens that follow a
  `vision_start` token) is laid out on its merged grid `(T, H/m, W/m)` (m =
  `spatial_merge_size`), in row-major order: t = p + i, h = p + j, w = p + k; afterwards `p`
  advances by max(H/m, W/m) (= the run's largest position + 1 for a single frame), not by its
  token count, so the position after a prefix is not its length;
* a video of grid (T, H, W) is T frames, each its own run `<t seconds><vision_start>
  <video_pad * H*W/m^2><vision_end>` with grid (1, H, W): frames are timestamped by text, not
  by the temporal axis (as transformers' Qwen3.5 / Qwen3-VL `get_rope_index`).

`rope_index` lays out a whole sequence and returns its `next_position`: where the following
text (decode included) continues. `rope_positions` continues from a `RopeCursor` (the state
after an already-laid-out prefix), so a prefill taken in chunks, or a paused request resumed,
gets exactly the positions of an uninterrupted one. A chunk boundary inside a media run is
never a recovery point: it is a `ValueError` (`is_frontier` says whether a split is allowed).
The grids are the request's whole lists, in order; the cursor counts the runs already used.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple, Sequence

import numpy as np

from ninfer_jax.errors import ConfigError

TEXT, IMAGE, VIDEO = 0, 1, 2
_KIND_NAME = {IMAGE: "image", VIDEO: "video"}


@dataclasses.dataclass(frozen=True)
class VisionTokens:
    """The special token ids and merge size the rule needs (from the multimodal config.json)."""
    image_token_id: int
    video_token_id: int
    vision_start_token_id: int
    spatial_merge_size: int = 2

    @classmethod
    def from_config(cls, raw: dict) -> "VisionTokens":
        """From a `qwen3_5` / `qwen3_5_moe` config.json dict (top-level ids, `vision_config`)."""
        vision = raw.get("vision_config") or {}
        fields = {}
        for name in ("image_token_id", "video_token_id", "vision_start_token_id"):
            value = raw.get(name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(name, f"expected a token id, got {value!r}")
            fields[name] = value
        merge = vision.get("spatial_merge_size", 2)
        if not isinstance(merge, int) or isinstance(merge, bool) or merge < 1:
            raise ConfigError("vision_config.spatial_merge_size", f"expected a positive int, got {merge!r}")
        return cls(spatial_merge_size=merge, **fields)


class RopeCursor(NamedTuple):
    """Where a laid-out prefix leaves the rule: the next text position, the image runs and
    video frame runs already used, and the prefix's last token (-1: none, i.e. the start)."""
    next_position: int = 0
    images: int = 0
    frames: int = 0
    last_token: int = -1


def _grid(grid_thw, what: str) -> tuple[int, int, int]:
    g = tuple(int(x) for x in np.asarray(grid_thw).reshape(-1))
    if len(g) != 3 or min(g) < 1:
        raise ValueError(f"{what}: grid_thw must be three positive ints, got {grid_thw!r}")
    return g


def frame_grids(image_grids: Sequence = (), video_grids: Sequence = ()) -> dict[int, list]:
    """The grid of each media run, per kind, in order: an image is one run, a video of T
    frames is T runs of grid (1, H, W)."""
    images = [_grid(g, f"image {i}") for i, g in enumerate(image_grids)]
    frames = []
    for i, g in enumerate(video_grids):
        t, h, w = _grid(g, f"video {i}")
        frames += [(1, h, w)] * t
    return {IMAGE: images, VIDEO: frames}


def run_tokens(grid: tuple[int, int, int], merge: int) -> int:
    """Placeholder tokens of one run of grid (T, H, W)."""
    t, h, w = grid
    if h % merge or w % merge:
        raise ValueError(f"grid {grid} is not divisible by spatial_merge_size {merge}")
    return t * (h // merge) * (w // merge)


def grid_positions(start: int, grid: tuple[int, int, int], merge: int) -> tuple[np.ndarray, int]:
    """One media run at `start`: positions `[3, T*H*W/m^2]` and the position after it."""
    t, h, w = grid[0], grid[1] // merge, grid[2] // merge
    tt, hh, ww = np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij")
    pos = np.stack([tt.reshape(-1), hh.reshape(-1), ww.reshape(-1)]) + start
    return pos.astype(np.int32), start + max(h, w)


def text_positions(start: int, n: int) -> np.ndarray:
    """`n` text tokens from `start` (decode too): the same position on all three axes."""
    return np.broadcast_to(np.arange(start, start + n, dtype=np.int32), (3, n)).copy()


def _kinds(ids: np.ndarray, spec: VisionTokens) -> np.ndarray:
    kind = np.full(ids.shape, TEXT, np.int8)
    kind[ids == spec.image_token_id] = IMAGE
    kind[ids == spec.video_token_id] = VIDEO
    return kind


def is_frontier(token_ids, k: int, spec: VisionTokens) -> bool:
    """Whether a sequence may be split before token `k` (0 <= k <= n): not inside a media run."""
    ids = np.asarray(token_ids, np.int64).reshape(-1)
    if not 0 <= k <= ids.size:
        raise ValueError(f"split {k} is outside the sequence of {ids.size} tokens")
    if k in (0, ids.size):
        return True
    kind = _kinds(ids[k - 1:k + 1], spec)
    return not (kind[0] != TEXT and kind[0] == kind[1])


def rope_positions(token_ids, spec: VisionTokens, image_grids: Sequence = (), video_grids: Sequence = (),
                   cursor: RopeCursor = RopeCursor()) -> tuple[np.ndarray, RopeCursor]:
    """Positions `[3, n]` int32 of `token_ids`, laid out after the prefix `cursor` describes,
    and the cursor after them. The grids are the request's whole lists (images, videos, in
    order); runs past the cursor's counts are used. Raises ValueError for a run that does not
    match its grid, lacks its `vision_start`, lacks a grid, or is cut by either chunk boundary.
    """
    ids = np.asarray(token_ids, np.int64).reshape(-1)
    n = ids.size
    merge = spec.spatial_merge_size
    grids = frame_grids(image_grids, video_grids)
    used = {IMAGE: cursor.images, VIDEO: cursor.frames}
    kind = _kinds(ids, spec)
    cuts = np.flatnonzero(np.diff(kind)) + 1
    starts = np.concatenate([[0], cuts]).astype(int) if n else np.zeros(0, int)
    ends = np.concatenate([cuts, [n]]).astype(int) if n else np.zeros(0, int)
    media_ids = {IMAGE: spec.image_token_id, VIDEO: spec.video_token_id}
    out = np.empty((3, n), np.int32)
    p = int(cursor.next_position)
    for s, e in zip(starts, ends):
        k = int(kind[s])
        if k == TEXT:
            out[:, s:e] = text_positions(p, e - s)
            p += e - s
            continue
        name = _KIND_NAME[k]
        before = int(ids[s - 1]) if s else int(cursor.last_token)
        if s == 0 and before == media_ids[k]:
            raise ValueError(f"the chunk starts inside an {name} run (the prefix ends with its token): "
                             "a frontier inside media is never a recovery point")
        if before != spec.vision_start_token_id:
            raise ValueError(f"the {name} run at token {s} does not follow vision_start "
                             f"({spec.vision_start_token_id}), got {before}")
        if used[k] >= len(grids[k]):
            raise ValueError(f"the {name} run at token {s} has no grid: {len(grids[k])} {name} "
                             "run(s) given, all used")
        grid = grids[k][used[k]]
        need = run_tokens(grid, merge)
        if e - s != need:
            where = ("the chunk ends inside it: a frontier inside media is never a recovery point"
                     if e == n and e - s < need else "the placeholder count does not match the grid")
            raise ValueError(f"the {name} run at token {s} has {e - s} tokens, its grid {grid} needs "
                             f"{need}: {where}")
        out[:, s:e], p = grid_positions(p, grid, merge)
        used[k] += 1
    last = int(ids[-1]) if n else int(cursor.last_token)
    return out, RopeCursor(p, used[IMAGE], used[VIDEO], last)


def rope_index(token_ids, spec: VisionTokens, image_grids: Sequence = (),
               video_grids: Sequence = ()) -> tuple[np.ndarray, int]:
    """A whole sequence: positions `[3, n]` int32 and `next_position` (where following text
    continues). Every grid must be used."""
    positions, cursor = rope_positions(token_ids, spec, image_grids, video_grids)
    grids = frame_grids(image_grids, video_grids)
    if cursor.images != len(grids[IMAGE]) or cursor.frames != len(grids[VIDEO]):
        raise ValueError(f"unused grids: {cursor.images} of {len(grids[IMAGE])} image run(s) and "
                         f"{cursor.frames} of {len(grids[VIDEO])} video frame run(s) in the sequence")
    return positions, cursor.next_position
