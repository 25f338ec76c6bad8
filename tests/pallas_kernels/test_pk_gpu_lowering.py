"""Every kernel lowers to Triton for CUDA at small GPU-legal shapes, checked on CPU.

Cross-platform lowering runs the Pallas -> Triton IR lowering (power-of-two tensors, dot
shapes, supported primitives) without a GPU; Triton's own compilation still needs one
(scripts/device_check.py).
"""
import functools

import jax
import jax.numpy as jnp
import pytest

from pallas_kernels import conv1d, gdn, page_copy, paged_attention

S = jax.ShapeDtypeStruct
F32, BF16, I32 = jnp.float32, jnp.bfloat16, jnp.int32


def _cases(dt):
    pool = S((8, 16, 2, 32), dt)
    return {
        "write_kv": (paged_attention.write_kv, (pool, pool, S((2, 5, 2, 32), dt), S((2, 5, 2, 32), dt),
                                                S((2, 3), I32), S((2,), I32), S((2,), I32)), {}),
        "prefill_attention": (paged_attention.prefill_attention, (S((2, 5, 4, 32), dt), pool, pool,
                                                                  S((2, 3), I32), S((2,), I32), S((2,), I32)),
                              {"scale": 0.2}),
        "decode_attention": (paged_attention.decode_attention, (S((2, 4, 32), dt), pool, pool,
                                                                S((2, 3), I32), S((2,), I32)), {"scale": 0.2}),
        "chunk_gdn": (gdn.chunk_gated_delta_rule, (S((2, 20, 2, 16), dt), S((2, 20, 2, 16), dt),
                                                   S((2, 20, 2, 32), dt), S((2, 20, 2), F32), S((2, 20, 2), F32),
                                                   S((2, 2, 16, 32), F32)), {"chunk_size": 16}),
        "gdn_step": (gdn.recurrent_gated_delta_rule_step, (S((2, 2, 16), dt), S((2, 2, 16), dt), S((2, 2, 32), dt),
                                                           S((2, 2), F32), S((2, 2), F32), S((2, 2, 16, 32), F32)), {}),
        "conv_prefill": (conv1d.causal_conv1d_prefill, (S((2, 5, 64), dt), S((2, 3, 64), dt), S((64, 4), dt),
                                                        S((2,), I32)), {}),
        "conv_update": (conv1d.causal_conv1d_update, (S((2, 64), dt), S((2, 3, 64), dt), S((64, 4), dt)), {}),
        "gather": (page_copy.gather, (pool, S((3,), I32)), {}),
        "scatter": (page_copy.scatter, (pool, S((3,), I32), S((3, 16, 2, 32), dt)), {}),
        "copy": (page_copy.copy, (pool, S((3,), I32), S((3,), I32)), {}),
    }


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["f32", "bf16"])
def test_all_kernels_lower_to_triton(dtype):
    try:
        from jax.experimental.pallas import triton  # noqa: F401
    except ImportError:  # pragma: no cover - jaxlib without the Triton bindings
        pytest.skip("no Pallas Triton lowering in this jaxlib")
    for name, (fn, args, kw) in _cases(dtype).items():
        f = jax.jit(functools.partial(fn, backend="pallas", **kw))
        text = f.trace(*args).lower(lowering_platforms=("cuda",)).as_text()
        assert "triton" in text, name
