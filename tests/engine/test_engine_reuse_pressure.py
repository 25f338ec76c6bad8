"""Reuse under concurrency and memory pressure: an 8-session agent trace at C=4 with few
Device StateImage slots (so captures go to the Host arena, sources come back by H2D and
reclamation runs while other requests compute) keeps integrity after every cycle and gives
exactly the tokens of a cold run. This caught a reclamation that dropped the Device replica of
a page a running request was reading."""
import os

from ninfer_jax import ContextCacheConfig, EngineConfig
from ninfer_jax.bench import trace as T
from ninfer_jax.bench import trace_gen


class _CheckedEngine:
    """Wraps an engine so that every cycle is followed by the integrity check."""

    def __init__(self, engine):
        self._engine = engine

    def step(self):
        self._engine.step()
        self._engine.check_integrity()

    def __getattr__(self, name):
        return getattr(self._engine, name)


def test_agent_trace_at_c4_under_pressure_equals_cold(tmp_path, tiny_model):
    from ninfer_jax import Engine
    from ninfer_jax.program.program import Program

    path = os.path.join(tmp_path, "agent.jsonl")
    trace_gen.main(["--kind", "agent", "--sessions", "8", "--max_context", "1024", "--seed", "0", "--out", path])
    trace = T.load_trace(path)
    cfg = EngineConfig(max_context=1024, max_concurrency=4, progress=False,
                       context_cache=ContextCacheConfig(device_state_slots=2, host_capacity_bytes=4 << 20))
    hot_engine = _CheckedEngine(Engine(cfg, program=Program(cfg, model=tiny_model), start=False))
    hot = T.Replayer(hot_engine, trace, concurrency=4).run()
    cold_cfg = EngineConfig(max_context=1024, max_concurrency=4, progress=False,
                            context_cache=ContextCacheConfig(host_capacity_bytes=1 << 20, enabled=False))
    cold = T.Replayer(Engine(cold_cfg, program=Program(cold_cfg, model=tiny_model), start=False), trace,
                      concurrency=4).run()
    stats = hot.stats
    assert stats["cached_tokens"] > 0 and stats["h2d_bytes"] > 0 and stats["d2h_bytes"] > 0
    assert T.outputs_differing(hot, cold) == 0
