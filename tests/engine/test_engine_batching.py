"""Batched output equals each request run alone (greedy and seeded sampling), over mixed prompt
lengths, chunk sizes and C = 1..8; integrity after every cycle; no compilation after warm-up."""
import numpy as np
import pytest

from engine_helpers import assert_idle_and_empty, make_engine, run_until_done
from ninfer_jax import SamplingParams


def _workload(c: int, seed: int):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(2 * c + 1):
        n = int(rng.choice([1, 5, 31, 33, 64, 100, 150]))
        prompt = rng.integers(0, 1000, n).tolist()
        sp = (SamplingParams(temperature=0, max_tokens=int(rng.integers(3, 10))) if i % 2 == 0 else
              SamplingParams(temperature=0.9, top_p=0.9, top_k=50, seed=int(rng.integers(1 << 30)),
                             max_tokens=int(rng.integers(3, 10))))
        out.append((prompt, sp))
    return out


@pytest.mark.parametrize("c,chunk", [(1, 16), (2, 32), (3, 64), (5, 32), (8, 64)])
def test_batched_equals_alone(tiny_model, c, chunk):
    engine = make_engine(tiny_model, max_concurrency=c, chunk_size=chunk)
    compiled = engine.program.compilations
    work = _workload(c, seed=c)
    handles = [engine.submit(p, sp) for p, sp in work]
    run_until_done(engine, handles)
    together = [h.result() for h in handles]
    engine.clear_cache()  # alone runs start cold too: this test is about batching, not reuse
    alone = []
    for p, sp in work:
        h = engine.submit(p, sp)
        run_until_done(engine, [h], check_every_cycle=False)
        alone.append(h.result())
        engine.clear_cache()
    for t, a in zip(together, alone):
        assert t.token_ids == a.token_ids
        assert t.finish_reason == a.finish_reason
        assert t.usage.prompt_tokens == len(t.prompt_token_ids)
        assert t.usage.completion_tokens == len(t.token_ids)
    assert engine.program.compilations == compiled, "a step compiled after warm-up"
    assert engine.stats()["compilations"] == compiled
    assert_idle_and_empty(engine)


def test_streamed_deltas_add_up_to_the_completion(tiny_model):
    engine = make_engine(tiny_model)
    h = engine.submit("The weather today", SamplingParams(temperature=0.8, seed=3, max_tokens=12))
    run_until_done(engine, [h])
    deltas = list(h.stream())
    result = h.result()
    assert tuple(t for d in deltas for t in d.token_ids) == result.token_ids
    assert "".join(d.text for d in deltas) == result.text
