import jax
import numpy as np
import pytest

import pk_naive
from pallas_kernels import gdn


def _inputs(seed, r=2, t=11, h=2, dk=8, dv=4):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((r, t, h, dk)).astype(np.float32)
    k = rng.standard_normal((r, t, h, dk)).astype(np.float32)
    q /= np.linalg.norm(q, axis=-1, keepdims=True) * np.sqrt(dk)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((r, t, h, dv)).astype(np.float32)
    g = rng.uniform(-5.0, 0.0, (r, t, h)).astype(np.float32)
    beta = rng.uniform(0.0, 1.0, (r, t, h)).astype(np.float32)
    s0 = rng.standard_normal((r, h, dk, dv)).astype(np.float32)
    return q, k, v, g, beta, s0


def _close(got, want, tol=1e-5):
    np.testing.assert_allclose(np.asarray(got), want, rtol=tol, atol=tol * max(1.0, np.abs(want).max()))


def test_sequential_reference_matches_loop():
    args = _inputs(0)
    o, s = jax.jit(gdn.recurrent_gated_delta_rule_reference)(*args)
    want_o, want_s = pk_naive.gated_delta_rule(*args)
    _close(o, want_o)
    _close(s, want_s)


@pytest.mark.parametrize("chunk_size", [4, 16])  # 11 tokens: partial last chunk / one short chunk
def test_chunked_matches_loop(chunk_size):
    args = _inputs(1)
    fn = jax.jit(gdn.chunk_gated_delta_rule, static_argnames="chunk_size")
    o, s = fn(*args, chunk_size=chunk_size)
    want_o, want_s = pk_naive.gated_delta_rule(*args)
    assert o.dtype == np.float32 and s.dtype == np.float32
    _close(o, want_o)
    _close(s, want_s)


def test_chunked_matches_sequential_realistic_dims():
    # Larger head dims and a full 64-token chunk: the WY solve stays within ~1e-5.
    args = _inputs(2, r=1, t=150, h=1, dk=32, dv=16)
    o, s = gdn.chunk_gated_delta_rule(*args)
    ro, rs = gdn.recurrent_gated_delta_rule_reference(*args)
    _close(o, np.asarray(ro))
    _close(s, np.asarray(rs))


def test_zero_g_beta_tokens_leave_state_unchanged():
    q, k, v, g, beta, s0 = _inputs(3, t=8)
    g[0, 5:] = 0.0
    beta[0, 5:] = 0.0
    o, s = gdn.chunk_gated_delta_rule(q, k, v, g, beta, s0, chunk_size=4)
    _, s5 = gdn.chunk_gated_delta_rule(q[:, :5], k[:, :5], v[:, :5], g[:, :5], beta[:, :5], s0, chunk_size=4)
    _close(s[0], np.asarray(s5[0]))


def test_step_matches_loop():
    q, k, v, g, beta, s0 = _inputs(4, t=1)
    o, s = jax.jit(gdn.recurrent_gated_delta_rule_step)(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], s0)
    want_o, want_s = pk_naive.gated_delta_rule(q, k, v, g, beta, s0)
    _close(o, want_o[:, 0])
    _close(s, want_s)


def test_validation_errors():
    q, k, v, g, beta, s0 = _inputs(5)
    with pytest.raises(ValueError, match="backend"):
        gdn.chunk_gated_delta_rule(q, k, v, g, beta, s0, backend="tpu")
    with pytest.raises(ValueError, match="initial_state"):
        gdn.chunk_gated_delta_rule(q, k, v, g, beta, s0[:, :1])
    with pytest.raises(ValueError, match="chunk_size"):
        gdn.chunk_gated_delta_rule(q, k, v, g, beta, s0, chunk_size=0)
    with pytest.raises(ValueError, match="beta"):
        gdn.recurrent_gated_delta_rule_step(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta, s0)


def test_interpret_chunk_matches_reference():
    # Dv 8 with value blocks of 8; 11 tokens with chunk 4: padded last chunk.
    args = _inputs(6, r=2, t=11, h=2, dk=8, dv=8)
    o, s = gdn.chunk_gated_delta_rule(*args, chunk_size=4, backend="interpret")
    ro, rs = gdn.chunk_gated_delta_rule(*args, chunk_size=4)
    _close(o, np.asarray(ro))
    _close(s, np.asarray(rs))


def test_interpret_step_matches_reference():
    *per_token, s0 = _inputs(7, t=1)
    q, k, v, g, beta = (a[:, 0] for a in per_token)
    o, s = gdn.recurrent_gated_delta_rule_step(q, k, v, g, beta, s0, backend="interpret")
    ro, rs = gdn.recurrent_gated_delta_rule_step(q, k, v, g, beta, s0)
    _close(o, np.asarray(ro))
    _close(s, np.asarray(rs))
