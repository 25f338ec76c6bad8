"""The shipped Qwen3.5 geometries (ninfer_jax/sim/geometries/qwen3_5_*): config-only folders the
cost-model Program sizes itself from. Their KV and StateImage bytes are computed here from each
config.json's numbers (not through the engine's code) and must be what `SimProgram.for_model`
gives the ledger; the weights `ninfer plan` charges are within 2% of the published parameter
count; each folder carries its own cost.json; and a tiny token-level trace replays on each, also
through `ninfer trace --program=sim --model=FOLDER`."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import ledger
from ninfer_jax import ContextCacheConfig, EngineConfig
from ninfer_jax.bench import trace as T
from ninfer_jax.model.config import load_config
from ninfer_jax.plan import plan_capacity
from ninfer_jax.sim import SimProgram
from trace_helpers import marconi_line, run_cli, write_lines

ROOT = Path(__file__).resolve().parents[2]
GEOMETRIES = ROOT / "ninfer_jax" / "sim" / "geometries"
GIB = 1 << 30
H200_NODE = 192 * GIB  # one 192 GiB device, as `ninfer plan --device_memory_bytes=206158430208`
# name: (published total parameters, published active parameters, device bytes to plan on).
# The 397B-A17B's bfloat16 weights (793 GB) need a node: plan it on eight 192 GiB devices' worth.
PUBLISHED = {
    "qwen3_5_27b": (27e9, 27e9, H200_NODE),
    "qwen3_5_35b_a3b": (35e9, 3e9, H200_NODE),
    "qwen3_5_397b_a17b": (397e9, 17e9, 8 * H200_NODE),
}
NAMES = sorted(PUBLISHED)


def test_every_shipped_qwen3_5_folder_is_covered_here():
    assert sorted(p.name for p in GEOMETRIES.glob("qwen3_5_*") if p.is_dir()) == NAMES
    for name in NAMES:
        assert {"config.json", "cost.json", "README.md"} <= {p.name for p in (GEOMETRIES / name).iterdir()}


def _text(name: str) -> dict:
    """The folder's language-model config: the wrapper's text_config (the HF Qwen3.5 layout)."""
    raw = json.loads((GEOMETRIES / name / "config.json").read_text())
    assert raw["model_type"] in ("qwen3_5", "qwen3_5_moe") and raw["torch_dtype"] == "bfloat16"
    return raw["text_config"]


def _independent(name: str) -> dict:
    """Sizes computed here from the JSON's numbers, in bfloat16 (2 B; the recurrent state is float32)."""
    c = _text(name)
    bf16, f32 = 2, 4
    types = c["layer_types"]
    assert len(types) == c["num_hidden_layers"] and set(types) == {"linear_attention", "full_attention"}
    attention = types.count("full_attention")
    linear = types.count("linear_attention")
    assert attention == c["num_hidden_layers"] // c["full_attention_interval"]  # every 4th layer, as published
    kv_per_token = 2 * attention * c["num_key_value_heads"] * c["head_dim"] * bf16  # K and V
    conv_channels = (2 * c["linear_num_key_heads"] * c["linear_key_head_dim"]
                     + c["linear_num_value_heads"] * c["linear_value_head_dim"])  # q, k, v
    conv_state = (c["linear_conv_kernel_dim"] - 1) * conv_channels * bf16
    recurrent = c["linear_num_value_heads"] * c["linear_key_head_dim"] * c["linear_value_head_dim"] * f32
    state = linear * (conv_state + recurrent) + c["hidden_size"] * bf16  # + the continuation hidden
    return dict(kv_per_token=kv_per_token, page=kv_per_token * ledger.PAGE_TOKENS, state=state,
                vocab=c["vocab_size"], eos=c["eos_token_id"])


# The figures docs/trace.md and each README state, pinned so a change to a config shows here.
EXPECTED = {
    "qwen3_5_27b": dict(kv_per_token=64 * 1024, state=153_954_304),  # 64 KiB, 146.8 MiB
    "qwen3_5_35b_a3b": dict(kv_per_token=20 * 1024, state=64_393_216),  # 20 KiB, 61.4 MiB
    "qwen3_5_397b_a17b": dict(kv_per_token=30 * 1024, state=192_069_632),  # 30 KiB, 183.2 MiB
}


def _config(name: str, **kw) -> EngineConfig:
    base = dict(model=str(GEOMETRIES / name), max_concurrency=8, max_context=32768, progress=False,
                device_memory_bytes=PUBLISHED[name][2],
                context_cache=ContextCacheConfig(host_capacity_bytes=64 * GIB))
    base.update(kw)
    return EngineConfig(**base)


@pytest.mark.parametrize("name", NAMES)
def test_kv_and_state_image_bytes_are_the_configs(name):
    want = _independent(name)
    assert {k: want[k] for k in EXPECTED[name]} == EXPECTED[name]
    sim = SimProgram.for_model(_config(name))
    assert sim.dtype == "bfloat16"
    assert sim.stores.pools[ledger.MAIN_KV].unit_bytes == want["page"]
    assert sim.stores.pools[ledger.STATE_POOL].unit_bytes == want["state"]
    assert sim.vocab_size == want["vocab"] and sim.eos_token_ids == (want["eos"],)
    assert sim.cost_source == str(GEOMETRIES / name / "cost.json")  # the folder's own estimates
    model = load_config(str(GEOMETRIES / name))
    plan = plan_capacity(_config(name), model, 2)
    assert (sim.capacity.kv_pages, sim.capacity.state_slots) == (plan.capacity.kv_pages, plan.capacity.state_slots)
    assert sim.state.arena.capacity == 64 * GIB  # the Host arena in bytes, nothing allocated


@pytest.mark.parametrize("name", NAMES)
def test_weights_match_the_published_parameter_count(name):
    total, active, _ = PUBLISHED[name]
    model = load_config(str(GEOMETRIES / name))
    plan = plan_capacity(_config(name), model, 2)
    # The device-resident parameters (no vision tower, no MTP head: both stay off the device).
    assert abs(plan.parameters - total) / total < 0.02, plan.parameters
    assert plan.weights_bytes == 2 * plan.parameters
    c = _text(name)
    # What one token multiplies through: all but the embedding table (a lookup) and, for the MoE
    # sizes, the experts its router does not pick; within 10% of the published active count.
    unrouted = 0
    if "num_experts" in c:
        unrouted = c["num_hidden_layers"] * 3 * c["hidden_size"] * c["moe_intermediate_size"] * (
            c["num_experts"] - c["num_experts_per_tok"])
    computed = plan.parameters - unrouted - c["vocab_size"] * c["hidden_size"]
    assert abs(computed - active) / active < 0.1, computed


def test_the_397b_is_refused_on_one_192_gib_device_where_the_27b_fits():
    """The 397B-A17B's weights alone exceed one 192 GiB device (a ConfigError naming the flag);
    the dense 27B fits with room to spare."""
    from ninfer_jax.errors import ConfigError

    model = load_config(str(GEOMETRIES / "qwen3_5_397b_a17b"))
    with pytest.raises(ConfigError) as e:
        plan_capacity(_config("qwen3_5_397b_a17b", device_memory_bytes=H200_NODE), model, 2)
    assert e.value.field == "device_memory_bytes"
    plan = plan_capacity(_config("qwen3_5_27b"), load_config(str(GEOMETRIES / "qwen3_5_27b")), 2)
    assert plan.free_bytes > 0


def _trace(tmp_path, name) -> str:
    """One session of three turns, each extending the previous prompt and output, over ids only a
    Qwen3.5-sized vocabulary (248,320) has."""
    system = list(range(248_000, 248_200))
    lines, prompt = [], None
    for turn in range(3):
        prompt = (system + [7]) if prompt is None else prompt + [100 + turn] * 4 + [247_000 + turn] * 20
        lines.append(marconi_line(0, turn, float(turn), prompt, [100 + turn] * 4))
    return write_lines(tmp_path / f"{name}.jsonl", lines)


@pytest.mark.parametrize("name", NAMES)
def test_a_tiny_trace_replays_on_the_geometry(tmp_path, name):
    want = _independent(name)
    f = T.run_trace(_trace(tmp_path, name), _config(name, max_context=2048, chunk_size=256), program="sim",
                    cold=False)
    assert f["requests_failed"] == 0 and f["forced_outputs"] == 3
    assert f["pools"]["main_kv"]["unit_bytes"] == want["page"]  # the report shows the real sizes
    assert f["pools"]["state_slots"]["unit_bytes"] == want["state"]
    assert f["sim_cost"]["source"].endswith(f"{name}/cost.json")
    assert f["cached_tokens"] > 0  # later turns reuse the earlier prompts


@pytest.mark.parametrize("name", NAMES)
def test_ninfer_trace_program_sim_on_the_folder(tmp_path, capsys, name):
    code, out, err = run_cli(capsys, "trace", _trace(tmp_path, name), "--program=sim", f"--model={GEOMETRIES / name}",
                          "--json", "--max_concurrency=2", "--max_context=2048", "--chunk_size=256", "--cold=false",
                          f"--device_memory_bytes={PUBLISHED[name][2]}", f"--host_capacity_bytes={16 * GIB}")
    assert code == 0, err
    f = json.loads(out)
    assert f["requests_failed"] == 0 and f["requests"] == 3
    assert f["pools"]["state_slots"]["unit_bytes"] == _independent(name)["state"]
