"""The cost-model Program runs 10,000 requests of a synthetic load through the same engine
loop, with integrity holding."""
import random
import time

from ninfer_jax import ContextCacheConfig, Engine, EngineConfig, SamplingParams
from ninfer_jax.sim import SimProgram


def test_sim_10k_requests_under_a_minute():
    cfg = EngineConfig(max_concurrency=8, max_context=1024, chunk_size=256, progress=False, max_queue=20_000,
                       context_cache=ContextCacheConfig(host_capacity_bytes=1 << 20))
    engine = Engine(cfg, program=SimProgram(cfg), start=False)
    rng = random.Random(0)
    start = time.perf_counter()
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
    elapsed = time.perf_counter() - start
    results = [h.result(timeout=0) for h in handles]
    assert all(r.finish_reason == "length" for r in results)
    assert sum(len(r.token_ids) for r in results) == engine.stats()["generated_tokens"]
    assert elapsed < 60, f"10k simulated requests took {elapsed:.1f}s"
