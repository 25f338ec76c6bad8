"""The rope-index rule (ninfer_jax/model/rope_index.py) against transformers' Qwen3.5
`get_rope_index`, exactly, and chunked layout (prefix + suffix) equal to the whole sequence's."""
from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np
import pytest

from ninfer_jax.errors import ConfigError
from ninfer_jax.model.rope_index import RopeCursor, VisionTokens, is_frontier, rope_index, rope_positions

IMG, VID, VS, VE = 248056, 248057, 248053, 248054  # Qwen3_5Config's defaults (VE: vision_end)
SPEC = VisionTokens(image_token_id=IMG, video_token_id=VID, vision_start_token_id=VS, spatial_merge_size=2)


def text(n, base=100):
    return list(range(base, base + n))


def image(grid, merge=2):
    t, h, w = grid
    return [VS] + [IMG] * (t * h * w // merge ** 2) + [VE]


def video(grid, merge=2):
    """As Qwen3-VL's processor expands a video: per frame `<t seconds><vs><pads><ve>`, inside
    the chat template's own vision_start / vision_end."""
    t, h, w = grid
    out = [VS]
    for f in range(t):
        out += [900 + f, 901] + [VS] + [VID] * (h * w // merge ** 2) + [VE]
    return out + [VE]


def reference(ids, image_grids=(), video_grids=(), merge=2):
    """transformers' Qwen3_5Model.get_rope_index, called on a stand-in `self` (it only reads
    the merge size and its own get_vision_position_ids): (positions [3, n], next position)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5Model

    me = SimpleNamespace(config=SimpleNamespace(vision_config=SimpleNamespace(spatial_merge_size=merge)))
    me.get_vision_position_ids = functools.partial(Qwen3_5Model.get_vision_position_ids, me)
    input_ids = torch.tensor([ids], dtype=torch.long)
    types = torch.tensor([[1 if t == IMG else 2 if t == VID else 0 for t in ids]], dtype=torch.int)
    grid = lambda g: torch.tensor(g, dtype=torch.long) if g else None  # noqa: E731
    pos, delta = Qwen3_5Model.get_rope_index(me, input_ids, types, grid(list(image_grids)),
                                             grid(list(video_grids)))
    return pos[:, 0].numpy(), int(delta[0, 0]) + len(ids)


CASES = {
    "text only": (text(7), [], []),
    "image (1,4,6)": (text(3) + image((1, 4, 6)) + text(4), [(1, 4, 6)], []),
    "image (1,8,4)": (text(3) + image((1, 8, 4)) + text(4), [(1, 8, 4)], []),
    "two images, text between and after": (text(2) + image((1, 4, 6)) + text(3) + image((1, 8, 4)) + text(5),
                                           [(1, 4, 6), (1, 8, 4)], []),
    "video (4,4,4)": (text(3) + video((4, 4, 4)) + text(2), [], [(4, 4, 4)]),
    "image and video": (text(2) + image((1, 6, 4)) + text(1) + video((2, 4, 6)) + text(3),
                        [(1, 6, 4)], [(2, 4, 6)]),
    "image at the very start": (image((1, 4, 6)) + text(3), [(1, 4, 6)], []),
    "image at the very end": (text(3) + image((1, 8, 4)), [(1, 8, 4)], []),
    "bare image run at the end": (text(3) + image((1, 8, 4))[:-1], [(1, 8, 4)], []),
}


@pytest.mark.parametrize("name", CASES)
def test_equals_transformers_get_rope_index(name):
    ids, images, videos = CASES[name]
    pos, nxt = rope_index(ids, SPEC, images, videos)
    ref_pos, ref_next = reference(ids, images, videos)
    assert pos.dtype == np.int32 and pos.shape == (3, len(ids))
    np.testing.assert_array_equal(pos, ref_pos)
    assert nxt == ref_next == int(pos.max()) + 1


def test_text_only_is_arange_on_all_axes():
    pos, nxt = rope_index(text(5), SPEC)
    np.testing.assert_array_equal(pos, np.tile(np.arange(5), (3, 1)))
    assert nxt == 5


def test_next_position_is_not_the_token_count():
    ids = text(3) + image((1, 8, 4)) + text(4)
    pos, nxt = rope_index(ids, SPEC, [(1, 8, 4)])
    # 3 text, vision_start at 3, 8 image tokens on a 4x2 grid from 4 (next 4+4=8), vision_end at 8.
    assert pos[:, 3].tolist() == [3, 3, 3] and pos[:, -5].tolist() == [8, 8, 8]
    assert nxt == 13 and len(ids) == 17


@pytest.mark.parametrize("name", [n for n in CASES if n != "text only"])
def test_every_frontier_split_equals_the_whole(name):
    ids, images, videos = CASES[name]
    whole, nxt = rope_index(ids, SPEC, images, videos)
    splits = [k for k in range(len(ids) + 1) if is_frontier(ids, k, SPEC)]
    assert len(splits) < len(ids) + 1  # some splits fall inside media
    for k in splits:
        head, cursor = rope_positions(ids[:k], SPEC, images, videos)
        tail, end = rope_positions(ids[k:], SPEC, images, videos, cursor)
        np.testing.assert_array_equal(np.concatenate([head, tail], axis=1), whole)
        assert end.next_position == nxt


def test_three_chunks_and_decode_continue():
    ids = text(2) + image((1, 4, 6)) + text(3) + video((2, 4, 4)) + text(2)
    images, videos = [(1, 4, 6)], [(2, 4, 4)]
    whole, nxt = rope_index(ids, SPEC, images, videos)
    cursor, parts = RopeCursor(), []
    a, b = ids.index(IMG), ids.index(VID)  # chunks that start with a media run, after its vision_start
    for a, b in [(0, a), (a, b), (b, len(ids))]:
        assert is_frontier(ids, a, SPEC)
        part, cursor = rope_positions(ids[a:b], SPEC, images, videos, cursor)
        parts.append(part)
    np.testing.assert_array_equal(np.concatenate(parts, axis=1), whole)
    decoded, after = rope_positions([7, 8], SPEC, images, videos, cursor)
    np.testing.assert_array_equal(decoded, np.tile([nxt, nxt + 1], (3, 1)))
    assert after.next_position == nxt + 2


@pytest.mark.parametrize("kind", ["image", "video"])
def test_a_split_inside_media_is_rejected(kind):
    if kind == "image":
        ids, images, videos = text(2) + image((1, 4, 6)) + text(2), [(1, 4, 6)], []
    else:
        ids, images, videos = text(2) + video((2, 4, 4)) + text(2), [], [(2, 4, 4)]
    k = ids.index(IMG if kind == "image" else VID) + 2
    assert not is_frontier(ids, k, SPEC)
    with pytest.raises(ValueError, match="frontier inside media is never a recovery point"):
        rope_positions(ids[:k], SPEC, images, videos)  # the prefix ends inside the run
    cursor = RopeCursor(next_position=5, images=0, frames=0, last_token=ids[k - 1])
    with pytest.raises(ValueError, match="frontier inside media is never a recovery point"):
        rope_positions(ids[k:], SPEC, images, videos, cursor)  # the suffix starts inside it


def test_malformed_media_is_a_value_error():
    ids = text(2) + image((1, 4, 6)) + text(2)
    with pytest.raises(ValueError, match="has no grid"):
        rope_index(ids, SPEC)
    with pytest.raises(ValueError, match="does not match the grid"):
        rope_index(ids, SPEC, [(1, 4, 4)])
    with pytest.raises(ValueError, match="unused grids"):
        rope_index(ids, SPEC, [(1, 4, 6), (1, 4, 6)])
    with pytest.raises(ValueError, match="does not follow vision_start"):
        rope_index(text(2) + [IMG] * 6, SPEC, [(1, 4, 6)])
    with pytest.raises(ValueError, match="not divisible"):
        rope_index(text(1) + [VS] + [IMG] * 6, SPEC, [(1, 3, 8)])


def test_vision_tokens_from_config():
    raw = {"image_token_id": IMG, "video_token_id": VID, "vision_start_token_id": VS,
           "vision_config": {"spatial_merge_size": 2}, "text_config": {}}
    assert VisionTokens.from_config(raw) == SPEC
    with pytest.raises(ConfigError, match="video_token_id"):
        VisionTokens.from_config({k: v for k, v in raw.items() if k != "video_token_id"})
