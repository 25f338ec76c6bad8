"""The cost-model Program on a real model's geometry from its config.json alone: the shipped
Qwen3-Next-80B-A3B folder gives the real unit sizes and the capacity the real Program would
resolve, and a token-level trace replays on it with Qwen-sized ids, never folded."""
from __future__ import annotations

import json
from pathlib import Path

import ledger
from ninfer_jax import ContextCacheConfig, EngineConfig
from ninfer_jax.bench import trace as T
from ninfer_jax.model.config import load_config
from ninfer_jax.plan import plan_capacity
from ninfer_jax.sim import SimProgram
from trace_helpers import marconi_line, write_lines

ROOT = Path(__file__).resolve().parents[2]
GEOMETRY = ROOT / "ninfer_jax" / "sim" / "geometries" / "qwen3_next_80b_a3b"
GIB = 1 << 30


def _independent_sizes():
    """KV page and StateImage bytes computed here from the JSON, not by the engine's code."""
    c = json.loads((GEOMETRY / "config.json").read_text())
    bf16 = 2
    attention = c["num_hidden_layers"] // c["full_attention_interval"]
    linear = c["num_hidden_layers"] - attention
    kv_per_token = 2 * attention * c["num_key_value_heads"] * c["head_dim"] * bf16
    conv = 2 * c["linear_num_key_heads"] * c["linear_key_head_dim"] + c["linear_num_value_heads"] * c["linear_value_head_dim"]
    recurrent = c["linear_num_value_heads"] * c["linear_key_head_dim"] * c["linear_value_head_dim"] * 4  # float32
    state = linear * ((c["linear_conv_kernel_dim"] - 1) * conv * bf16 + recurrent) + c["hidden_size"] * bf16
    return kv_per_token * ledger.PAGE_TOKENS, state, c["vocab_size"], c["eos_token_id"]


def _config(**kw):
    base = dict(model=str(GEOMETRY), max_concurrency=8, max_context=32768, progress=False,
                device_memory_bytes=192 * GIB, context_cache=ContextCacheConfig(host_capacity_bytes=64 * GIB))
    base.update(kw)
    return EngineConfig(**base)


def test_unit_sizes_and_capacity_are_the_real_programs():
    page, state, vocab, eos = _independent_sizes()
    assert page == 64 * 24 * 1024 and 73 << 20 < state < 74 << 20  # ~24 KiB per token, ~74 MiB per image
    cfg = _config()
    sim = SimProgram.for_model(cfg)
    assert sim.stores.pools[ledger.MAIN_KV].unit_bytes == page
    assert sim.stores.pools[ledger.STATE_POOL].unit_bytes == state
    assert sim.vocab_size == vocab and sim.eos_token_ids == (eos,) and sim.dtype == "bfloat16"
    plan = plan_capacity(cfg, load_config(str(GEOMETRY)), 2)
    assert (sim.capacity.kv_pages, sim.capacity.state_slots) == (plan.capacity.kv_pages, plan.capacity.state_slots)
    assert sim.state.arena.capacity == 64 * GIB  # the Host arena in bytes, nothing allocated


def test_a_token_level_trace_with_qwen_ids_replays_on_the_geometry(tmp_path):
    system = list(range(150_000, 150_400))  # ids only a Qwen-sized vocabulary has
    lines, prompt = [], None
    for turn in range(3):
        prompt = (system + [7]) if prompt is None else prompt + [100 + turn] * 8 + [151_000 + turn] * 30
        lines.append(marconi_line(0, turn, float(turn), prompt, [100 + turn] * 8))
    path = write_lines(tmp_path / "qwen.jsonl", lines)
    cfg = _config(max_context=2048, chunk_size=256)
    f = T.run_trace(path, cfg, program="sim", cold=False)
    assert f["requests_failed"] == 0 and f["forced_outputs"] == 3
    # Turns 2 and 3 extend the previous prompt and its output: at least the previous prompt is
    # reused (E, one StateImage of ~74 MiB away on the Host, may cost more than the 7 tokens it
    # saves over the prompt end: SRC-3 prices it with the geometry's real bytes).
    assert f["cached_tokens"] >= (len(system) + 1) + (len(system) + 1 + 8 + 30)


def test_cost_model_from_the_geometry_folder_or_a_file(tmp_path):
    import pytest

    from ninfer_jax.errors import ConfigError
    from ninfer_jax.sim.program import CostModel

    sim = SimProgram.for_model(_config())
    assert sim.cost_source.endswith("cost.json") and sim.cost.prefill_per_token == 1.5e-05  # the folder's own
    mine = tmp_path / "cost.json"
    mine.write_text(json.dumps({"_note": "measured", "prefill_per_token": 3e-5, "h2d_bytes_per_s": 5e10}))
    sim = SimProgram.for_model(_config(), str(mine))
    assert (sim.cost.prefill_per_token, sim.cost.h2d_bytes_per_s, sim.cost.decode_fixed) == (3e-5, 5e10,
                                                                                            CostModel().decode_fixed)
    assert SimProgram.for_model(EngineConfig(progress=False)).cost_source == "default"
    for bad, needle in (({"prefill_per_tok": 1.0}, "unknown field 'prefill_per_tok'"),
                        ({"decode_fixed": -1}, "decode_fixed must be a positive number"), ([1], "JSON object")):
        mine.write_text(json.dumps(bad))
        with pytest.raises(ConfigError, match=needle):
            CostModel.load(str(mine))
    lines = [marconi_line(0, 0, 0.0, [5, 6, 7, 8], [9])]
    f = T.run_trace(write_lines(tmp_path / "t.jsonl", lines), _config(max_context=2048, chunk_size=256),
                    program="sim", cold=False)
    assert f["sim_cost"]["source"].endswith("cost.json") and f["sim_cost"]["decode_per_row"] == 0.0005
