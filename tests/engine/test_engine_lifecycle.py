"""Cancel at every stage, pause by Replay, the capacity contract, bad requests."""
import numpy as np
import pytest

from engine_helpers import assert_idle_and_empty, make_engine, run_until_done
from ninfer_jax import SamplingParams
from ninfer_jax.engine.request import DECODE, PREFILL, QUEUED
from ninfer_jax.errors import QueueFullError, RequestError

GREEDY = SamplingParams(temperature=0, max_tokens=8)


@pytest.fixture(scope="module")
def engine(tiny_model):
    return make_engine(tiny_model, max_concurrency=2, chunk_size=32)


def _step_until(engine, predicate, limit=500):
    for _ in range(limit):
        if predicate():
            return
        engine.step()
        engine.check_integrity()
    raise AssertionError("state never reached")


@pytest.mark.parametrize("stage", [QUEUED, PREFILL, DECODE])
def test_cancel_at_every_stage_frees_everything(engine, stage):
    rng = np.random.default_rng(0)
    # Two long residents keep both lanes busy, so a third request stays queued.
    residents = [engine.submit(rng.integers(0, 1000, 150).tolist(), SamplingParams(temperature=0, max_tokens=30))
                 for _ in range(2)]
    victim = engine.submit(rng.integers(0, 1000, 100).tolist(), SamplingParams(temperature=0, max_tokens=30))
    if stage == QUEUED:
        engine.step()
        req = engine.core.by_id[victim.request_id]
        assert req.phase == QUEUED
    else:
        residents[0].cancel()
        residents[1].cancel()
        _step_until(engine, lambda: getattr(engine.core.by_id.get(victim.request_id), "phase", None) == stage)
        req = engine.core.by_id[victim.request_id]
        assert req.pages, "a resident must hold pages by now"
    victim.cancel()
    run_until_done(engine, residents + [victim])
    for h in residents:
        h.result()
    result = victim.result()
    assert result.finish_reason == "cancelled"
    assert_idle_and_empty(engine)


def test_cancel_is_idempotent_and_after_finish_harmless(engine):
    h = engine.submit([1, 2, 3], GREEDY)
    run_until_done(engine, [h])
    h.cancel()
    h.cancel()
    engine.step()
    assert h.result().finish_reason == "length"
    assert_idle_and_empty(engine)


@pytest.mark.parametrize("route", ["replay", "snapshot"])
def test_pause_under_pressure_keeps_outputs(tiny_model, route):
    """With Main KV at the CFG-6 minimum two long requests cannot co-reside: the younger is
    paused (by Replay: its binding dropped; by Snapshot: its content copied to Host) and
    resumed; outputs equal each run alone."""
    engine = make_engine(tiny_model, max_concurrency=2, max_context=256, kv_capacity=256, chunk_size=64,
                         pause_route=route)
    assert engine.program.capacity.kv_pages == 4
    rng = np.random.default_rng(5)
    work = [(rng.integers(0, 1000, 100).tolist(), SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)),
            (rng.integers(0, 1000, 90).tolist(), SamplingParams(temperature=0.8, seed=11, max_tokens=60, ignore_eos=True))]
    handles = [engine.submit(p, sp) for p, sp in work]
    run_until_done(engine, handles)
    stats = engine.stats()
    assert stats[f"pauses_{route}"] >= 1 and stats[f"resumes_{route}"] >= 1
    if route == "replay":
        assert stats["replay_tokens"] > 0
    else:
        assert stats["snapshot_bytes"] > 0 and stats["h2d_bytes"] > 0
    for (p, sp), h in zip(work, handles):
        engine.clear_cache()
        alone = engine.submit(p, sp)
        run_until_done(engine, [alone], check_every_cycle=False)
        assert h.result().token_ids == alone.result().token_ids
    assert_idle_and_empty(engine)


def test_bad_requests_get_typed_errors_and_leave_others_alone(engine):
    good = engine.submit([5, 6, 7], GREEDY)
    for bad in ([], [1, 2, 5000], [-1], list(range(300)), "x" * 0):
        with pytest.raises(RequestError):
            engine.submit(bad, GREEDY)
    with pytest.raises(RequestError):
        engine.submit([1, 2], SamplingParams(temperature=-1))
    with pytest.raises(RequestError):
        engine.submit([1, 2], SamplingParams(top_p=0))
    with pytest.raises(RequestError):
        engine.submit([1, 2], SamplingParams(max_tokens=0))
    run_until_done(engine, [good])
    assert good.result().finish_reason == "length" and len(good.result().token_ids) == 8
    assert_idle_and_empty(engine)


def test_queue_limit(tiny_model):
    engine = make_engine(tiny_model, max_queue=3)
    handles = [engine.submit([1, 2], GREEDY) for _ in range(3)]
    with pytest.raises(QueueFullError):
        engine.submit([1, 2], GREEDY)
    run_until_done(engine, handles)
    assert_idle_and_empty(engine)


def test_stop_strings_and_eos(engine, tiny_model):
    """A stop string found in the output ends the request; its text stops before it."""
    probe = engine.submit([10, 20, 30], SamplingParams(temperature=0, max_tokens=12))
    run_until_done(engine, [probe])
    text = probe.result().text
    stop = text[3:5] if len(text) >= 5 else None
    if stop:
        h = engine.submit([10, 20, 30], SamplingParams(temperature=0, max_tokens=12, stop=(stop,)))
        run_until_done(engine, [h])
        r = h.result()
        assert r.finish_reason == "stop" and r.text == text[:text.find(stop)]
    eos = tiny_model.config.eos_token_id[0]
    forced = engine.submit([10, 20, 30], SamplingParams(temperature=0, max_tokens=12,
                                                        stop_token_ids=(probe.result().token_ids[2],)))
    run_until_done(engine, [forced])
    assert forced.result().finish_reason == "stop" and len(forced.result().token_ids) == 3
    assert eos in engine.core.make_request([1], GREEDY, None, lambda r: None).stop_ids


def test_a_request_id_queued_in_the_inbox_is_not_taken_twice(engine):
    """Issue 36: two submits with one request_id before the engine thread took the first in:
    the second is refused at submission; once the first ends the id is free again, and the
    counters add up (submitted = finished + cancelled + failed)."""
    before = engine.stats()
    sp = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    first = engine.submit([1, 2, 3], sp, request_id="same")
    with pytest.raises(RequestError, match="already in use"):
        engine.submit([4, 5], sp, request_id="same")
    run_until_done(engine, [first])
    again = engine.submit([4, 5], sp, request_id="same")
    again.cancel()
    run_until_done(engine, [again])
    after = engine.stats()
    delta = {k: after[k] - before[k] for k in ("requests_submitted", "requests_finished", "requests_cancelled",
                                               "requests_failed")}
    assert delta == {"requests_submitted": 2, "requests_finished": 1, "requests_cancelled": 1, "requests_failed": 0}
    assert_idle_and_empty(engine)
