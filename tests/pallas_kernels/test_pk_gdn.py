"""The gated delta rule (pallas_kernels/gdn.py): each form against an independent one.

Three oracles stand behind each other: `pk_naive.gated_delta_rule` (a float64 numpy loop, one
token at a time: the recurrence of gdn.py's docstring written out), the sequential reference
`recurrent_gated_delta_rule_reference` (lax.scan, also the "xla" backend), and the chunked
reference `chunk_gated_delta_rule_reference` (the WY form, the Pallas kernel's own oracle).
The chunked reference is checked against the loop and the sequential reference, and the Pallas
kernel (backend "interpret", on CPU) against the chunked reference and the loop, over shapes
(1 token, lengths that are not a multiple of the chunk, one short chunk, several rows, heads
and value blocks) and input dtypes (float32; bfloat16, which every form upcasts to float32),
always from a random initial state.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pk_naive
from pallas_kernels import gdn

STRONG, WEAK = (-5.0, 0.0), (-0.05, 0.0)  # log decays g: strong (short memory), weak (long memory)

# (rows, tokens, heads, Dk, Dv, chunk, decay)
SHAPES = {
    "one_token": (1, 1, 1, 8, 8, 4, STRONG),
    "partial_last_chunk": (2, 11, 2, 8, 8, 4, STRONG),
    "whole_chunks_3_heads": (1, 16, 3, 16, 16, 8, STRONG),
    "one_short_chunk": (2, 7, 2, 8, 4, 16, STRONG),
    "two_value_blocks": (1, 9, 1, 8, 128, 4, STRONG),  # Dv 128: the kernel's grid has 2 blocks of 64
    "realistic_dims": (1, 150, 1, 32, 16, 64, STRONG),  # 3 chunks of 64, the last partial
    "weak_decay": (1, 40, 2, 16, 16, 16, WEAK),  # the state carries across all 3 chunks
}
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
# Every form upcasts bfloat16 inputs to float32 first: a few shapes cover that path (each case
# compiles its own programs, and the interpret mode is slow).
BF16_SHAPES = ("one_token", "partial_last_chunk", "realistic_dims")
CASES = [(s, "float32") for s in SHAPES] + [(s, "bfloat16") for s in BF16_SHAPES]
TOL = 1e-5  # float32 arithmetic against the float64 loop on the same input values, whatever their dtype
BF16_TOL = 2e-2  # bfloat16 inputs against float32 inputs: the inputs' rounding (2**-8), propagated


def _inputs(seed, r=2, t=11, h=2, dk=8, dv=4, decay=STRONG):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((r, t, h, dk)).astype(np.float32)
    k = rng.standard_normal((r, t, h, dk)).astype(np.float32)
    q /= np.linalg.norm(q, axis=-1, keepdims=True) * np.sqrt(dk)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((r, t, h, dv)).astype(np.float32)
    g = rng.uniform(*decay, (r, t, h)).astype(np.float32)
    beta = rng.uniform(0.0, 1.0, (r, t, h)).astype(np.float32)
    s0 = rng.standard_normal((r, h, dk, dv)).astype(np.float32)
    return q, k, v, g, beta, s0


def _case(name, dtype, seed=0):
    """(args in `dtype` with the float32 state, the chunk size, the loop's answer for exactly those
    values, the loop's answer for the float32 values they were rounded from)."""
    r, t, h, dk, dv, chunk, decay = SHAPES[name]
    f32 = _inputs(seed, r, t, h, dk, dv, decay)
    args = tuple(jnp.asarray(x, DTYPES[dtype]) for x in f32[:5]) + (jnp.asarray(f32[5]),)
    exact = pk_naive.gated_delta_rule(*(np.asarray(x, np.float32) for x in args))
    return args, chunk, exact, pk_naive.gated_delta_rule(*f32)


def _close(got, want, tol=TOL):
    np.testing.assert_allclose(np.asarray(got), want, rtol=tol, atol=tol * max(1.0, np.abs(want).max()))


def _check(got, exact, from_f32, dtype):
    o, s = got
    assert o.dtype == np.float32 and s.dtype == np.float32
    assert o.shape == exact[0].shape and s.shape == exact[1].shape
    _close(o, exact[0])
    _close(s, exact[1])
    if dtype == "bfloat16":
        _close(o, from_f32[0], BF16_TOL)
        _close(s, from_f32[1], BF16_TOL)


_chunk_reference = jax.jit(gdn.chunk_gated_delta_rule_reference, static_argnames="chunk_size")
_sequential_reference = jax.jit(gdn.recurrent_gated_delta_rule_reference)


# ----------------------------------------------------------------------------- the chunked reference


@pytest.mark.parametrize("shape, dtype", CASES)
def test_chunked_reference_matches_sequential_and_loop(shape, dtype):
    args, chunk, exact, from_f32 = _case(shape, dtype)
    got = _chunk_reference(*args, chunk_size=chunk)
    _check(got, exact, from_f32, dtype)
    seq = _sequential_reference(*args)
    _close(got[0], np.asarray(seq[0]))
    _close(got[1], np.asarray(seq[1]))


def test_chunked_reference_does_not_depend_on_the_chunk_size():
    args, _, exact, _ = _case("realistic_dims", "float32", seed=8)
    for chunk in (1, 256):  # 1: every token its own chunk; 256: one short chunk (64: the other tests)
        o, s = _chunk_reference(*args, chunk_size=chunk)
        _close(o, exact[0])
        _close(s, exact[1])


# ----------------------------------------------------------------------------- the Pallas kernel


@pytest.mark.parametrize("shape, dtype", CASES)
def test_interpret_chunk_matches_chunked_reference_and_loop(shape, dtype):
    args, chunk, exact, from_f32 = _case(shape, dtype, seed=6)
    got = gdn.chunk_gated_delta_rule(*args, chunk_size=chunk, backend="interpret")
    _check(got, exact, from_f32, dtype)
    ro, rs = _chunk_reference(*args, chunk_size=chunk)  # the kernel's own oracle: the same WY form
    _close(got[0], np.asarray(ro))
    _close(got[1], np.asarray(rs))


@pytest.mark.parametrize("dtype", DTYPES)
def test_interpret_step_matches_reference_and_loop(dtype):
    *per_token, s0 = _inputs(7, r=2, t=1, h=2, dk=8, dv=128)  # Dv 128: 2 value blocks of 64
    q, k, v, g, beta = (jnp.asarray(a[:, 0], DTYPES[dtype]) for a in per_token)
    want_o, want_s = pk_naive.gated_delta_rule(*(np.asarray(a, np.float32)[:, None] for a in (q, k, v, g, beta)), s0)
    o, s = gdn.recurrent_gated_delta_rule_step(q, k, v, g, beta, s0, backend="interpret")
    ro, rs = gdn.recurrent_gated_delta_rule_step(q, k, v, g, beta, s0)
    assert o.dtype == np.float32 and s.dtype == np.float32
    _close(o, want_o[:, 0])
    _close(s, want_s)
    _close(o, np.asarray(ro))
    _close(s, np.asarray(rs))


# ----------------------------------------------------------------------------- the sequential forms


def test_sequential_reference_matches_loop():
    args = _inputs(0)
    o, s = _sequential_reference(*args)
    want_o, want_s = pk_naive.gated_delta_rule(*args)
    _close(o, want_o)
    _close(s, want_s)


@pytest.mark.parametrize("chunk_size", [4, 16])  # 11 tokens: partial last chunk / one short chunk
def test_xla_backend_matches_loop(chunk_size):
    # The "xla" backend runs the sequential recurrence whatever the chunk size (gdn.py: resumed
    # prefills stay bit-identical to cold ones).
    args = _inputs(1)
    fn = jax.jit(gdn.chunk_gated_delta_rule, static_argnames="chunk_size")
    o, s = fn(*args, chunk_size=chunk_size)
    want_o, want_s = pk_naive.gated_delta_rule(*args)
    assert o.dtype == np.float32 and s.dtype == np.float32
    _close(o, want_o)
    _close(s, want_s)


def test_zero_g_beta_tokens_leave_state_unchanged():
    q, k, v, g, beta, s0 = _inputs(3, t=8)
    g[0, 5:] = 0.0
    beta[0, 5:] = 0.0
    for fn in (gdn.chunk_gated_delta_rule, _chunk_reference):
        _, s = fn(q, k, v, g, beta, s0, chunk_size=4)
        _, s5 = fn(q[:, :5], k[:, :5], v[:, :5], g[:, :5], beta[:, :5], s0, chunk_size=4)
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
