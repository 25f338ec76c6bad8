"""The kernel wrappers' static checks: a typed KernelArgumentError (a ValueError) that names the
argument, raised at trace time under jit, on every backend."""
import jax
import jax.numpy as jnp
import pytest

from pallas_kernels import conv1d, gdn, page_copy, paged_attention
from pallas_kernels._common import KernelArgumentError

R, T, H, DK, DV, C = 2, 8, 2, 16, 16, 24


def _gdn_args(t=T):
    f = lambda *s: jnp.zeros(s, jnp.float32)  # noqa: E731
    return f(R, t, H, DK), f(R, t, H, DK), f(R, t, H, DV), f(R, t, H), f(R, t, H), f(R, H, DK, DV)


@pytest.mark.parametrize("backend", ["xla", "interpret"])
def test_gdn_state_must_be_float32(backend):
    q, k, v, g, beta, s0 = _gdn_args()
    with pytest.raises(KernelArgumentError, match="initial_state must be float32"):
        gdn.chunk_gated_delta_rule(q, k, v, g, beta, s0.astype(jnp.bfloat16), chunk_size=4, backend=backend)
    with pytest.raises(KernelArgumentError, match="state must be float32"):
        gdn.recurrent_gated_delta_rule_step(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0],
                                            s0.astype(jnp.bfloat16), backend=backend)


def test_gdn_inputs_must_be_floating_and_checked_under_jit():
    q, k, v, g, beta, s0 = _gdn_args()
    step = jax.jit(gdn.recurrent_gated_delta_rule_step)
    with pytest.raises(KernelArgumentError, match="beta must be a floating array"):
        step(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0].astype(jnp.int32), s0)
    with pytest.raises(KernelArgumentError, match=r"g has shape \(2, 8\)"):
        step(q[:, 0], k[:, 0], v[:, 0], g[:, :, 0], beta[:, 0], s0)


def test_conv_and_attention_dtypes():
    x = jnp.zeros((R, T, C), jnp.float32)
    state, w = jnp.zeros((R, 3, C), jnp.float32), jnp.zeros((C, 4), jnp.float32)
    with pytest.raises(KernelArgumentError, match="x must be a floating array"):
        conv1d.causal_conv1d_prefill(x.astype(jnp.int32), state, w, jnp.zeros(R, jnp.int32))
    with pytest.raises(KernelArgumentError, match="lengths must be an integer array"):
        conv1d.causal_conv1d_prefill(x, state, w, jnp.zeros(R, jnp.float32))
    kp = jnp.zeros((4, 16, 2, 16), jnp.float32)
    table, rows = jnp.zeros((R, 2), jnp.int32), jnp.zeros(R, jnp.int32)
    with pytest.raises(KernelArgumentError, match="q must be a floating array"):
        paged_attention.decode_attention(jnp.zeros((R, 4, 16), jnp.int32), kp, kp, table, rows, scale=0.25)
    with pytest.raises(KernelArgumentError, match="k_new must be a floating array"):
        paged_attention.write_kv(kp, kp, jnp.zeros((R, T, 2, 16), jnp.int32), jnp.zeros((R, T, 2, 16)), table,
                                 rows, rows)


def test_errors_stay_value_errors():
    """Callers catching ValueError (the engine, older tests) still do."""
    assert issubclass(KernelArgumentError, ValueError)
    with pytest.raises(ValueError, match="idx has shape"):
        page_copy.gather(jnp.zeros((4, 3)), jnp.zeros((2, 1), jnp.int32))
