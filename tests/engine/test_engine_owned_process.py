"""An engine in a process NInfer owns (the `ninfer` command, `host_heap.own_process`) drops
JAX's staging caches after its warm-up (`host_heap.settle`, issue 33: peak RSS). Its steps are
the executables `CompiledSteps` holds, so serving afterwards traces and compiles nothing, and
the tokens and logprobs equal an engine's whose process is not NInfer's."""
import numpy as np
import pytest

from ninfer_jax import SamplingParams
from ninfer_jax.compile_cache import CompileCounter
from ninfer_jax.config import ContextCacheConfig
from ninfer_jax.program import host_heap
from engine_helpers import make_engine, run_until_done

SP = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=True)
SEEDED = SamplingParams(temperature=0.9, top_k=40, seed=3, max_tokens=8, ignore_eos=True)


def _prompts():
    rng = np.random.default_rng(5)
    return [rng.integers(0, 1000, n).tolist() for n in (40, 75)]


def _serve(e, prompts):
    hs = [e.submit(p, sp) for p, sp in zip(prompts, (SP, SEEDED))]
    run_until_done(e, hs)
    # a second turn on the first prompt: a cache hit, a bind and a chunk of a new length
    h = e.submit(prompts[0] + list(hs[0].result().token_ids) + [7, 8, 9], SP)
    run_until_done(e, [h])
    return [(r.token_ids, r.logprobs) for r in (x.result() for x in hs + [h])]


def test_an_owned_process_drops_staging_caches_and_serves_without_tracing(tiny_model, monkeypatch):
    prompts = _prompts()
    want = _serve(make_engine(tiny_model, context_cache=ContextCacheConfig(host_capacity_bytes=1 << 20)), prompts)
    cleared = []
    monkeypatch.setattr(host_heap, "_owned", True)
    monkeypatch.setattr(host_heap.jax, "clear_caches", lambda real=host_heap.jax.clear_caches: (cleared.append(1), real()))
    e = make_engine(tiny_model, context_cache=ContextCacheConfig(host_capacity_bytes=1 << 20))
    assert cleared == [1], "settle dropped the staging caches once, after the warm-up"
    compiled = e.program.compilations
    with CompileCounter() as cc:
        got = _serve(e, prompts)
    assert cc.requests == 0, f"{cc.requests} XLA compilations after the warm-up"
    assert e.program.compilations == compiled
    assert got == want


def test_a_callers_process_keeps_its_caches(tiny_model, monkeypatch):
    monkeypatch.setattr(host_heap, "_owned", False)
    monkeypatch.setattr(host_heap.jax, "clear_caches", lambda: pytest.fail("cleared a caller's JAX caches"))
    make_engine(tiny_model)
