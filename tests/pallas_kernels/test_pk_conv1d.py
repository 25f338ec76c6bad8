import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pk_naive
from pallas_kernels import conv1d

R, T, C, K = 3, 6, 8, 4


def _inputs(seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((R, T, C)).astype(np.float32)
    state = rng.standard_normal((R, K - 1, C)).astype(np.float32)
    w = rng.standard_normal((C, K)).astype(np.float32)
    return x, state, w


def test_prefill_reference_matches_loop():
    x, state, w = _inputs(0)
    lengths = np.array([6, 2, 0], np.int32)
    y, s = jax.jit(conv1d.causal_conv1d_prefill)(x, state, w, lengths)
    want_y, want_s = pk_naive.conv1d(x, state, w, lengths)
    np.testing.assert_allclose(np.asarray(y), want_y, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(s), want_s, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(s)[2], state[2])  # lengths 0: unchanged


def test_prefill_matches_transformers_semantics_fresh_request():
    # Zero state + full length is plain causal conv with left zero padding.
    x, _, w = _inputs(1)
    zeros = np.zeros((R, K - 1, C), np.float32)
    y, s = conv1d.causal_conv1d_prefill(x, zeros, w, np.full((R,), T, np.int32))
    xp = np.concatenate([zeros, x], axis=1)
    acc = np.stack([sum(w[:, j] * xp[:, t + j] for j in range(K)) for t in range(T)], axis=1)
    np.testing.assert_allclose(np.asarray(y), acc / (1 + np.exp(-acc)), atol=1e-5)
    np.testing.assert_array_equal(np.asarray(s), x[:, -(K - 1):])


def test_update_matches_loop_and_dtypes():
    x, state, w = _inputs(2)
    y, s = jax.jit(conv1d.causal_conv1d_update)(x[:, 0], state, w)
    want_y, want_s = pk_naive.conv1d(x[:, :1], state, w, np.ones((R,), np.int32))
    np.testing.assert_allclose(np.asarray(y), want_y[:, 0], atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(s), want_s, atol=1e-6)
    yb, sb = conv1d.causal_conv1d_update(jnp.asarray(x[:, 0], jnp.bfloat16), state, w)
    assert yb.dtype == jnp.bfloat16 and sb.dtype == jnp.float32


def test_validation_errors():
    x, state, w = _inputs(3)
    lengths = np.full((R,), T, np.int32)
    with pytest.raises(ValueError, match="backend"):
        conv1d.causal_conv1d_prefill(x, state, w, lengths, backend="gpu")
    with pytest.raises(ValueError, match="conv_state"):
        conv1d.causal_conv1d_prefill(x, state[:, :2], w, lengths)
    with pytest.raises(ValueError, match="weight"):
        conv1d.causal_conv1d_update(x[:, 0], state, w[:4])
    with pytest.raises(ValueError, match="lengths"):
        conv1d.causal_conv1d_prefill(x, state, w, lengths[:2])


@pytest.mark.parametrize("t", [6, 37])  # one partial time block; several blocks + tail
def test_interpret_prefill_matches_reference(t):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((R, t, C)).astype(np.float32)
    _, state, w = _inputs(4)
    lengths = np.array([t, t // 2, 0], np.int32)
    got = conv1d.causal_conv1d_prefill(x, state, w, lengths, backend="interpret")
    want = conv1d.causal_conv1d_prefill(x, state, w, lengths)
    np.testing.assert_allclose(np.asarray(got[0]), np.asarray(want[0]), atol=1e-5, rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))


def test_interpret_update_matches_reference():
    x, state, w = _inputs(5)
    got = conv1d.causal_conv1d_update(x[:, 0], state, w, backend="interpret")
    want = conv1d.causal_conv1d_update(x[:, 0], state, w)
    np.testing.assert_allclose(np.asarray(got[0]), np.asarray(want[0]), atol=1e-5, rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))
