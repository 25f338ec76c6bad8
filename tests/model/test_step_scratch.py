"""A decode step holds one layer's gathered state at a time (issue 33, `pools.ordered_after`).

Each GDN layer reads its StateImage through the rows' slots. Read through an index that depends
on nothing the step computes, every layer's read was hoisted to the start of the step, and the
step's scratch grew by one layer's float32 state per layer. Compiled scratch sizes
(`memory_analysis`) are deterministic: no timing here."""
import jax
import jax.numpy as jnp
import pytest

from ninfer_jax.model.compiled import CompiledSteps
from ninfer_jax.model.config import parse_config
from ninfer_jax.model.model import Model
from ninfer_jax.model.modules import init_params
from ninfer_jax.model.pools import PAGE_SIZE, init_pools

ROWS = 8


def _config(layers: int) -> dict:
    return {"model_type": "qwen3_5_text", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": layers,
            "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * (layers // 4),
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
            "linear_conv_kernel_dim": 4, "linear_key_head_dim": 64, "linear_value_head_dim": 64,
            "linear_num_key_heads": 4, "linear_num_value_heads": 4, "rms_norm_eps": 1e-6,
            "tie_word_embeddings": True, "max_position_embeddings": 4096}


def _decode_scratch(layers: int) -> tuple[int, int]:
    """(scratch bytes of the 8-row decode step, one GDN layer's recurrent state for 8 rows)."""
    cfg = parse_config(_config(layers))
    params, _ = init_params(cfg, 0)
    model = Model(config=cfg, params=jax.tree.map(jnp.asarray, params), dtype=jnp.float32, name="random")
    steps = CompiledSteps(model, progress=False)
    kv, state = init_pools(cfg, ROWS, ROWS, model.dtype, steps.backend)
    args = (jnp.arange(ROWS, dtype=jnp.int32), jnp.full((ROWS,), PAGE_SIZE - 1, jnp.int32),
            jnp.arange(ROWS, dtype=jnp.int32).reshape(ROWS, 1), jnp.arange(ROWS, dtype=jnp.int32))
    steps.decode(kv, state, *args)
    exe = next(e for bucket, e in steps._executables.items() if bucket[0] == "decode")
    return exe.memory_analysis().temp_size_in_bytes, state["recurrent"][0].nbytes // ROWS * ROWS


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the scratch sizes are read on the CPU backend")
def test_decode_scratch_does_not_grow_with_layers():
    small, layer_state = _decode_scratch(4)
    large, _ = _decode_scratch(12)
    # 12 layers hold 6 more GDN layers than 4: hoisted reads would add 6 states' worth (and more
    # in float32 copies); one layer at a time adds nothing but rounding.
    assert large - small < layer_state, (small, large, layer_state)
