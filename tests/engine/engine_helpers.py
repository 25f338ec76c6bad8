"""Building and driving manually stepped engines on the built-in model."""
from ninfer_jax import ContextCacheConfig, Engine, EngineConfig
from ninfer_jax.program.program import Program

HOST = ContextCacheConfig(host_capacity_bytes=1 << 20)


def make_engine(model, **overrides) -> Engine:
    cfg = EngineConfig(**{"max_concurrency": 2, "max_context": 256, "chunk_size": 32, "progress": False,
                          "context_cache": HOST, **overrides})
    return Engine(cfg, program=Program(cfg, model=model), start=False)


def run_until_done(engine: Engine, handles, check_every_cycle: bool = True, max_cycles: int = 10_000) -> int:
    """Step until every handle finished, checking integrity after every cycle (doctrine 2)."""
    cycles = 0
    while not all(h.done() for h in handles):
        engine.step()
        cycles += 1
        if check_every_cycle:
            engine.check_integrity()
        assert cycles < max_cycles, "engine made no progress"
    engine.step()  # drain anything left in the inbox
    engine.check_integrity()
    return cycles


def assert_idle_and_empty(engine: Engine) -> None:
    """Every pool and the arena are empty once all requests ended and the cache is cleared
    (doctrine 2)."""
    engine.check_integrity()
    engine.clear_cache()
    engine.check_integrity()
    recount = engine.program.check_integrity()
    for pool, counts in recount.pools.items():
        assert counts["used"] == 0 and counts["reserved"] == 0, (pool, counts)
    assert recount.host_used_bytes == 0
    assert not engine.core.residents and not len(engine.core.fresh)
