"""Explicit save points of a pre-tokenised prompt (`Engine.submit(recovery_point=, anchors=,
markers=)`, the same fields on trace lines and HTTP completions): a client that knows where its
chat structure lies gets recovery points there, not only at the prompt's end (P)."""
from __future__ import annotations

import json

import pytest

from ninfer_jax import ContextCacheConfig, Engine, EngineConfig, SamplingParams
from ninfer_jax.bench import trace as T
from ninfer_jax.errors import RequestError
from ninfer_jax.sim import SimProgram

CFG = EngineConfig(max_concurrency=2, max_context=1024, chunk_size=64, progress=False,
                   context_cache=ContextCacheConfig(host_capacity_bytes=1 << 20))
SP = SamplingParams(temperature=0, max_tokens=3)
BASE = [(7 * i + 3) % 997 for i in range(300)]


def _run(engine, prompt, **kw):
    h = engine.submit(prompt, SP, **kw)
    while not h.done():
        engine.step()
    return h.result()


@pytest.mark.parametrize("how", ["recovery_point", "markers", "anchors", "none"])
def test_rec6_explicit_save_points_are_sources(how):
    engine = Engine(CFG, program=SimProgram(CFG), start=False)
    try:
        kw = {"recovery_point": 200} if how == "recovery_point" else {how: [200]} if how != "none" else {}
        _run(engine, BASE, session="s", **kw)
        other = BASE[:200] + [11, 12, 13, 14, 15]  # leaves the first prompt after 200 tokens
        got = _run(engine, other, session="s")
        assert got.usage.cached_tokens == (200 if how != "none" else 0)
        cold = Engine(CFG, program=SimProgram(CFG), start=False)
        try:
            assert _run(cold, other).token_ids == got.token_ids
        finally:
            cold.close()
        engine.check_integrity()
    finally:
        engine.close()


def test_save_points_outside_the_prompt_are_refused_not_dropped():
    engine = Engine(CFG, program=SimProgram(CFG), start=False)
    try:
        for kw in ({"recovery_point": 0}, {"recovery_point": 301}, {"anchors": [5, 400]}, {"markers": [-1]}):
            with pytest.raises(RequestError, match=r"outside \[1, 300\]"):
                engine.submit(BASE, SP, **kw)
    finally:
        engine.close()


def test_trace_lines_carry_save_points(tmp_path):
    line = lambda turn, prompt, **extra: json.dumps({"session_id": 0, "turn_id": turn, "ts": float(turn),
                                                     "input_tokens": prompt, "output_tokens": [5], **extra})
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join([line(0, BASE, recovery_point=200, markers=[100]),
                               line(1, BASE[:200] + [11, 12, 13])]) + "\n")
    f = T.run_trace(str(path), CFG, program="sim", cold=False)
    assert f["cached_tokens"] == 200
    bad = tmp_path / "bad.jsonl"
    bad.write_text(line(0, BASE[:10], anchors=[11]) + "\n")
    with pytest.raises(T.TraceError, match=r"bad.jsonl:1: 'anchors' must be at most 4 token frontiers in \[1, 10\]"):
        T.load_trace(str(bad))
