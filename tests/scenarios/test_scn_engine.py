"""The SCN scenarios end to end on the built-in model: expected reuse positions and counters,
outputs equal to a cold run, integrity after every cycle."""
import numpy as np
import pytest

import ledger as L
from engine_helpers import assert_idle_and_empty, make_engine, run_until_done
from ninfer_jax import ContextCacheConfig, SamplingParams

SP = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def cold(scn_model):
    return make_engine(scn_model, max_context=512, context_cache=ContextCacheConfig(
        host_capacity_bytes=1 << 20, enabled=False))


def _run(engine, submit):
    h = submit(engine)
    run_until_done(engine, [h])
    return h.result()


def _same_as_cold(cold, result, submit):
    assert result.token_ids == _run(cold, submit).token_ids


def _points(engine, kind=None):
    cache = engine.core.reuse.cache
    return [c for c in cache.checkpoints.values() if kind is None or c.kind == kind]


def test_scn1_agent_adopts_e_then_a_normalised_tool_call_falls_back_to_the_input_point(scn_model, cold):
    engine = make_engine(scn_model, max_context=512)
    frontend = engine._frontend()
    turn1 = [{"role": "user", "content": "Look up the weather in Paris."}]
    point = frontend.render_chat(turn1).recovery_position.frontier
    t1 = _run(engine, lambda e: e.submit_chat(turn1, sampling=SP, session="a"))
    # Continuing on exactly what was generated adopts E (the record is taken over).
    cont = list(frontend.render_chat(turn1).token_ids) + list(t1.token_ids) + [5, 6, 7]
    t2 = _run(engine, lambda e: e.submit(cont, SP, session="a"))
    assert t2.usage.cached_tokens == len(cont) - 3 - 1
    _same_as_cold(cold, t2, lambda e: e.submit(cont, SP))
    # The client sends the tool call back normalised: E's deeper part no longer matches; the
    # input recovery point of turn 1 still does, and the suffix is recomputed.
    turn2 = turn1 + [{"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "18C and sunny"}]
    t3 = _run(engine, lambda e: e.submit_chat(turn2, sampling=SP, session="a"))
    assert t3.usage.cached_tokens == point
    _same_as_cold(cold, t3, lambda e: e.submit_chat(turn2, sampling=SP))
    assert_idle_and_empty(engine)


def test_scn2_private_input_point_and_shared_marker_at_one_position(scn_model, cold):
    engine = make_engine(scn_model, max_context=512)
    msgs = [{"role": "system", "content": "Shared instructions for every user."},
            {"role": "user", "content": "First question?"}]
    rendered = engine._frontend().render_chat(msgs)
    c = rendered.recovery_position.frontier
    # The automatic marker lands on the same frontier as the private input point C.
    assert c in [m.frontier for m in rendered.markers]
    first = _run(engine, lambda e: e.submit_chat(msgs, sampling=SP, session="s"))
    at_c = [p for p in _points(engine) if p.frontier == c]
    assert {"input", "shared"} <= {p.kind for p in at_c}
    assert len({p.state for p in at_c}) == 1  # one state, two uses
    # The private record moves forward with its session (takes over E) ...
    cont = list(rendered.token_ids) + list(first.token_ids) + [9, 9]
    r2 = _run(engine, lambda e: e.submit(cont, SP, session="s"))
    assert r2.usage.cached_tokens == len(cont) - 3
    # ... while the shared entry lives on by its own references for anyone with that prefix.
    assert any(p.kind == "shared" and p.frontier == c for p in _points(engine))
    r3 = _run(engine, lambda e: e.submit_chat(msgs, sampling=SP, session="other"))
    assert r3.usage.cached_tokens == c
    _same_as_cold(cold, r3, lambda e: e.submit_chat(msgs, sampling=SP))
    assert_idle_and_empty(engine)


def test_scn3_markers_at_alpha_and_alpha_beta_then_alpha_gamma(scn_model, cold):
    engine = make_engine(scn_model, max_context=512)
    alpha = {"role": "system", "content": "Alpha: the common preamble."}
    first = [alpha, {"role": "user", "content": "Beta: the first branch."}]
    markers = [{"message": 0}, {"message": 1}]
    rendered = engine._frontend().render_chat(first, cache_markers=markers)
    frontiers = sorted(m.frontier for m in rendered.markers)
    assert len(frontiers) >= 2
    _run(engine, lambda e: e.submit_chat(first, cache_markers=markers, sampling=SP))
    shared = sorted(p.frontier for p in _points(engine, "shared"))
    assert frontiers[0] in shared and frontiers[1] in shared  # both got their save opportunity
    later = [alpha, {"role": "user", "content": "Gamma: a different branch."}]
    r = _run(engine, lambda e: e.submit_chat(later, sampling=SP))
    assert r.usage.cached_tokens == frontiers[0]  # alpha serves as a complete source
    _same_as_cold(cold, r, lambda e: e.submit_chat(later, sampling=SP))
    assert_idle_and_empty(engine)


def test_scn4_hot_predecessor_one_off_branches(scn_model, cold):
    engine = make_engine(scn_model, max_context=512, max_concurrency=2)
    rng = np.random.default_rng(24)
    parent = rng.integers(0, 1000, 70).tolist()
    _run(engine, lambda e: e.submit(parent, SP, markers=[64]))
    hits_before = engine.stats()["cache_hits"]
    times = []
    for i in range(4):
        branch = parent[:64] + rng.integers(0, 1000, 10).tolist()
        r = _run(engine, lambda e: e.submit(branch, SP))
        assert r.usage.cached_tokens == 64
        _same_as_cold(cold, r, lambda e: e.submit(branch, SP))
        newest = max(engine.core.reuse.cache.records.values(), key=lambda rec: rec.publication_order)
        times.append(newest.demand_time)
    assert engine.stats()["cache_hits"] - hits_before == 4  # each real adoption counts once
    assert times == sorted(times) and len(set(times)) == 4  # each branch: its own adoption time
    before = {rec.rid: rec.demand_time for rec in engine.core.reuse.cache.records.values()}
    _run(engine, lambda e: e.submit(rng.integers(0, 1000, 30).tolist(), SP))  # unrelated completion
    after = {rid: rec.demand_time for rid, rec in engine.core.reuse.cache.records.items() if rid in before}
    assert after == {rid: t for rid, t in before.items() if rid in after}  # completion adds no heat
    assert_idle_and_empty(engine)


def test_scn6_a_few_missing_pages_move_only_that_page_group(scn_model, cold):
    """Main KV is scarce and the cache holds pages: a new request's shortfall is met by a
    bounded page-group action; StateImages are not moved."""
    engine = make_engine(scn_model, max_context=256, max_concurrency=2, kv_capacity=512,
                         context_cache=ContextCacheConfig(device_state_slots=8, host_capacity_bytes=1 << 22))
    rng = np.random.default_rng(26)
    for i in range(3):
        _run(engine, lambda e: e.submit(rng.integers(0, 1000, 130).tolist(), SP))
    states_before = {c.state: engine.program.state.objects[c.state].device for c in _points(engine)}
    prompt = rng.integers(0, 1000, 200).tolist()
    r = _run(engine, lambda e: e.submit(prompt, SP))
    stats = engine.stats()
    assert stats["reclaims"] >= 1
    moved = [s for s, dev in states_before.items()
             if s in engine.program.state.objects and engine.program.state.objects[s].device != dev]
    assert not moved, "a KV shortfall must not move StateImages"
    _same_as_cold(cold, r, lambda e: e.submit(prompt, SP))
    assert_idle_and_empty(engine)


def test_scn7_no_host_few_slots_optional_saves_fail_necessary_work_goes_on(scn_model, cold):
    engine = make_engine(scn_model, max_context=256, max_concurrency=2, kv_capacity=256,
                         context_cache=ContextCacheConfig(device_state_slots=0, host_capacity_bytes=0))
    rng = np.random.default_rng(27)
    work = [(rng.integers(0, 1000, 100).tolist(), SamplingParams(temperature=0, max_tokens=60, ignore_eos=True))
            for _ in range(3)]
    handles = [engine.submit(p, sp) for p, sp in work]
    run_until_done(engine, handles)
    stats = engine.stats()
    assert stats["captures_skipped"] > 0  # optional saves failed
    assert stats["pauses_replay"] >= 1 and stats["resumes_replay"] >= 1  # Replay carried the work
    for (p, sp), h in zip(work, handles):
        assert h.result().finish_reason == "length"
        _same_as_cold(cold, h.result(), lambda e, p=p, sp=sp: e.submit(p, sp))
    assert_idle_and_empty(engine)


def test_scn9_repeated_computation_is_evidence_not_a_hit(scn_model):
    """A save opportunity that cannot be kept the first time becomes repeated-demand evidence
    when it is computed again; the later save is admitted; hits count only real reuse."""
    engine = make_engine(scn_model, max_context=512, max_concurrency=1,
                         context_cache=ContextCacheConfig(device_state_slots=1, host_capacity_bytes=0))
    rng = np.random.default_rng(29)
    prefix = rng.integers(0, 1000, 64).tolist()
    _run(engine, lambda e: e.submit(rng.integers(0, 1000, 100).tolist(), SP))  # its E holds the spare slot
    shared = lambda: [p for p in _points(engine, "shared") if p.frontier == 64]  # noqa: E731
    r0 = _run(engine, lambda e: e.submit(prefix + rng.integers(0, 1000, 20).tolist(), SP, markers=[64]))
    kept_first = bool(shared())
    r1 = _run(engine, lambda e: e.submit(prefix + rng.integers(0, 1000, 20).tolist(), SP, markers=[64]))
    assert r0.usage.cached_tokens == 0
    assert kept_first or r1.usage.cached_tokens == 0  # recomputed, not reused, while unkept
    (point,) = shared()  # the repeated demand admitted the save
    assert point.demand_time > 0
    hits = engine.stats()["cache_hits"]
    assert hits == (1 if kept_first else 0)  # evidence is no hit
    r2 = _run(engine, lambda e: e.submit(prefix + rng.integers(0, 1000, 5).tolist(), SP))
    assert r2.usage.cached_tokens == 64 and engine.stats()["cache_hits"] == hits + 1
    assert_idle_and_empty(engine)
