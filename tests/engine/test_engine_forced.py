"""Forced outputs (replay only): the engine emits exactly the recorded tokens through the normal
decode path, so a token-level trace's next request finds E, the real end of the previous one."""
from __future__ import annotations

import pytest

from ninfer_jax import ContextCacheConfig, Engine, EngineConfig, SamplingParams
from ninfer_jax.errors import RequestError
from ninfer_jax.program.program import Program
from ninfer_jax.sim import SimProgram

PROMPT = [17, 250, 3, 998, 41, 77, 5, 600, 12, 13, 14, 15, 300, 301, 302, 303, 304, 305]
FORCED = [5, 6, 7, 151, 8, 9, 10, 900, 2, 1]  # includes ids eos or stop rules would end on


def _engines(tiny_model):
    cfg = EngineConfig(max_concurrency=2, max_context=256, chunk_size=16, progress=False,
                       context_cache=ContextCacheConfig(host_capacity_bytes=1 << 20))
    yield "model", Engine(cfg, program=Program(cfg, model=tiny_model), start=False)
    yield "sim", Engine(cfg, program=SimProgram(cfg), start=False)


def _run(engine, prompt, sp):
    handle = engine.submit(prompt, sp)
    while not handle.done():
        engine.step()
    return handle.result()


@pytest.mark.parametrize("kind", ["model", "sim"])
def test_forced_output_is_emitted_exactly_and_the_next_request_reuses_e(tiny_model, kind):
    engine = dict(_engines(tiny_model))[kind]
    try:
        eos = engine.program.eos_token_ids[0]
        forced = FORCED + [eos, 4]  # an eos in a recorded output does not end it early
        first = _run(engine, PROMPT, SamplingParams(temperature=0.7, seed=3, forced_output=forced, logprobs=2))
        assert list(first.token_ids) == forced and first.finish_reason == "stop"
        assert [lp.token_id for lp in first.logprobs] == forced and all(len(lp.top) == 2 for lp in first.logprobs)
        # Request 2 extends request 1's prompt and output: E (the end of request 1) is its source.
        follow = PROMPT + forced + [20, 21, 22]
        second = _run(engine, follow, SamplingParams(temperature=0, max_tokens=4))
        assert second.usage.cached_tokens >= len(PROMPT) + len(forced) - 1
        cold = Engine(engine.config, program=SimProgram(engine.config) if kind == "sim" else
                      Program(engine.config, model=tiny_model), start=False)
        try:
            assert _run(cold, follow, SamplingParams(temperature=0, max_tokens=4)).token_ids == second.token_ids
        finally:
            cold.close()
        cut = _run(engine, PROMPT, SamplingParams(forced_output=forced, max_tokens=3))
        assert list(cut.token_ids) == forced[:3] and cut.finish_reason == "length"
        engine.check_integrity()
    finally:
        engine.close()


def test_forced_output_is_checked_at_the_boundary(tiny_model):
    with pytest.raises(RequestError, match="forced_output"):
        SamplingParams(forced_output=[1, -2])
    with pytest.raises(RequestError, match="forced_output"):
        SamplingParams(forced_output=[1, True])
    cfg = EngineConfig(max_concurrency=1, max_context=128, chunk_size=16, progress=False)
    engine = Engine(cfg, program=SimProgram(cfg), start=False)
    try:
        with pytest.raises(RequestError, match="outside the vocabulary"):
            engine.submit([1, 2, 3], SamplingParams(forced_output=[engine.program.vocab_size]))
        assert engine.stats()["requests_submitted"] == 0
    finally:
        engine.close()
