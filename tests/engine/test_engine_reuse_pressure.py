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



def _cold_replay(model, trace, *, max_context: int, concurrency: int, **config):
    """The trace on a cold engine (the cache off): the outputs every hot run must equal."""
    from ninfer_jax import Engine
    from ninfer_jax.program.program import Program

    cfg = EngineConfig(max_context=max_context, max_concurrency=concurrency, progress=False,
                       context_cache=ContextCacheConfig(host_capacity_bytes=1 << 20, enabled=False), **config)
    return T.Replayer(Engine(cfg, program=Program(cfg, model=model), start=False), trace,
                      concurrency=concurrency).run()

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
    cold = _cold_replay(tiny_model, trace, max_context=1024, concurrency=4)
    stats = hot.stats
    assert stats["cached_tokens"] > 0 and stats["h2d_bytes"] > 0 and stats["d2h_bytes"] > 0
    assert T.outputs_differing(hot, cold) == 0


def test_rcl2_one_quote_per_pool_and_applicant_per_attempt_facts_shared(tiny_model, monkeypatch):
    """RCL-2: under pressure (Main KV near its minimum, one spare StateImage slot, a tiny Host
    arena) every admission walks several sources and retries (RES-4). The engine builds the
    quotes' shared facts once per (ledger state, cache) pair and never asks the same quote
    twice on the same states; outputs equal a cold engine's."""
    import numpy as np

    import ledger
    from ledger.reclamation import quotes
    from ninfer_jax import SamplingParams
    from tests.engine.engine_helpers import make_engine, run_until_done

    built, asked = [], []
    real_init, real_quote = quotes.QuoteFacts.__init__, quotes.QuoteFacts.quote

    def init(self, state, cache):
        built.append((state, cache))  # kept alive: identities stay unique
        real_init(self, state, cache)

    def quote(self, gap, applicant, protect=(), keep_content=()):
        asked.append((id(self.state), id(self.cache), gap, applicant, frozenset(protect)))
        return real_quote(self, gap, applicant, protect, keep_content)

    monkeypatch.setattr(quotes.QuoteFacts, "__init__", init)
    monkeypatch.setattr(quotes.QuoteFacts, "quote", quote)
    rng = np.random.default_rng(5)
    system = rng.integers(0, 1000, 48).tolist()
    work = [(system + rng.integers(0, 1000, int(rng.integers(20, 90))).tolist(),
             SamplingParams(temperature=0, max_tokens=int(rng.integers(4, 24)), ignore_eos=True)) for _ in range(10)]
    engine = make_engine(tiny_model, max_context=256, max_concurrency=2, kv_capacity=288,
                         context_cache=ContextCacheConfig(device_state_slots=1, host_capacity_bytes=1 << 16))
    handles = [engine.submit(p, sp) for p, sp in work]
    run_until_done(engine, handles)
    stats = engine.stats()
    assert stats["reclaims"] >= 1 and stats["reclaim_quotes"] >= stats["reclaims"]
    pairs = [(id(s), id(c)) for s, c in built]
    assert len(pairs) == len(set(pairs)), "facts rebuilt on unchanged states"
    assert len(asked) == len(set(asked)), "the same quote asked twice on the same states"
    assert 0 < stats["reclaim_quotes"] <= len(asked)  # the engine's own; a capture quotes inside its plan
    cold = make_engine(tiny_model, max_context=256, max_concurrency=2,
                       context_cache=ContextCacheConfig(enabled=False))
    for (p, sp), h in zip(work, handles):
        ref = cold.submit(p, sp)
        run_until_done(cold, [ref])
        assert h.result().token_ids == ref.result().token_ids


def test_bf16_packed_pools_under_pressure_equal_cold(tmp_path):
    """bf16 pools are stored packed on the xla path (uint16 bits, issue 33): the same pressure —
    2 Device slots, a small Host arena, captures offloaded and brought back by H2D, reclamation
    while others compute — gives exactly the tokens of a cold bf16 engine."""
    from ninfer_jax import Engine
    from ninfer_jax.model.model import load_model
    from ninfer_jax.program.program import Program
    from pallas_kernels._common import PACKED

    model = load_model("builtin:tiny-hybrid", "bfloat16")
    path = os.path.join(tmp_path, "agent.jsonl")
    trace_gen.main(["--kind", "agent", "--sessions", "4", "--max_context", "768", "--seed", "1", "--out", path])
    trace = T.load_trace(path)
    cfg = EngineConfig(max_context=768, max_concurrency=3, dtype="bfloat16", progress=False,
                       context_cache=ContextCacheConfig(device_state_slots=2, host_capacity_bytes=2 << 20))
    program = Program(cfg, model=model)
    assert program.stores.pools["main_kv"].tree["k"][0].dtype == PACKED
    hot_engine = _CheckedEngine(Engine(cfg, program=program, start=False))
    hot = T.Replayer(hot_engine, trace, concurrency=3).run()
    cold = _cold_replay(model, trace, max_context=768, concurrency=3, dtype="bfloat16")
    stats = hot.stats
    assert stats["cached_tokens"] > 0 and stats["h2d_bytes"] > 0 and stats["d2h_bytes"] > 0
    assert T.outputs_differing(hot, cold) == 0
