"""Images and videos through the engine (issue 34): raw prompts holding the placeholder runs, on the
tiny random Qwen3.5 VL checkpoint (tests/tiny_vl.py), float32.

- Greedy tokens and every logprob (chosen and top-k) equal the whole-sequence reference
  `Model.forward` with the same media (itself within 1e-4 of transformers,
  tests/model/test_multimodal_forward.py), with prefill chunks that end inside the media runs.
- Reuse never changes a token (doctrine 1, CKP-4, SH-7): the same image in turn 2 is a hit
  covering the image; a changed image of the same size misses at the image's first token; both
  equal a cold engine.
- Snapshot and Replay pauses with media in flight, a pause inside a media run (Replay from the
  last legal point), and a media cache too small to keep anything (every item re-encoded,
  PAUSE-6, `vision_reencodes`) equal the uninterrupted run.
- A text request batched with a media request gets its own tokens (the media executables run
  every row of a VL engine).
- Bad input is a typed error before any work, and nothing leaks (`check_integrity`).
"""
from __future__ import annotations

import numpy as np
import pytest

from engine_helpers import assert_idle_and_empty, make_engine, run_until_done
from media_helpers import check_against_forward
from ninfer_jax import ContextCacheConfig, Engine, EngineConfig, SamplingParams
from ninfer_jax.compile_cache import CompileCounter
from ninfer_jax.config import MediaConfig
from ninfer_jax.engine.request import PAUSED, PREFILL
from ninfer_jax.errors import RequestError
from ninfer_jax.frontend.errors import MediaNotSupportedError
from ninfer_jax.model import vision as V
from ninfer_jax.model.model import load_model
from ninfer_jax.program.program import Program

pytest.importorskip("transformers")
pytest.importorskip("torch")
from tiny_vl import IMG, VE, VID, VS, add_random_mtp, build, image_run, pixels, text_ids, video_run  # noqa: E402

PLACEHOLDERS = (IMG, VID, VS, VE)  # a generated one would make the reference prompt invalid: stop there
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, stop_token_ids=PLACEHOLDERS, logprobs=3)
GRID = (1, 8, 8)  # 16 merged tokens: chunks of 8 end inside the run


@pytest.fixture(scope="module")
def vl(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("qwen3_5_vl"))
    build("qwen3_5").save_pretrained(folder, safe_serialization=True)
    return folder, load_model(folder, dtype="float32")


def _engine(vl, **overrides):
    folder, model = vl
    cfg = EngineConfig(**{"model": folder, "max_concurrency": 2, "max_context": 256, "chunk_size": 8,
                          "progress": False, "context_cache": ContextCacheConfig(host_capacity_bytes=4 << 20),
                          **overrides})
    return Engine(cfg, program=Program(cfg, model=model), start=False)


def _prompt(seed: int, image_seed: int = 1):
    rng = np.random.default_rng(seed)
    ids = text_ids(rng, 11) + image_run(GRID) + text_ids(rng, 6)
    return ids, [(pixels(GRID, image_seed), GRID)]


def _run(engine, prompt, sp=GREEDY, **media):
    h = engine.submit(prompt, sp, **media)
    run_until_done(engine, [h])
    got = h.result()
    assert got.finish_reason in ("length", "stop"), got.error
    return got


@pytest.mark.parametrize("what", ["two_images", "video"])
def test_greedy_tokens_and_logprobs_equal_the_reference(vl, what):
    _, model = vl
    rng = np.random.default_rng(7)
    if what == "two_images":
        a, b = (1, 4, 4), (1, 6, 2)
        prompt = text_ids(rng, 5) + image_run(a) + text_ids(rng, 3) + image_run(b) + text_ids(rng, 4)
        images, videos = [(pixels(a, 2), a), (pixels(b, 3), b)], []
    else:
        g = (2, 4, 4)
        prompt = text_ids(rng, 4) + video_run(g, rng) + text_ids(rng, 3)
        images, videos = [], [(pixels(g, 4), g)]
    engine = _engine(vl)
    got = _run(engine, prompt, images=images, videos=videos)
    assert len(got.token_ids) >= 2
    check_against_forward(model, prompt, images, videos, got)
    stats = engine.stats()
    assert stats["vision_encodes"] == len(images) + len(videos)
    assert_idle_and_empty(engine)


def test_same_image_is_reused_a_changed_one_is_not(vl):
    """Turn 2 with the same image is a hit covering it; with another image of the same size it
    misses at the image's first token; each equals a cold engine's tokens."""
    _, model = vl
    engine = _engine(vl)
    cold = _engine(vl, context_cache=ContextCacheConfig(enabled=False, host_capacity_bytes=0))
    prompt, images = _prompt(1)
    first = _run(engine, prompt, images=images)
    start = prompt.index(VS) + 1
    end = start + GRID[1] * GRID[2] // 4
    turn2 = prompt + list(first.token_ids) + text_ids(np.random.default_rng(5), 7)
    same = _run(engine, turn2, images=images)
    assert same.usage.cached_tokens >= end, same.usage
    assert same.token_ids == _run(cold, turn2, images=images).token_ids
    other = [(pixels(GRID, 99), GRID)]
    changed = _run(engine, turn2, images=other)
    assert changed.usage.cached_tokens <= start, changed.usage
    assert changed.token_ids == _run(cold, turn2, images=other).token_ids
    check_against_forward(model, turn2, other, [], changed)
    stats = engine.stats()
    assert stats["media_cache_hits"] >= 1 and stats["vision_encodes"] == 2, stats
    assert_idle_and_empty(engine)


def test_warm_up_compiles_the_tower_buckets_so_no_image_compiles(vl):
    """Warm-up compiles the vision tower's buckets that an image within the limits can take
    (max_context 256: at most 255 tokens, buckets of 64, 128 and 256 tokens), through the counted
    compile path; then images of each bucket run with no compilation at all on the request path
    (neither a tower bucket nor an eager op: the chunk's media inputs are built on the Host)."""
    engine = _engine(vl)
    program = engine.program
    assert program.tower_buckets() == [256, 512, 1024]  # laid-out patch rows, 4 per token
    compiled, traces = program.compilations, V.TRACES["count"]
    for rows in program.tower_buckets():  # compiled at warm-up (by this engine or an earlier one)
        program.steps.tower(rows)
    assert program.compilations == compiled
    rng = np.random.default_rng(3)
    for i, grid in enumerate([(1, 8, 8), (1, 20, 24), (1, 30, 30)]):  # 16, 120 and 225 tokens
        prompt = text_ids(rng, 5) + image_run(grid) + text_ids(rng, 3)
        with CompileCounter() as counter:
            _run(engine, prompt, images=[(pixels(grid, 10 + i), grid)])
        assert counter.requests == 0, (grid, counter.as_dict())
    assert (program.compilations, V.TRACES["count"]) == (compiled, traces)
    assert engine.stats()["vision_encodes"] == 3
    assert_idle_and_empty(engine)


def _reach_inside_media(engine, rid, start, end):
    for _ in range(200):
        r = engine.core.by_id.get(rid)
        if r is not None and r.phase == PREFILL and start < r.fed < end:
            return r
        engine.step()
        engine.check_integrity()
    raise AssertionError("the request never stopped inside its image")


@pytest.mark.parametrize("route,cache_bytes", [("snapshot", None), ("replay", 0)])
def test_pauses_with_media_in_flight_equal_uninterrupted(vl, route, cache_bytes):
    """Two media requests and a text one, C=2; the media request is paused with its chunk frontier
    inside its image (always Replay there: no checkpoint inside media, SH-7), resumed, then
    paused again in decode by `route`. Media cache 0: every chunk encodes again, and the Replay's
    encodings of an item it had encoded are counted as re-encodes (PAUSE-6)."""
    media = MediaConfig() if cache_bytes is None else MediaConfig(cache_bytes=cache_bytes)
    engine = _engine(vl, max_concurrency=2, media=media)
    alone = _engine(vl, max_concurrency=1)
    work = [(*_prompt(11, 1), GREEDY), (*_prompt(12, 2), SamplingParams(temperature=0.8, seed=3, max_tokens=8,
                                                                          ignore_eos=True, stop_token_ids=PLACEHOLDERS)),
            (text_ids(np.random.default_rng(13), 30), None, GREEDY)]
    want = [_run(alone, p, sp, **({"images": im} if im else {})).token_ids for p, im, sp in work]
    handles = [engine.submit(p, sp, **({"images": im} if im else {})) for p, im, sp in work]
    victim = handles[0].request_id
    prompt = work[0][0]
    start = prompt.index(VS) + 1
    req = _reach_inside_media(engine, victim, start, start + 16)
    before = engine.stats()
    assert engine.core.pause(victim, route)
    assert req.phase == PAUSED and req.paused_route == "replay"  # never a snapshot inside media
    engine.check_integrity()
    for _ in range(300):
        engine.step()
        engine.check_integrity()
        if req.phase == "decode" and len(req.output) >= 2:
            break
    assert engine.core.pause(victim, route)
    run_until_done(engine, handles)
    for h, w in zip(handles, want):
        assert h.result().token_ids == w
    stats = engine.stats()
    assert stats["resumes_replay"] > before["resumes_replay"]
    if route == "snapshot":
        assert stats["resumes_snapshot"] >= 1
    if cache_bytes == 0:
        assert stats["vision_reencodes"] >= 1 and stats["media_cache_bytes"] == 0
    assert_idle_and_empty(engine)


def test_bad_media_is_refused_before_any_work(vl, tiny_model):
    engine = _engine(vl)
    prompt, images = _prompt(3)
    with pytest.raises(RequestError, match="placeholder"):
        engine.submit(prompt, GREEDY, images=images + images)  # two images, one run
    with pytest.raises(RequestError, match="pixel_values"):
        engine.submit(prompt, GREEDY, images=[(np.zeros((3, 5), np.float32), GRID)])
    with pytest.raises(RequestError, match="inside a media item"):
        engine.submit(prompt, GREEDY, images=images, anchors=[prompt.index(VS) + 3])
    text_only = make_engine(tiny_model)
    with pytest.raises(MediaNotSupportedError, match="text-only"):
        text_only.submit([1, 2, 3], GREEDY, images=images)
    assert text_only.stats()["requests_submitted"] == 0
    got = _run(engine, prompt, images=images)  # the engine goes on serving
    assert got.token_ids
    assert engine.stats()["requests_submitted"] == 1
    assert_idle_and_empty(engine)


@pytest.fixture(scope="module")
def vl_mtp(tmp_path_factory):
    """The tiny VL checkpoint with a random MTP head (its drafts are mostly rejected: every
    rejection path, the commit at the first position)."""
    folder = tmp_path_factory.mktemp("qwen3_5_vl_mtp")
    build("qwen3_5").save_pretrained(str(folder), safe_serialization=True)
    add_random_mtp(folder)
    return str(folder), load_model(str(folder), dtype="float32")


def test_mtp_with_media_equals_mtp_off(vl_mtp):
    """Speculative decoding (k=2, Verify units with the rows' rotary offsets, MTP K/V at the
    media's positions) gives the tokens of decoding without drafts: two image requests (one
    sampled) and a text one, C=2, the first paused inside its image (Replay there) and again in
    decode by Snapshot."""
    route = "snapshot"
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)  # compared with itself: no stops
    work = [(*_prompt(21, 1), greedy), (*_prompt(22, 2), SamplingParams(temperature=0.8, seed=5, max_tokens=8,
                                                                          ignore_eos=True)),
            (text_ids(np.random.default_rng(23), 30), None, greedy)]
    plain = _engine(vl_mtp, max_concurrency=1)
    want = [_run(plain, p, sp, **({"images": im} if im else {})).token_ids for p, im, sp in work]
    engine = _engine(vl_mtp, speculative_tokens=2)
    handles = [engine.submit(p, sp, **({"images": im} if im else {})) for p, im, sp in work]
    start = work[0][0].index(VS) + 1
    req = _reach_inside_media(engine, handles[0].request_id, start, start + 16)
    assert engine.core.pause(handles[0].request_id, route) and req.paused_route == "replay"
    for _ in range(300):
        engine.step()
        engine.check_integrity()
        if req.phase == "decode" and len(req.output) >= 2:
            break
    assert engine.core.pause(handles[0].request_id, route), (req.phase, req.output, want[0])
    run_until_done(engine, handles)
    assert [h.result().token_ids for h in handles] == want
    assert engine.stats()["spec_verify_units"] > 0
    assert_idle_and_empty(engine)


def test_dflash_with_media_equals_plain(vl, tmp_path):
    """A DFlash drafter on the VL checkpoint (issue 35; a random drafter reading layers 0 and
    3, k = 3): image requests (one sampled) and a text one at C = 2 give the tokens of decoding
    without drafts, the first paused inside its image (Replay there) and again in decode by
    Snapshot. The Verify units take the rows' rotary offsets; the drafter's context sits at
    cache positions, written by prefill chunks that carry the image."""
    from test_engine_dflash import write_drafter

    cfg = vl[1].config
    drafter = write_drafter(tmp_path / "dflash", hidden=cfg.hidden_size, vocab=cfg.vocab_size,
                            layers=(0, len(cfg.layer_types) - 1), block=4)
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    work = [(*_prompt(31, 1), greedy), (*_prompt(32, 2), SamplingParams(temperature=0.8, seed=5, max_tokens=8,
                                                                          ignore_eos=True)),
            (text_ids(np.random.default_rng(33), 30), None, greedy)]
    plain = _engine(vl, max_concurrency=1)
    want = [_run(plain, p, sp, **({"images": im} if im else {})).token_ids for p, im, sp in work]
    engine = _engine(vl, speculative_tokens=3, speculative_method="dflash", draft_model=drafter)
    assert engine.program.spec_pool == "backend_kv:dflash"
    handles = [engine.submit(p, sp, **({"images": im} if im else {})) for p, im, sp in work]
    start = work[0][0].index(VS) + 1
    req = _reach_inside_media(engine, handles[0].request_id, start, start + 16)
    assert engine.core.pause(handles[0].request_id, "snapshot") and req.paused_route == "replay"
    for _ in range(300):
        engine.step()
        engine.check_integrity()
        if req.phase == "decode" and len(req.output) >= 2:
            break
    assert engine.core.pause(handles[0].request_id, "snapshot"), (req.phase, req.output, want[0])
    run_until_done(engine, handles)
    assert [h.result().token_ids for h in handles] == want
    assert engine.stats()["spec_verify_units"] > 0
    assert_idle_and_empty(engine)


PRESSURE = [  # (Main KV pages above the CFG-6 minimum, spare StateImage slots, Host bytes, media cache bytes)
    pytest.param(1, 0, 0, 0, id="kv+1-slots0-host0-mediacache0"),
    pytest.param(2, 2, 1 << 16, None, id="kv+2-slots2-host64k"),
]


@pytest.mark.parametrize("extra_pages, slots, host, media_bytes", PRESSURE)
def test_media_under_pressure_with_cancels_and_pauses_equals_cold(vl, extra_pages, slots, host, media_bytes):
    """Main KV just above its minimum, 0 or 2 spare StateImage slots, no or a tiny Host arena, a
    media cache that keeps nothing or the default; ten requests — turns that repeat an image
    (reuse), other images, a video, text — greedy and seeded, C = 3, with cancels and Snapshot /
    Replay pauses at cycles that fall in every phase. Integrity after every cycle; every request
    that was not cancelled equals a cold engine's run of it alone."""
    from ledger.capacity import kv_page_range

    rng = np.random.default_rng(41)
    g = (2, 4, 4)
    base, images = _prompt(21, 1)
    work = []
    for i in range(10):
        sp = (GREEDY if i % 2 == 0 else
              SamplingParams(temperature=0.9, seed=i, max_tokens=8, ignore_eos=True, stop_token_ids=PLACEHOLDERS))
        kind = i % 4
        if kind == 0:  # the same image, each turn extending the last: a hit covering it
            base = base + text_ids(rng, 4 + i)
            work.append((base, {"images": images}, sp))
        elif kind == 1:
            p, im = _prompt(30 + i, 50 + i)
            work.append((p, {"images": im}, sp))
        elif kind == 2:
            work.append((text_ids(rng, 6) + video_run(g, rng) + text_ids(rng, 5), {"videos": [(pixels(g, 70 + i), g)]}, sp))
        else:
            work.append((text_ids(rng, 40 + i), {}, sp))
    lo, _ = kv_page_range(256, 3)
    media = MediaConfig() if media_bytes is None else MediaConfig(cache_bytes=media_bytes)
    engine = _engine(vl, max_concurrency=3, kv_capacity=(lo + extra_pages) * 64, media=media,
                     context_cache=ContextCacheConfig(device_state_slots=slots, host_capacity_bytes=host))
    handles = [engine.submit(p, sp, **m) for p, m, sp in work[:5]]  # the rest later: turns after turns
    cancelled, paused, cycles = set(), 0, 0
    while len(handles) < len(work) or not all(h.done() for h in handles):
        engine.step()
        engine.check_integrity()
        cycles += 1
        if cycles == 40:
            handles += [engine.submit(p, sp, **m) for p, m, sp in work[5:]]
        live = [h for h in handles if not h.done() and h.request_id not in cancelled]
        if cycles in (2, 11, 29, 57) and live:  # queued, prefilling (inside media too), decoding
            victim = live[cycles % len(live)]
            victim.cancel()
            cancelled.add(victim.request_id)
        elif cycles % 7 == 3 and live:
            rid = live[cycles % len(live)].request_id
            paused += bool(engine.core.pause(rid, "snapshot" if cycles % 2 else "replay"))
        assert cycles < 5000
    engine.step()
    engine.check_integrity()
    cold = _engine(vl, max_concurrency=1, context_cache=ContextCacheConfig(enabled=False, host_capacity_bytes=0))
    finished = 0
    for (p, m, sp), h in zip(work, handles):
        got = h.result()
        if h.request_id in cancelled and got.finish_reason == "cancelled":
            continue
        assert got.finish_reason in ("length", "stop"), got.error
        assert got.token_ids == _run(cold, p, sp, **m).token_ids, (h.request_id, got.usage)
        finished += 1
    stats = engine.stats()
    assert finished >= 6 and paused >= 2, (finished, paused)
    assert stats["cached_tokens"] > 0 or not slots  # with spare slots a later turn reuses its image
    assert stats["vision_encodes"] >= 3 and stats["resumes_replay"] + stats["resumes_snapshot"] >= 1
    assert_idle_and_empty(engine)
