"""SCN-5 and SCN-8 end to end: long inputs under pressure, paused requests waiting locally and
resuming by original ticket (G-6, SAVE-1, SCH-6, SCH-10, RD-2, RD-3)."""
import numpy as np
import pytest

from engine_helpers import assert_idle_and_empty, make_engine, run_until_done
from ninfer_jax import ContextCacheConfig, SamplingParams
from ninfer_jax.engine.request import PAUSED

HOST = ContextCacheConfig(host_capacity_bytes=4 << 20)


def _alone(engine, prompt, sp):
    engine.clear_cache()
    h = engine.submit(prompt, sp)
    run_until_done(engine, [h], check_every_cycle=False)
    return h.result().token_ids


@pytest.mark.parametrize("route", ["snapshot", "replay"])
def test_scn5_long_input_chunks_save_nothing_only_a_pressure_pause_keeps_its_work(scn_model, route):
    """A long raw prompt is prefilled in many chunks; no chunk end becomes a recovery point
    (G-6, SAVE-1): the only checkpoint it leaves is P at its end and E. Under pressure from an
    older resident it is paused, and only that pause keeps its work (Snapshot or Replay)."""
    engine = make_engine(scn_model, max_concurrency=2, max_context=320, kv_capacity=320, chunk_size=16,
                         context_cache=HOST, pause_route=route)
    rng = np.random.default_rng(3)
    old = (rng.integers(0, 1000, 150).tolist(), SamplingParams(temperature=0, max_tokens=150, ignore_eos=True))
    long = (rng.integers(0, 1000, 240).tolist(), SamplingParams(temperature=0.7, seed=5, max_tokens=6, ignore_eos=True))
    h_old = engine.submit(*old)
    for _ in range(3):
        engine.step()
    h_long = engine.submit(*long)
    frontiers = set()
    paused_at = None
    while not (h_old.done() and h_long.done()):
        engine.step()
        engine.check_integrity()
        r = engine.core.by_id.get(h_long.request_id)
        if r is not None and r.phase == PAUSED and paused_at is None:
            paused_at = r.computed
        for c in engine.core.reuse.cache.checkpoints.values():
            if c.kind != "snapshot":
                frontiers.add((c.kind, c.frontier))
    stats = engine.stats()
    assert paused_at is not None and 0 < paused_at < len(long[0]), "the long input was never paused mid-prefill"
    assert stats[f"pauses_{route}"] >= 1 and stats[f"resumes_{route}"] >= 1
    # No checkpoint at any chunk boundary: only input ends (P) and generation ends (E).
    ends = {len(old[0]), len(long[0]), len(old[0]) + 150 - 1, len(long[0]) + 6 - 1}
    assert {f for _, f in frontiers} <= ends, sorted(frontiers)
    assert {k for k, _ in frontiers} <= {"input", "E"}
    if route == "replay":
        assert stats["replay_tokens"] >= paused_at - 0  # the computed part is recomputed, not saved
    else:
        assert stats["snapshot_bytes"] > 0 and stats["replay_tokens"] == 0
    assert h_long.result().token_ids == _alone(engine, *long)
    assert h_old.result().token_ids == _alone(engine, *old)
    assert_idle_and_empty(engine)


@pytest.mark.parametrize("route", ["snapshot", "replay"])
def test_scn8_paused_long_request_waits_locally_short_ones_enter_it_resumes_by_ticket(scn_model, route):
    """A long request is paused while an older resident exists: it waits locally (no lane, no
    thrash), short requests that fit keep entering and finishing, and after the older resident
    ends it resumes by its original ticket, ahead of younger fresh requests (SCN-8)."""
    engine = make_engine(scn_model, max_concurrency=3, max_context=320, kv_capacity=384, chunk_size=32,
                         context_cache=HOST, pause_route=route)
    rng = np.random.default_rng(8)
    old = (rng.integers(0, 1000, 180).tolist(), SamplingParams(temperature=0, max_tokens=120, ignore_eos=True))
    long = (rng.integers(0, 1000, 200).tolist(), SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    shorts = [(rng.integers(0, 1000, 20).tolist(), SamplingParams(temperature=0.5, seed=i, max_tokens=4, ignore_eos=True))
              for i in range(6)]
    h_old = engine.submit(*old)
    engine.step()
    h_long = engine.submit(*long)
    long_req = None
    for _ in range(200):
        engine.step()
        engine.check_integrity()
        long_req = engine.core.by_id.get(h_long.request_id)
        if long_req is not None and long_req.phase == PAUSED:
            break
    else:
        raise AssertionError("the long request was never paused")
    old_req = engine.core.by_id[h_old.request_id]
    assert old_req in engine.core.residents and old_req.ticket < long_req.ticket
    pauses = engine.stats()[f"pauses_{route}"]
    # Short requests arrive while it waits; they fit the free space and keep entering.
    h_shorts = [engine.submit(*s) for s in shorts]
    finished_while_paused = 0
    resumed_after_old = None
    while not all(h.done() for h in [h_old, h_long] + h_shorts):
        engine.step()
        engine.check_integrity()
        if long_req.phase == PAUSED:
            finished_while_paused = sum(h.done() for h in h_shorts)
            assert long_req not in engine.core.residents
        elif resumed_after_old is None:
            resumed_after_old = h_old.done()
    stats = engine.stats()
    assert finished_while_paused >= 1, "short requests must keep entering while the long one waits"
    assert resumed_after_old, "it resumes only after the older resident ends (SCH-6)"
    assert stats[f"pauses_{route}"] == pauses, "a paused request waits locally: it is not paused again"
    assert stats[f"resumes_{route}"] >= 1
    for (p, sp), h in [(old, h_old), (long, h_long)] + list(zip(shorts, h_shorts)):
        assert h.result().finish_reason == "length"
        assert h.result().token_ids == _alone(engine, p, sp)
    assert_idle_and_empty(engine)
