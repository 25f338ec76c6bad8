"""SH-6 for raw prompts (engine/branch_points.py): where a pre-tokenised prompt leaves every
recently seen one becomes a shared save opportunity, so a system prompt every session shares is
a source without markers; outputs stay those of a cold engine."""
from __future__ import annotations

import pytest

from ninfer_jax import ContextCacheConfig, Engine, EngineConfig, SamplingParams
from ninfer_jax.engine.branch_points import KnownHistories
from ninfer_jax.sim import SimProgram

SYSTEM = [(13 * i + 1) % 997 for i in range(300)]  # 300 tokens: 4 whole 64-token blocks, then 44
SP = SamplingParams(temperature=0, max_tokens=3)


def _engine(branch_points: bool, **cache):
    cfg = EngineConfig(max_concurrency=1, max_context=1024, chunk_size=64, progress=False,
                       context_cache=ContextCacheConfig(host_capacity_bytes=1 << 20, branch_points=branch_points,
                                                        **cache))
    return Engine(cfg, program=SimProgram(cfg), start=False)


def _run(engine, prompt, **kw):
    h = engine.submit(prompt, SP, **kw)
    while not h.done():
        engine.step()
    return h.result()


def _user(i):
    return [500 + i] * 40


@pytest.mark.parametrize("on", [True, False])
def test_sh6_branch_point_saves_the_shared_system_prompt_of_raw_prompts(on):
    engine = _engine(on)
    try:
        first = _run(engine, SYSTEM + _user(0))
        second = _run(engine, SYSTEM + _user(1))  # leaves the first after 300 tokens: a branch at 256
        third = _run(engine, SYSTEM + _user(2))
        assert first.usage.cached_tokens == 0 and second.usage.cached_tokens == 0
        assert third.usage.cached_tokens == (256 if on else 0)
        assert engine.stats()["branch_points"] == (1 if on else 0)  # the third one's source covers it
        cold = _engine(False, enabled=False)
        try:
            assert _run(cold, SYSTEM + _user(2)).token_ids == third.token_ids
        finally:
            cold.close()
        engine.check_integrity()
    finally:
        engine.close()


def test_no_branch_point_inside_what_the_source_covers():
    """A next turn that extends the previous prompt and output binds at E; nothing is added."""
    engine = _engine(True)
    try:
        r1 = _run(engine, SYSTEM + _user(0))
        follow = list(r1.prompt_token_ids) + list(r1.token_ids) + [7] * 30
        r2 = _run(engine, follow)
        assert r2.usage.cached_tokens == len(r1.prompt_token_ids) + len(r1.token_ids) - 1
        assert engine.stats()["branch_points"] == 0
    finally:
        engine.close()


def test_known_histories_are_bounded_and_prefix_based():
    known = KnownHistories(capacity=5)
    known.remember(["a", "b", "c"])
    assert known.shared_blocks(["a", "b", "x"]) == 2 and known.shared_blocks(["x"]) == 0
    assert known.branch_point(["a", "b", "x"], 200, 0) == 128
    assert known.branch_point(["a", "b", "x"], 200, 128) is None  # the source already covers it
    assert known.branch_point(["a", "b", "c"], 192, 0) is None  # the prompt's end is P anyway
    known.remember(["a", "q", "r", "s"])  # 6 keys > 5: the least recently seen goes first
    assert len(known) == 5 and known.shared_blocks(["a", "b", "c"]) == 1


def _submit(engine, kind: str, i: int, sp, **kw):
    """Request i of the pressure test: a raw prompt, or a rendered chat of the same shape."""
    if kind == "raw":
        return engine.submit(SYSTEM + _user(i), sp, **kw)
    messages = [{"role": "system", "content": SYSTEM_TEXT}, {"role": "user", "content": f"Question {i}?"}]
    return engine.submit_chat(messages, sampling=sp, **kw)


@pytest.mark.parametrize("kind", ["raw", "rendered"])
@pytest.mark.parametrize("route", ["snapshot", "replay"])
def test_sh6_branch_points_and_forced_outputs_under_pressure_equal_cold(route, kind):
    """Main KV just above one max_context, no spare StateImage slot, a tiny Host arena; prompts
    (raw, or rendered chats) sharing a system prompt (branch points) and one forced output; a
    pause in prefill, another in decode, a cancel; integrity every cycle, outputs equal to an
    uncontended cold run."""
    cfg = EngineConfig(max_concurrency=2, max_context=512, chunk_size=64, kv_capacity=576, progress=False,
                       context_cache=ContextCacheConfig(host_capacity_bytes=4096, device_state_slots=0))
    engine = Engine(cfg, program=SimProgram(cfg), start=False)
    forced = [9, 8, 7, 6, 5, 4]
    sps = [SamplingParams(temperature=0, max_tokens=6, forced_output=forced if i == 1 else ()) for i in range(5)]
    try:
        handles = [_submit(engine, kind, i, sp, request_id=f"r{i}") for i, sp in enumerate(sps)]
        paused_prefill = paused_decode = cancelled = False
        for _ in range(5000):
            if all(h.done() for h in handles):
                break
            engine.step()
            engine.check_integrity()
            by_id = engine.core.by_id
            r2, r3 = by_id.get("r2"), by_id.get("r3")
            if not paused_prefill and r2 is not None and r2.phase == "prefill" and r2.fed >= 128:
                paused_prefill = engine.core.pause("r2", route)
            if not paused_decode and r3 is not None and r3.phase == "decode" and len(r3.output) == 2:
                paused_decode = engine.core.pause("r3", route)
            if not cancelled and by_id.get("r4") is not None and by_id["r4"].phase == "prefill":
                handles[4].cancel()
                cancelled = True
        assert paused_prefill and paused_decode and cancelled and all(h.done() for h in handles)
        results = [h.result() for h in handles]
        assert results[4].finish_reason == "cancelled"
        assert list(results[1].token_ids) == forced
        assert engine.stats()["branch_points"] >= 1
        cold = _engine(False, enabled=False)
        try:
            for i in range(4):
                h = _submit(cold, kind, i, sps[i])
                while not h.done():
                    cold.step()
                assert h.result().token_ids == results[i].token_ids, i
        finally:
            cold.close()
        engine.check_integrity()
    finally:
        engine.close()


SYSTEM_TEXT = " ".join(f"Rule {i}: answer in plain words." for i in range(12))  # several 64-token blocks


def _chat(engine, i, **kw):
    messages = [{"role": "system", "content": SYSTEM_TEXT}, {"role": "user", "content": f"Question {i}?"}]
    return engine.chat(messages, sampling=SP, **kw)


def test_sh6_rendered_chat_prompts_share_the_system_prompt_other_sessions_sent():
    """A rendered prompt's markers are its own conversation's (the default one at its last part),
    so the system prompt every session sends was no source (issue 40: no first turn of the chat
    trace reused one). Rendered prompts get the branch point too; outputs equal a cold engine."""
    engine = _engine(True)
    try:
        first, second, third = (_chat(engine, i) for i in range(3))
        assert first.usage.cached_tokens == 0 and second.usage.cached_tokens == 0
        shared = third.usage.cached_tokens
        assert shared > 0 and shared % 64 == 0  # the last whole block the system prompts share
        assert shared <= len(engine.tokenizer.encode(SYSTEM_TEXT)) + 16
        assert engine.stats()["branch_points"] >= 1
        cold = _engine(False, enabled=False)
        try:
            assert _chat(cold, 2).token_ids == third.token_ids
        finally:
            cold.close()
        engine.check_integrity()
    finally:
        engine.close()


def test_a_rendered_prompts_branch_point_gives_way_to_four_shared_markers():
    """An automatic position yields when four shared markers are in use (as the automatic marker
    does): with four explicit markers past the system prompt no branch point is added, and the
    shared system prompt is no source; with three it is."""
    from ninfer_jax.frontend import ContentBoundary, MessageBoundary

    def turns(engine, marks):
        out = []
        for i in range(3):
            messages = [{"role": "system", "content": SYSTEM_TEXT}, {"role": "user", "content": f"Question {i}?"},
                        {"role": "assistant", "content": f"Answer {i}."}, {"role": "user", "content": "More?"}]
            out.append(engine.chat(messages, sampling=SP, cache_markers=marks))
        return out

    marks = [ContentBoundary(1), ContentBoundary(2), ContentBoundary(3), MessageBoundary(2)]
    for n, offered in ((3, True), (4, False)):
        engine = _engine(True)
        try:
            third = turns(engine, marks[:n])[2]
            assert (engine.stats()["branch_points"] > 0) == offered
            assert (third.usage.cached_tokens > 0) == offered
            engine.check_integrity()
        finally:
            engine.close()
