"""The cost-model Program runs 10,000 requests of a synthetic load through the same engine
loop, with integrity holding; and a cached run of reusable sessions on it."""
import random

from ninfer_jax import ContextCacheConfig, Engine, EngineConfig, SamplingParams
from ninfer_jax.sim import SimProgram


def test_sim_10k_requests_through_the_engine_loop():
    # The scheduling loop itself (issue 4's check); its speed is a benchmark figure
    # (`ninfer bench engine`: sim_seconds), never a test assertion.
    cfg = EngineConfig(max_concurrency=8, max_context=1024, chunk_size=256, progress=False, max_queue=20_000,
                       context_cache=ContextCacheConfig(host_capacity_bytes=1 << 20, enabled=False))
    engine = Engine(cfg, program=SimProgram(cfg), start=False)
    rng = random.Random(0)
    handles = [engine.submit([rng.randrange(1000) for _ in range(rng.randint(1, 600))],
                             SamplingParams(temperature=0, max_tokens=rng.randint(1, 16)))
               for _ in range(10_000)]
    cycles = 0
    while not all(h.done() for h in handles[-50:]) or engine.core.has_work():
        engine.step()
        cycles += 1
        if cycles % 500 == 0:
            engine.check_integrity()
    engine.check_integrity()
    results = [h.result(timeout=0) for h in handles]
    assert all(r.finish_reason == "length" for r in results)
    assert sum(len(r.token_ids) for r in results) == engine.stats()["generated_tokens"]


def test_sim_sessions_with_the_cache_reuse_and_keep_integrity():
    """The same loop with the cache on: 40 two-turn sessions, the second turn extending the
    first; integrity every 20 cycles, and the second turns served from the cache."""
    cfg = EngineConfig(max_concurrency=4, max_context=1024, chunk_size=128, progress=False,
                       context_cache=ContextCacheConfig(host_capacity_bytes=1 << 20))
    engine = Engine(cfg, program=SimProgram(cfg), start=False)
    rng = random.Random(1)
    firsts = [[rng.randrange(1000) for _ in range(rng.randint(50, 300))] for _ in range(40)]
    sp = SamplingParams(temperature=0, max_tokens=8)

    def drain(handles):
        cycles = 0
        while not all(h.done() for h in handles):
            engine.step()
            cycles += 1
            if cycles % 20 == 0:
                engine.check_integrity()
        engine.check_integrity()
        return [h.result(timeout=0) for h in handles]

    turn1 = drain([engine.submit(p, sp, session=i) for i, p in enumerate(firsts)])
    seconds = [p + list(r.token_ids) + [rng.randrange(1000) for _ in range(20)] for p, r in zip(firsts, turn1)]
    turn2 = drain([engine.submit(p, sp, session=i) for i, p in enumerate(seconds)])
    served = sum(r.usage.cached_tokens for r in turn2)
    assert served >= 0.5 * sum(len(p) for p in firsts)  # most of each first turn comes back
    assert engine.stats()["cache_hits"] >= 20
