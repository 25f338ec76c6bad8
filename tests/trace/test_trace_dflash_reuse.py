"""Issue 35: DFlash loses no prefix hit. The agent trace replayed on the built-in model at C = 1
(one request at a time, so both runs meet the same cache states) gives the same hits, cached and
prefilled tokens with the shipped drafter as without drafts, and outputs equal to cold."""
from ninfer_jax import EngineConfig
from ninfer_jax.bench import trace as T
from ninfer_jax.bench import trace_gen


def test_dflash_reuse_equals_no_drafts(tmp_path):
    path = tmp_path / "agent.jsonl"
    assert trace_gen.main(["--kind", "agent", "--sessions", "3", "--seed", "4", "--out", str(path)]) == 0
    base = dict(progress=False, max_concurrency=1, max_context=2048)  # the generator keeps prompts under it
    off = T.run_trace(str(path), EngineConfig(**base), program="model", cold=False)  # its cold run: the suite's
    on = T.run_trace(str(path), EngineConfig(**base, speculative_tokens=3, speculative_method="dflash"),
                     program="model")
    keys = ("requests", "cache_hits", "cached_tokens", "prefill_tokens", "generated_tokens", "branch_points")
    assert {k: on[k] for k in keys} == {k: off[k] for k in keys}
    assert off["cache_hits"] >= 3 and off["cached_tokens"] > 0
    assert on["outputs_identical"] and on["requests_failed"] == off["requests_failed"] == 0
    assert "backend_kv:dflash" in on["pools"]
