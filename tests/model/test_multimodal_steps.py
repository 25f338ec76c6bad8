"""Images and videos through the paged steps: `CompiledSteps.prefill` with the tower's tokens and
M-RoPE positions (`media_inputs.MediaPrompt`), then `CompiledSteps.decode` with each token's
rotary position, against the whole-sequence reference `Model.forward` with the same media.

The tiny random Qwen3_5ForConditionalGeneration / MoE checkpoints of test_multimodal_forward.py
(its builders and prompts), float32: every prefill position's logits and each decode step's
logits within 1e-5 of `Model.forward` (its rows on the final sequence: causal, so those of the
growing one), with chunks that end inside the placeholder runs. A text-only prompt through the
media calls gives the text calls' bits.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from ninfer_jax.model.compiled import CompiledSteps
from ninfer_jax.model.media_inputs import MediaPrompt, text_chunk
from ninfer_jax.model.model import load_model
from ninfer_jax.model.pools import StepArgumentError, init_pools
from ninfer_jax.model.rope_index import is_frontier, rope_index

pytest.importorskip("transformers")
pytest.importorskip("torch")
from tiny_vl import IMG, TEXT, build, media_case, text_ids  # noqa: E402  (after the skips)

TOL = 1e-5
DECODE = 4
TABLE = np.array([[2]], np.int32)  # one page (64 tokens) per request, not page 0
SLOT = np.array([1], np.int32)


@pytest.fixture(scope="module", params=sorted(TEXT))
def vl(request, tmp_path_factory):
    """(kind, our Model, its CompiledSteps) for each wrapper type."""
    folder = str(tmp_path_factory.mktemp(request.param))
    build(request.param).save_pretrained(folder, safe_serialization=True)
    model = load_model(folder, dtype="float32")
    return request.param, model, CompiledSteps(model, progress=False)


def _pools(model):
    return init_pools(model.config, 3, 2, model.dtype)


def _greedy(logits) -> int:
    """Argmax over the text ids: a generated placeholder id would make the reference's prompt
    (its placeholders must match the media) invalid."""
    return int(np.argmax(np.asarray(logits)[:IMG]))


def _prefill(steps, kv, state, ids, chunk, media=None):
    """`ids` in chunks of `chunk` (each padded to the bucket), with `media` (a MediaPrompt, or
    "text": the media calls with text inputs) or None (the text calls); logits `[n, V]`."""
    out = []
    for s in range(0, len(ids), chunk):
        e = min(len(ids), s + chunk)
        tokens = np.zeros((1, chunk), np.int32)
        tokens[0, :e - s] = ids[s:e]
        kw = {}
        if media is not None:
            m = (text_chunk(s, e - s, chunk, steps.model.config.hidden_size, steps.model.dtype) if media == "text"
                 else media.chunk(s, e, chunk))
            kw = dict(embeds=m.embeds[None], embed_rows=m.embed_rows[None], rope=m.rope[:, None])
        logits, _, kv, state = steps.prefill(kv, state, tokens, np.array([s], np.int32), np.array([e - s], np.int32),
                                             TABLE, SLOT, all_logits=True, **kw)
        out.append(np.asarray(logits[0, :e - s]))
    return np.concatenate(out), kv, state


def _decode(steps, kv, state, token, position, rope=None):
    kw = {} if rope is None else {"rope": np.array([rope], np.int32)}
    logits, _, kv, state = steps.decode(kv, state, np.array([token], np.int32), np.array([position], np.int32),
                                        TABLE, SLOT, **kw)
    return np.asarray(logits[0]), kv, state


# Both chunk widths cut through a placeholder run; each case runs one (a width is a compilation).
@pytest.mark.parametrize("case,chunk", [("image", 5), ("image_and_video", 8)])
def test_chunked_prefill_and_decode_equal_forward(vl, case, chunk):
    kind, model, steps = vl
    ids, images, videos = media_case(case)
    cuts = [s for s in range(chunk, len(ids), chunk) if not is_frontier(ids, s, model.vision.tokens)]
    assert cuts, "some chunk must end inside a placeholder run"
    mp = MediaPrompt.prepare(model, ids, images, videos)
    assert mp.delta < 0  # the text after the media continues below the prompt's length
    kv, state = _pools(model)
    got, kv, state = _prefill(steps, kv, state, ids, chunk, mp)
    seq, rows = list(ids), [got]
    for _ in range(DECODE):
        seq.append(_greedy(rows[-1][-1]))
        pos = len(seq) - 1
        last, kv, state = _decode(steps, kv, state, seq[-1], pos, mp.decode_rope(pos))
        rows.append(last[None])
    # The reference is causal: its rows on the whole sequence are those of the growing one.
    ref = np.asarray(model.forward(seq, images=images, videos=videos))
    worst = float(np.abs(np.concatenate(rows) - ref).max())
    print(f"{kind} {case} chunk {chunk} (cuts inside media at {cuts}): {len(ids)} + {DECODE} tokens, "
          f"max abs diff {worst:.3g}")
    assert worst <= TOL


def test_text_prompt_through_the_media_calls_gives_the_text_bits(vl):
    """The media executables on text inputs (no embedded rows, rope = cache positions on all
    three axes) give the text executables' bits, prefill and decode."""
    kind, model, steps = vl
    ids = text_ids(np.random.default_rng(5), 19)
    out = {}
    for how in (None, "text"):
        kv, state = _pools(model)
        logits, kv, state = _prefill(steps, kv, state, ids, 8, how)
        rows, seq = [logits], list(ids)
        for _ in range(DECODE):
            seq.append(_greedy(rows[-1][-1]))
            pos = len(seq) - 1
            last, kv, state = _decode(steps, kv, state, seq[-1], pos, None if how is None else pos)
            rows.append(last[None])
        out[how] = np.concatenate(rows)
    np.testing.assert_array_equal(out["text"], out[None])
    kinds = {c.bucket[0] for c in steps.compilations}
    assert {"prefill", "decode", "prefill_media", "decode_media"} <= kinds, kinds
    diff = float(np.abs(out[None][:len(ids)] - np.asarray(model.forward(ids))).max())
    print(f"{kind} text through the media calls: bit-identical; text path vs forward {diff:.3g}")


def test_chunk_inputs(vl):
    """`MediaPrompt.chunk` slices `rope_index`'s positions and puts the tower's tokens in the
    placeholders' rows, images then videos; past the prompt it continues as text."""
    _, model, _ = vl
    ids, images, videos = media_case("image_and_video")
    mp = MediaPrompt.prepare(model, ids, images, videos)
    positions, next_position = rope_index(ids, model.vision.tokens, [images[0][1]], [videos[0][1]])
    np.testing.assert_array_equal(mp.rope, positions)
    assert mp.next_position == next_position and mp.delta == next_position - len(ids)
    n = len(ids)
    m = mp.chunk(n - 3, n + 2, 8)
    np.testing.assert_array_equal(m.rope[:, :3], positions[:, -3:])
    np.testing.assert_array_equal(m.rope[:, 3:5], np.broadcast_to(np.arange(next_position, next_position + 2), (3, 2)))
    assert not m.rope[:, 5:].any() and not m.embed_rows.any()
    whole = mp.chunk(0, n)
    placeholders = np.flatnonzero(whole.embed_rows)
    assert placeholders.size == mp.media.shape[0]
    np.testing.assert_array_equal(np.asarray(whole.embeds)[placeholders], np.asarray(mp.media))
    assert not np.asarray(whole.embeds)[~whole.embed_rows].any()
    assert mp.decode_rope(n) == next_position
    with pytest.raises(ValueError, match="inside the prompt"):
        mp.decode_rope(n - 1)


def test_media_arguments_are_checked(vl):
    _, model, steps = vl
    kv, state = _pools(model)
    tokens, one = np.zeros((1, 8), np.int32), np.array([1], np.int32)
    rows, rope = np.zeros((1, 8), bool), np.zeros((3, 1, 8), np.int32)
    embeds = np.zeros((1, 8, model.config.hidden_size), np.float32)
    with pytest.raises(StepArgumentError, match="together"):
        steps.prefill(kv, state, tokens, one, one, TABLE, SLOT, embeds=embeds, embed_rows=rows)
    with pytest.raises(StepArgumentError, match="rope"):
        steps.prefill(kv, state, tokens, one, one, TABLE, SLOT, embeds=embeds, embed_rows=rows, rope=rope[:, :, :4])
    with pytest.raises(StepArgumentError, match="embed_rows"):
        steps.prefill(kv, state, tokens, one, one, TABLE, SLOT, embeds=embeds, embed_rows=rows.astype(np.int32),
                      rope=rope)
    with pytest.raises(StepArgumentError, match="rope"):
        steps.decode(kv, state, one, one, TABLE, SLOT, rope=np.zeros(2, np.int32))
    assert isinstance(jnp.asarray(kv["k"][0]), jnp.ndarray)  # nothing ran: the pools were not donated
