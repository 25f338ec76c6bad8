"""Doctrine 1 end to end: a request served from any recovery source — E, typed R, recovery
point C, anchor, shared entry, Host copy — produces exactly the tokens of a cold run on a fresh
engine, greedy and seeded; integrity after every cycle."""
import numpy as np
import pytest

from engine_helpers import HOST, assert_idle_and_empty, make_engine, run_until_done
from ninfer_jax import ContextCacheConfig, SamplingParams

SAMPLINGS = {"greedy": SamplingParams(temperature=0, max_tokens=10, ignore_eos=True),
             "seeded": SamplingParams(temperature=0.9, top_p=0.95, seed=1234, max_tokens=10, ignore_eos=True)}


@pytest.fixture(scope="module")
def cold(tiny_model):
    """A fresh engine with the cache off: the ground truth every reuse is compared with."""
    return make_engine(tiny_model, max_context=512, context_cache=ContextCacheConfig(
        host_capacity_bytes=1 << 20, enabled=False))


@pytest.fixture(scope="module")
def warm(tiny_model):
    return make_engine(tiny_model, max_context=512)


def _run(engine, submit):
    h = submit(engine)
    run_until_done(engine, [h])
    return h.result()


def _cold_tokens(cold, submit):
    r = _run(cold, submit)
    assert r.usage.cached_tokens == 0
    return r.token_ids


def _check(warm, cold, submit, expect_cached):
    r = _run(warm, submit)
    assert r.usage.cached_tokens == expect_cached, (r.usage, expect_cached)
    assert r.token_ids == _cold_tokens(cold, submit)
    return r


@pytest.mark.parametrize("mode", SAMPLINGS)
def test_source_e_generation_end(warm, cold, mode):
    sp = SAMPLINGS[mode]
    rng = np.random.default_rng(10)
    p1 = rng.integers(0, 1000, 70).tolist()
    first = _run(warm, lambda e: e.submit(p1, sp))
    p2 = p1 + list(first.token_ids) + rng.integers(0, 1000, 9).tolist()
    # E sits at the execution frontier: prompt + output minus the last sampled token (CKP-2).
    _check(warm, cold, lambda e: e.submit(p2, sp), len(p1) + len(first.token_ids) - 1)
    assert_idle_and_empty(warm)


@pytest.mark.parametrize("mode", SAMPLINGS)
def test_source_recovery_point_c(warm, cold, mode):
    """A chat ending in a user message: the frontend keeps C (pure template closing before R);
    the retry reuses up to C and recomputes the closing."""
    sp = SAMPLINGS[mode]
    msgs = [{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": "Name a colour."}]
    rendered = warm._frontend().render_chat(msgs)
    assert rendered.recovery_position.kind.value == "C"
    _run(warm, lambda e: e.submit_chat(msgs, sampling=sp))
    _check(warm, cold, lambda e: e.submit_chat(msgs, sampling=sp), rendered.recovery_position.frontier)
    assert_idle_and_empty(warm)


@pytest.mark.parametrize("mode", SAMPLINGS)
def test_source_typed_r_after_a_tool_message(warm, cold, mode):
    sp = SAMPLINGS[mode]
    msgs = [{"role": "user", "content": "What is 6*7?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "calc", "arguments": {"expr": "6*7"}}}]},
            {"role": "tool", "content": "42"}]
    rendered = warm._frontend().render_chat(msgs)
    assert rendered.recovery_position.kind.value == "R"
    _run(warm, lambda e: e.submit_chat(msgs, sampling=sp))
    _check(warm, cold, lambda e: e.submit_chat(msgs, sampling=sp), rendered.recovery_position.frontier)
    assert_idle_and_empty(warm)


@pytest.mark.parametrize("mode", SAMPLINGS)
def test_source_anchor(warm, cold, mode):
    sp = SAMPLINGS[mode]
    rng = np.random.default_rng(11)
    base = rng.integers(0, 1000, 90).tolist()
    _run(warm, lambda e: e.submit(base, sp, anchors=[40]))
    other = base[:40] + rng.integers(0, 1000, 30).tolist()
    _check(warm, cold, lambda e: e.submit(other, sp), 40)
    assert_idle_and_empty(warm)


@pytest.mark.parametrize("mode", SAMPLINGS)
def test_source_shared_entry(warm, cold, mode):
    """An explicit marker at the end of the system message makes a shared entry; another
    conversation with the same system prompt forks from it."""
    sp = SAMPLINGS[mode]
    system = {"role": "system", "content": "You are a careful assistant for a shop that sells tea."}
    a = [system, {"role": "user", "content": "Which tea is green?"}]
    b = [system, {"role": "user", "content": "Do you ship abroad?"}]
    marker = [{"message": 0}]
    rendered = warm._frontend().render_chat(a, cache_markers=marker)
    frontier = min(m.frontier for m in rendered.markers)
    _run(warm, lambda e: e.submit_chat(a, cache_markers=marker, sampling=sp))
    r = _check(warm, cold, lambda e: e.submit_chat(b, cache_markers=marker, sampling=sp), frontier)
    assert r.usage.cached_tokens > 0
    assert_idle_and_empty(warm)


@pytest.mark.parametrize("mode", SAMPLINGS)
def test_source_host_copy(tiny_model, cold, mode):
    """With no spare Device StateImage slot, a capture goes to the Host arena; the next request
    adopts it through an H2D copy and still produces the cold run's tokens."""
    sp = SAMPLINGS[mode]
    engine = make_engine(tiny_model, max_context=512, max_concurrency=1,
                         context_cache=ContextCacheConfig(device_state_slots=0, host_capacity_bytes=4 << 20))
    rng = np.random.default_rng(12)
    p1 = rng.integers(0, 1000, 50).tolist()
    _run(engine, lambda e: e.submit(p1, sp))
    stats = engine.stats()
    assert stats["d2h_bytes"] > 0, "the StateImage was expected on the Host arena"
    p2 = p1 + rng.integers(0, 1000, 20).tolist()
    r = _run(engine, lambda e: e.submit(p2, sp))
    assert r.usage.cached_tokens == len(p1)
    assert engine.stats()["h2d_bytes"] > 0
    assert r.token_ids == _cold_tokens(cold, lambda e: e.submit(p2, sp))
    assert_idle_and_empty(engine)


def test_agent_conversation_with_dropped_reasoning_reuses_every_turn(warm, cold):
    """The template drops past reasoning, so a new prompt is not an extension of the last E;
    every turn still reuses up to the right typed R (cached > 0, as large as the rules allow:
    the previous turn's recovery frontier)."""
    sp = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    msgs = [{"role": "system", "content": "You are an agent with a calculator."},
            {"role": "user", "content": "Add 2 and 3, then double it."}]
    previous = None
    frontend = warm._frontend()
    for turn in range(4):
        rendered = frontend.render_chat(msgs)
        r = _run(warm, lambda e: e.submit_chat(msgs, sampling=sp, session="agent"))
        if previous is not None:
            # Reuse reaches at least the previous turn's recovery point (still a prefix).
            assert r.usage.cached_tokens >= previous, (turn, r.usage, previous)
            assert r.token_ids == _cold_tokens(cold, lambda e: e.submit_chat(msgs, sampling=sp))
        previous = rendered.recovery_position.frontier
        msgs = msgs + [
            {"role": "assistant", "content": "", "reasoning_content": f"step {turn}: I should call the tool.",
             "tool_calls": [{"type": "function", "function": {"name": "calc", "arguments": {"expr": f"{turn}+1"}}}]},
            {"role": "tool", "content": str(turn + 1)}]
    assert warm.stats()["cache_hits"] >= 3
    assert_idle_and_empty(warm)


def test_wait1_a_queued_request_keeps_its_source_until_bound_and_a_cancel_releases_it(tiny_model, cold):
    """WAIT-1/3/4: with every lane busy, the queued request holds a waiting reference on its
    chosen source; the bind hands it over (same tokens as cold); a cancelled waiter releases it."""
    engine = make_engine(tiny_model, max_context=512, max_concurrency=1)
    sp = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    rng = np.random.default_rng(13)
    base = rng.integers(0, 1000, 80).tolist()
    _run(engine, lambda e: e.submit(base, sp))
    busy = engine.submit(rng.integers(0, 1000, 40).tolist(), SamplingParams(temperature=0, max_tokens=20))
    follow = base + rng.integers(0, 1000, 10).tolist()
    queued = engine.submit(follow, sp)
    doomed = engine.submit(base + [1, 2, 3], sp)
    for _ in range(3):
        engine.step()
        engine.check_integrity()
    waiters = engine.core.reuse.cache.waiters
    tickets = {r.request_id: r.ticket for r in engine.core.fresh}
    assert tickets[queued.request_id] in waiters and tickets[doomed.request_id] in waiters
    doomed.cancel()
    run_until_done(engine, [busy, queued, doomed])
    assert doomed.result().finish_reason == "cancelled"
    assert not engine.core.reuse.cache.waiters
    r = queued.result()
    assert r.usage.cached_tokens >= len(base) - 1
    assert r.token_ids == _cold_tokens(cold, lambda e: e.submit(follow, sp))
    assert engine.stats()["waits"] >= 2
    assert_idle_and_empty(engine)
