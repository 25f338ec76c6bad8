"""`ninfer trace` on the real model loads and compiles the model once for both runs; the cold
run still starts cold (a fresh Program, the cache off)."""
import json

from ninfer_jax import EngineConfig
from ninfer_jax.bench import trace as T
from ninfer_jax.compile_cache import CompileCounter
from ninfer_jax.program import program as P
from trace_helpers import write_lines


def _line(session, turn, text):
    return json.dumps({"session": session, "turn": turn, "ts": turn, "max_tokens": 3,
                       "messages": [{"role": "user", "content": text}], "reply": "Fine."})


def test_cold_run_reuses_the_loaded_model_and_compiled_steps(tmp_path, monkeypatch):
    loads, steps, xla = [], [], {}
    real_load, real_steps, real_replay = P.load_model, P.CompiledSteps, T.replay_once

    def counting_load(*args, **kw):
        loads.append(args)
        return real_load(*args, **kw)

    class CountingSteps(real_steps):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            steps.append(self)

    def counted_replay(config, program, trace, label, **kw):
        with CompileCounter() as counter:
            out = real_replay(config, program, trace, label, **kw)
        xla[label] = counter.compiled
        return out

    monkeypatch.setattr(P, "load_model", counting_load)
    monkeypatch.setattr(P, "CompiledSteps", CountingSteps)
    monkeypatch.setattr(T, "replay_once", counted_replay)
    path = write_lines(tmp_path / "chat.jsonl", [_line("a", 0, "What is the weather today?"),
                                                 _line("a", 1, "And tomorrow?")])
    fig = T.run_trace(path, EngineConfig(progress=False, max_concurrency=1, max_context=512), program="model")

    assert len(loads) == 1, "the model was loaded once per run"
    assert len(steps) == 1, "the steps were built once per run"
    buckets = [c.bucket for c in steps[0].compilations]
    assert buckets and len(buckets) == len(set(buckets)), "a bucket compiled twice"
    assert xla["cached run"] > 0 and xla["cold run"] == 0, xla
    # Still a cold baseline: the cache off, every prompt token prefilled, the same tokens.
    assert fig["cold_cache_disabled"] and fig["cached_tokens"] > 0
    assert fig["cold_prefill_tokens"] == fig["prompt_tokens"] > fig["prefill_tokens"]
    assert fig["outputs_identical"]
