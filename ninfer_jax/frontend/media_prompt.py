"""Images and videos in a rendered chat prompt: each placeholder becomes its item's tokens.

A Qwen3.5 (and Qwen3-VL) chat template writes one placeholder per media part:
`<|vision_start|><|image_pad|><|vision_end|>` for an image, `<|vision_start|><|video_pad|>
<|vision_end|>` for a video. As transformers' `Qwen3VLProcessor` does, the i-th `<|image_pad|>`
then becomes `grid_t * grid_h * grid_w / merge_size**2` image pads (the item's merged tokens),
and the j-th `<|video_pad|>` becomes, per temporal patch group g of the video,
`<t_g seconds><|vision_start|>` + `grid_h * grid_w / merge_size**2` video pads + `<|vision_end|>`,
inside the template's own outer `<|vision_start|>` / `<|vision_end|>` (the reference replaces the
pad token only). `t_g` is the mean time of the group's first and last frame, frame k at `k / fps`
(the last frame repeated to fill the group), written with one decimal; a video given as frames
without an `fps` is taken at 24, the reference's own assumption.

The expansion works on token ids: each placeholder is one added token, and it must follow
`<|vision_start|>` (an added token too, and what the rope-index rule needs before a run). The
replacement ends with an added token, so encoding a timestamp text alone gives the ids that
encoding the whole expanded text gives (added tokens split the text before the pre-tokenizer).

Each item's `MediaRange` covers exactly the tokens that replace its placeholder: an image's pad
run; a video's first timestamp through its last frame's `<|vision_end|>`. The template's outer
`<|vision_start|>` / `<|vision_end|>` stay outside: a cut next to them is a valid frontier (the
rope-index rule allows a split right before or after a run), while a cut inside the replacement
would split an item the vision tower encodes whole (`DigestChain.splits_media`).
"""
from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Sequence

from .errors import MediaNotSupportedError, MediaPlaceholderError, TooManyFramesError
from .identity import MediaRange
from .media import (PreparedImage, ProcessorSettings, decode_animation, prepare_image, prepare_video,
                    sample_frame_indices)
from .media_sources import MediaPart, MediaPolicy, resolve_source
from .tokenizer import Tokenizer

VISION_START, VISION_END = "<|vision_start|>", "<|vision_end|>"
PAD_TOKENS = {"image": "<|image_pad|>", "video": "<|video_pad|>"}
DEFAULT_VIDEO_FPS = 24.0  # transformers' Qwen3VLProcessor, for frames that come without a rate


@dataclass(frozen=True)
class VisionTokenIds:
    vision_start: int
    vision_end: int
    pads: dict[str, int]  # kind -> placeholder id, for each pad token the tokenizer has


def vision_token_ids(tokenizer: Tokenizer, kinds: set[str]) -> VisionTokenIds:
    """The vision token ids, or `MediaNotSupportedError` when the tokenizer lacks one `kinds` need."""
    added = tokenizer.special_tokens
    missing = [t for t in (VISION_START, VISION_END, *(PAD_TOKENS[k] for k in sorted(kinds))) if t not in added]
    if missing:
        raise MediaNotSupportedError(f"the tokenizer of {tokenizer.name or 'this model'} has no {', '.join(missing)}: "
                                     f"this model does not take {' or '.join(sorted(kinds))} input")
    pads = {kind: added[token] for kind, token in PAD_TOKENS.items() if token in added}
    return VisionTokenIds(added[VISION_START], added[VISION_END], pads)


@dataclass(frozen=True, eq=False)
class PromptMedia:
    """One prepared item and the token ids that replace its placeholder."""

    part: MediaPart
    prepared: PreparedImage
    tokens: tuple[int, ...] = field(repr=False)

    @property
    def kind(self) -> str:
        return self.part.kind


def _timestamps(indices: list[int], fps: float, temporal: int) -> list[float]:
    """Per temporal patch group, the mean time of its first and last frame (the reference's
    `_calculate_timestamps`: frame index i at i / fps; the last repeated to fill the group)."""
    indices = list(indices) + [indices[-1]] * (-len(indices) % temporal)
    times = [i / fps for i in indices]
    return [(times[i] + times[i + temporal - 1]) / 2 for i in range(0, len(times), temporal)]


def prepare_media(parts: Sequence[MediaPart], tokenizer: Tokenizer, ids: VisionTokenIds, policy: MediaPolicy,
                  image_settings: ProcessorSettings, video_settings: ProcessorSettings) -> tuple[PromptMedia, ...]:
    """Check, resolve and prepare every item, in order; each refusal is a typed `MediaError`.
    Cheap checks (video files, frame counts) run over all items before any source is read;
    every source is read before any is decoded."""
    frame_limit = policy.max_input_frames if policy.max_input_frames is not None else video_settings.max_frames
    for p in parts:
        if p.kind == "video" and frame_limit is not None and len(p.frames) > frame_limit:
            raise TooManyFramesError(f"{len(p.frames)} frames over the limit of {frame_limit}",
                                     frames=len(p.frames), limit=frame_limit)
    data = [[resolve_source(s, policy) for s in p.frames] if p.kind == "video" and p.source is None
            else resolve_source(p.source, policy, video=p.kind == "video") for p in parts]
    timestamp_ids: dict[str, tuple[int, ...]] = {}
    out = []
    for p, raw in zip(parts, data):
        if p.kind == "image":
            prepared = prepare_image(raw, image_settings, max_input_pixels=policy.max_input_pixels)
            t, h, w = prepared.grid_thw
            tokens = (ids.pads["image"],) * (t * h * w // image_settings.merge_size ** 2)
        else:
            if p.source is not None:  # a video file: decoded, then sampled as the reference does
                decoded, fps = decode_animation(raw, max_input_pixels=policy.max_input_pixels,
                                                max_input_frames=frame_limit)
                indices = [int(i) for i in sample_frame_indices(len(decoded), fps, video_settings)]
                raw = [decoded[i] for i in indices]
            else:  # frames as given, already sampled
                indices, fps = list(range(len(raw))), p.fps or DEFAULT_VIDEO_FPS
            prepared = prepare_video(raw, video_settings, max_input_frames=frame_limit,
                                     max_input_pixels=policy.max_input_pixels)
            t, h, w = prepared.grid_thw
            times = _timestamps(indices, fps, video_settings.temporal_patch_size)
            assert len(times) == t, (len(times), prepared.grid_thw)  # every frame is taken: t = ceil(frames / T)
            run = (ids.vision_start, *(ids.pads["video"],) * (h * w // video_settings.merge_size ** 2), ids.vision_end)
            seq: list[int] = []
            for time in times:
                text = f"<{time:.1f} seconds>"
                if text not in timestamp_ids:
                    timestamp_ids[text] = tuple(tokenizer.encode(text))
                seq += (*timestamp_ids[text], *run)
            tokens = tuple(seq)
        out.append(PromptMedia(p, prepared, tokens))
    return tuple(out)


@dataclass(frozen=True)
class Expansion:
    """A rendered prompt with its placeholders expanded, and how its frontiers map."""

    token_ids: tuple[int, ...] = field(repr=False)
    ranges: tuple[MediaRange, ...]
    media: tuple[PromptMedia, ...]          # in prompt order, parallel to `ranges`
    _where: tuple[int, ...] = field(repr=False)   # each placeholder's index in the collapsed ids
    _shift: tuple[int, ...] = field(repr=False)   # extra tokens of the first n placeholders, n = 0..len

    def frontier(self, k: int) -> int:
        """The expanded frontier of collapsed frontier `k` (never inside a replacement: a collapsed
        frontier lies before or after a whole placeholder token)."""
        return k + self._shift[bisect_left(self._where, k)]

    def end_of(self, message: int, part: int) -> int | None:
        """Where the media item at `messages[message].content[part]` ends, if there is one."""
        for m, r in zip(self.media, self.ranges):
            if (m.part.message, m.part.part) == (message, part):
                return r.end
        return None


class MediaLayout:
    """The request's prepared media and the tokenizer's vision ids: expands rendered prompts."""

    def __init__(self, media: Sequence[PromptMedia], ids: VisionTokenIds):
        self.media = tuple(media)
        self.ids = ids

    @classmethod
    def prepare(cls, parts: Sequence[MediaPart], tokenizer: Tokenizer, policy: MediaPolicy,
                image_settings: ProcessorSettings, video_settings: ProcessorSettings) -> "MediaLayout":
        """Vision tokens first (`MediaNotSupportedError` before any source is read), then the items."""
        ids = vision_token_ids(tokenizer, {p.kind for p in parts})
        return cls(prepare_media(parts, tokenizer, ids, policy, image_settings, video_settings), ids)

    def expand(self, collapsed: Sequence[int]) -> Expansion:
        """Replace the i-th placeholder of each kind by the i-th item of that kind (the reference
        consumes images and videos each in order); every placeholder and every item must pair."""
        queues = {kind: [m for m in self.media if m.kind == kind] for kind in PAD_TOKENS}
        by_id = {pid: kind for kind, pid in self.ids.pads.items()}
        used = {kind: 0 for kind in PAD_TOKENS}
        out: list[int] = []
        ranges: list[MediaRange] = []
        order: list[PromptMedia] = []
        where: list[int] = []
        shift: list[int] = []
        extra = 0
        for idx, tok in enumerate(collapsed):
            kind = by_id.get(tok)
            if kind is None:
                out.append(tok)
                continue
            n = used[kind]
            if n >= len(queues[kind]):
                raise MediaPlaceholderError(f"the prompt holds more {PAD_TOKENS[kind]} than the request has "
                                            f"{kind}s ({len(queues[kind])}): a text part may not write it")
            if idx == 0 or collapsed[idx - 1] != self.ids.vision_start:
                raise MediaPlaceholderError(f"{kind} placeholder {n} does not follow {VISION_START}")
            item = queues[kind][n]
            used[kind] += 1
            where.append(idx)
            shift.append(extra)
            start = len(out)
            out.extend(item.tokens)
            extra += len(item.tokens) - 1
            ranges.append(MediaRange(start, len(out), item.prepared.digest, kind))
            order.append(item)
        for kind, queue in queues.items():
            if used[kind] != len(queue):
                raise MediaPlaceholderError(f"the chat template rendered {used[kind]} {PAD_TOKENS[kind]} for "
                                            f"{len(queue)} {kind}(s)")
        shift.append(extra)
        return Expansion(tuple(out), tuple(ranges), tuple(order), tuple(where), tuple(shift))
