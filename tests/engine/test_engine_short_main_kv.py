"""CFG-6 (this project, issue 40): a Main KV below one max_context starts the engine with
max_context lowered to the tokens Main KV holds. A request that cannot fit is refused at
submission, typed, and touches nothing else; every other request runs as a cold engine with
that max_context runs it: under pressure (no spare StateImage slot, a tiny Host arena, pauses
by Replay and by Snapshot, a cancel), compared token for token."""
import numpy as np
import pytest

from engine_helpers import assert_idle_and_empty, make_engine, run_until_done
from ninfer_jax import ContextCacheConfig, SamplingParams
from ninfer_jax.errors import RequestError

# Replay with a Host arena too small for any snapshot; Snapshot with room for one.
CACHE = {"replay": ContextCacheConfig(host_capacity_bytes=4096, device_state_slots=0),
         "snapshot": ContextCacheConfig(host_capacity_bytes=1 << 20, device_state_slots=0)}


@pytest.mark.parametrize("route", ["replay", "snapshot"])
def test_cfg6_main_kv_below_one_max_context(tiny_model, route):
    # 4 pages = 256 tokens of Main KV against max_context 1,024: a request reaches 256 tokens.
    engine = make_engine(tiny_model, max_concurrency=2, max_context=1024, kv_capacity=256, chunk_size=64,
                         pause_route=route, context_cache=CACHE[route])
    assert engine.config.max_context == 256 and engine.program.capacity.kv_pages == 4
    assert engine.program.plan.max_context_lowered_from == 1024
    rng = np.random.default_rng(7)
    shared = rng.integers(0, 1000, 70).tolist()
    work = [(shared + rng.integers(0, 1000, 30).tolist(), SamplingParams(temperature=0, max_tokens=400,
                                                                         ignore_eos=True)),
            (shared + rng.integers(0, 1000, 20).tolist(), SamplingParams(temperature=0.9, seed=3, max_tokens=60,
                                                                         ignore_eos=True)),
            (rng.integers(0, 1000, 150).tolist(), SamplingParams(temperature=0, max_tokens=50, ignore_eos=True))]
    handles = [engine.submit(p, sp) for p, sp in work]
    with pytest.raises(RequestError, match="exceed max_context=256"):
        engine.submit(rng.integers(0, 1000, 257).tolist(), SamplingParams(max_tokens=1))
    cancelled = engine.submit(rng.integers(0, 1000, 120).tolist(), SamplingParams(temperature=0, max_tokens=40))
    engine.step()
    engine.step()
    cancelled.cancel()
    run_until_done(engine, handles + [cancelled])
    assert cancelled.result().finish_reason in ("cancelled", "length")
    first = handles[0].result()
    assert first.finish_reason == "length" and len(work[0][0]) + len(first.token_ids) == 256  # the lowered reach
    stats = engine.stats()
    assert stats[f"pauses_{route}"] >= 1, stats  # 3 + 3 pages cannot co-reside in 4
    cold = make_engine(tiny_model, max_concurrency=1, max_context=256, kv_capacity=256, chunk_size=64)
    for (p, sp), h in zip(work, handles):
        alone = cold.submit(p, sp)
        run_until_done(cold, [alone], check_every_cycle=False)
        cold.clear_cache()
        assert h.result().token_ids == alone.result().token_ids
    assert_idle_and_empty(engine)
