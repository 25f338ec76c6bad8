"""Gated delta rule (the Gated DeltaNet recurrence), chunked prefill and one-token decode step.

Per token, per (row, head), with state S [Dk, Dv] (float32):
    S  <- S * exp(g_t)
    kv  = k_t^T S
    d   = beta_t * (v_t - kv)
    S  <- S + k_t (x) d
    o_t = q_t^T S
Semantics of transformers' `torch_recurrent_gated_delta_rule` (qwen3_next) WITHOUT its
l2-norm and Dk**-0.5 scaling: the caller normalises q and k, scales q and expands heads.
A token with g = 0 and beta = 0 leaves S unchanged; callers use that to pad ragged rows.

Chunked form (the "xla" backend and the Pallas kernel), per chunk of C tokens with
G = cumsum(g) inside the chunk and the state S0 entering the chunk:
    A[t, s] = beta_t exp(G_t - G_s) k_t.k_s            (s < t, else 0)
    (I + A) [W | U0] = [beta exp(G) K | beta V]        (unit lower-triangular solve)
    U = U0 - W S0                                       (the deltas d_t of the chunk)
    O = exp(G) Q S0 + (exp(G_t - G_s) q_t.k_s)_{s<=t} U
    S = exp(G_C) S0 + (exp(G_C - G) K)^T U
Everything that does not depend on S0 is computed for all chunks at once; the scan over
chunks only does the four state matmuls.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels._common import (
    HIGHEST,
    KernelArgumentError,
    check_backend,
    check_dims,
    check_float,
    check_float32,
    check_ndim,
    dot,
    dot_tn,
    is_pow2,
    largest_pow2_divisor,
    pallas_params,
    tree_sum,
)

_BLOCK_V = 64  # value columns per program: state columns evolve independently

_f32 = jnp.float32


def _mm(spec, *xs):
    return jnp.einsum(spec, *xs, precision=HIGHEST)


# ----------------------------------------------------------------------------- validation


def _validate_chunk(q, k, v, g, beta, initial_state, chunk_size):
    check_ndim("q", q, 4, "[R, T, H, Dk]")
    r, t, h, dk = q.shape
    check_dims("k", k, (r, t, h, dk), f"[{r}, {t}, {h}, {dk}] (q's shape)")
    check_ndim("v", v, 4, "[R, T, H, Dv]")
    dv = v.shape[-1]
    check_dims("v", v, (r, t, h, dv), f"[{r}, {t}, {h}, Dv]")
    check_dims("g", g, (r, t, h), f"[{r}, {t}, {h}]")
    check_dims("beta", beta, (r, t, h), f"[{r}, {t}, {h}]")
    check_dims("initial_state", initial_state, (r, h, dk, dv), f"[{r}, {h}, {dk}, {dv}]")
    _check_dtypes(q=q, k=k, v=v, g=g, beta=beta)
    check_float32("initial_state", initial_state)
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise KernelArgumentError(f"chunk_size must be a positive int, got {chunk_size!r}")


def _validate_step(q, k, v, g, beta, state):
    check_ndim("q", q, 3, "[B, H, Dk]")
    b, h, dk = q.shape
    check_dims("k", k, (b, h, dk), f"[{b}, {h}, {dk}] (q's shape)")
    check_ndim("v", v, 3, "[B, H, Dv]")
    dv = v.shape[-1]
    check_dims("v", v, (b, h, dv), f"[{b}, {h}, Dv]")
    check_dims("g", g, (b, h), f"[{b}, {h}]")
    check_dims("beta", beta, (b, h), f"[{b}, {h}]")
    check_dims("state", state, (b, h, dk, dv), f"[{b}, {h}, {dk}, {dv}]")
    _check_dtypes(q=q, k=k, v=v, g=g, beta=beta)
    check_float32("state", state)


def _check_dtypes(**arrays):
    for name, x in arrays.items():
        check_float(name, x)


# ----------------------------------------------------------------------------- references


def recurrent_gated_delta_rule_reference(q, k, v, g, beta, initial_state):
    """Token-by-token lax.scan; the oracle for the chunked form. Same arguments as chunk_*."""
    xs = tuple(jnp.moveaxis(x.astype(_f32), 1, 0) for x in (q, k, v, g, beta))

    def step(s, x):
        o, s = _step_math(*x, s)
        return s, o

    final, o = jax.lax.scan(step, initial_state.astype(_f32), xs)
    return jnp.moveaxis(o, 0, 1), final


def _step_math(q, k, v, g, beta, s):
    """q, k [B, H, Dk]; v [B, H, Dv]; g, beta [B, H]; s [B, H, Dk, Dv] (all float32)."""
    # Products over Dk as explicit tree sums, not one-row matmuls: XLA rewrites those into
    # reductions whose order depends on the batch (tree_sum: batch invariance).
    s = s * jnp.exp(g)[..., None, None]
    kv = tree_sum(k[..., :, None] * s, axis=-2)
    delta = beta[..., None] * (v - kv)
    s = s + k[..., :, None] * delta[..., None, :]
    return tree_sum(q[..., :, None] * s, axis=-2), s


def _pad_time(x, t_pad):
    if t_pad == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[1] = (0, t_pad)
    return jnp.pad(x, widths)  # zeros: g = 0, beta = 0, k = 0 leave the state unchanged


def chunk_gated_delta_rule_reference(q, k, v, g, beta, initial_state, *, chunk_size):
    r, t, h, dk = q.shape
    dv = v.shape[-1]
    c = chunk_size
    n = -(-t // c)
    tp = n * c

    def chunks(x):  # [R, T, H, ...] -> [n, R, H, C, ...]
        x = _pad_time(x.astype(_f32), tp - t)
        x = x.reshape(r, n, c, h, *x.shape[3:])
        return jnp.moveaxis(jnp.moveaxis(x, 3, 2), 1, 0)

    qc, kc, vc, gc, bc = (chunks(x) for x in (q, k, v, g, beta))
    gcum = jnp.cumsum(gc, axis=-1)  # [n, R, H, C]
    ti = jnp.arange(c)
    strict = ti[:, None] > ti[None, :]
    incl = ti[:, None] >= ti[None, :]
    diff = gcum[..., :, None] - gcum[..., None, :]  # G_t - G_s
    # Mask before exp: above the diagonal the difference is >= 0 and may overflow.
    dec_strict = jnp.where(strict, jnp.exp(jnp.where(strict, diff, 0.0)), 0.0)
    dec_incl = jnp.where(incl, jnp.exp(jnp.where(incl, diff, 0.0)), 0.0)

    a = bc[..., :, None] * dec_strict * _mm("...tk,...sk->...ts", kc, kc)
    rhs = jnp.concatenate([(bc * jnp.exp(gcum))[..., None] * kc, bc[..., None] * vc], axis=-1)
    eye = jnp.eye(c, dtype=_f32)
    sol = jax.lax.linalg.triangular_solve(
        a + eye, rhs, left_side=True, lower=True, unit_diagonal=True
    )
    w, u0 = sol[..., :dk], sol[..., dk:]
    p = dec_incl * _mm("...tk,...sk->...ts", qc, kc)
    q_state = jnp.exp(gcum)[..., None] * qc - _mm("...ts,...sk->...tk", p, w)  # O = q_state S0 + o_intra
    o_intra = _mm("...ts,...sv->...tv", p, u0)
    g_last = gcum[..., -1]
    k_dec = jnp.exp(g_last[..., None] - gcum)[..., None] * kc

    def step(s, x):
        w_, u0_, qs_, oi_, kd_, gl_ = x
        u = u0_ - _mm("...tk,...kv->...tv", w_, s)
        o = _mm("...tk,...kv->...tv", qs_, s) + oi_
        s = jnp.exp(gl_)[..., None, None] * s + _mm("...tk,...tv->...kv", kd_, u)
        return s, o

    final, o = jax.lax.scan(step, initial_state.astype(_f32), (w, u0, q_state, o_intra, k_dec, g_last))
    o = jnp.moveaxis(o, 0, 1)  # [R, n, H, C, Dv]
    o = jnp.moveaxis(o, 2, 3).reshape(r, tp, h, dv)[:, :t]
    return o, final


def recurrent_gated_delta_rule_step_reference(q, k, v, g, beta, state):
    return _step_math(*(x.astype(_f32) for x in (q, k, v, g, beta, state)))


# ----------------------------------------------------------------------------- public


def chunk_gated_delta_rule(
    q,  # [R, T, H, Dk] l2-normalised, scaled by Dk**-0.5
    k,  # [R, T, H, Dk] l2-normalised
    v,  # [R, T, H, Dv]
    g,  # [R, T, H] log decay (<= 0)
    beta,  # [R, T, H]
    initial_state,  # [R, H, Dk, Dv] float32
    *,
    chunk_size: int = 64,
    backend: str = "xla",
):
    """Returns (o [R, T, H, Dv] float32, final_state [R, H, Dk, Dv] float32)."""
    check_backend(backend)
    _validate_chunk(q, k, v, g, beta, initial_state, chunk_size)
    if backend == "xla":
        # The CPU path is the token-by-token recurrence, not the chunked form: its arithmetic per
        # token does not depend on where chunks start, so a resumed prefill (reuse, replay) is
        # bit-identical to a cold one (doctrine 1, docs/rules.md), and it avoids the chunked form's
        # triangular solve, whose rounding grows with strong decays (up to ~6e-4 in logits on
        # the built-in model). `chunk_gated_delta_rule_reference` stays the Pallas kernel's oracle.
        return recurrent_gated_delta_rule_reference(q, k, v, g, beta, initial_state)
    return _chunk_pallas(q, k, v, g, beta, initial_state, chunk_size=chunk_size, interpret=backend == "interpret")


def recurrent_gated_delta_rule_step(
    q,  # [B, H, Dk]
    k,  # [B, H, Dk]
    v,  # [B, H, Dv]
    g,  # [B, H]
    beta,  # [B, H]
    state,  # [B, H, Dk, Dv] float32
    *,
    backend: str = "xla",
):
    """One token per row. Returns (o [B, H, Dv] float32, new_state [B, H, Dk, Dv] float32)."""
    check_backend(backend)
    _validate_step(q, k, v, g, beta, state)
    if backend == "xla":
        return recurrent_gated_delta_rule_step_reference(q, k, v, g, beta, state)
    return _step_pallas(q, k, v, g, beta, state, interpret=backend == "interpret")


# ----------------------------------------------------------------------------- Pallas
# Grid (row, head, value block). A program keeps its [Dk, BV] slice of the state in
# registers and walks the chunks in order; the chunk-local part (A, its inverse, W, U0) is
# recomputed per value block, which is cheap next to the state matmuls and keeps programs
# independent. (I + A)^-1 is formed by forward substitution, one row per step, as Triton
# has no triangular solve.


def _check_gpu_shapes(chunk_size, dk, dv):
    # Triton needs power-of-two tensors and matmul dims >= 16.
    bv = largest_pow2_divisor(dv, _BLOCK_V)
    if not (is_pow2(chunk_size) and chunk_size >= 16):
        raise KernelArgumentError(f"backend 'pallas' needs chunk_size a power of two >= 16, got {chunk_size}")
    if not (is_pow2(dk) and dk >= 16):
        raise KernelArgumentError(f"backend 'pallas' needs Dk a power of two >= 16, got Dk={dk}")
    if bv < 16:
        raise KernelArgumentError(f"backend 'pallas' needs Dv divisible by 16, got Dv={dv}")


def _unit_lower_inverse(a):
    """(I + a)^-1 for strictly lower-triangular a [C, C], by forward substitution."""
    c = a.shape[0]
    rows = jax.lax.broadcasted_iota(jnp.int32, (c, c), 0)
    cols = jax.lax.broadcasted_iota(jnp.int32, (c, c), 1)
    vec = jax.lax.broadcasted_iota(jnp.int32, (c,), 0)

    def body(i, inv):
        # Row i: inv_i = e_i - sum_{s<i} a[i, s] inv_s; rows >= i of inv are still e_s and
        # a[i, s>=i] = 0, so a full-width product is exact.
        a_i = jnp.sum(jnp.where(rows == i, a, 0.0), axis=0)  # [C] over s
        row = jnp.where(vec == i, 1.0, 0.0) - jnp.sum(a_i[:, None] * inv, axis=0)
        return jnp.where(rows == i, row[None, :], inv)

    return jax.lax.fori_loop(1, c, body, jnp.where(rows == cols, 1.0, 0.0).astype(jnp.float32))


def _chunk_kernel(q_ref, k_ref, v_ref, g_ref, b_ref, s0_ref, o_ref, s_ref, *, chunk):
    # q_ref, k_ref [Tp, Dk]; v_ref [Tp, BV]; g_ref (chunk-local cumsum), b_ref [Tp];
    # s0_ref [Dk, BV] (aliased with s_ref); o_ref [Tp, BV]
    c = chunk
    n_chunks = q_ref.shape[0] // c
    rows = jax.lax.broadcasted_iota(jnp.int32, (c, c), 0)
    cols = jax.lax.broadcasted_iota(jnp.int32, (c, c), 1)
    strict, incl = rows > cols, rows >= cols

    def body(ci, state):
        sl = pl.ds(ci * c, c)
        q = q_ref[sl, :].astype(jnp.float32)
        k = k_ref[sl, :].astype(jnp.float32)
        v = v_ref[sl, :].astype(jnp.float32)
        gc = g_ref[sl]
        beta = b_ref[sl]
        g_last = g_ref[ci * c + c - 1]
        diff = gc[:, None] - gc[None, :]  # G_t - G_s; masked before exp (>= 0 above diagonal)
        a = jnp.where(strict, beta[:, None] * jnp.exp(jnp.where(strict, diff, 0.0)) * dot(k, k, trans_b=True), 0.0)
        inv = _unit_lower_inverse(a)
        eg = jnp.exp(gc)
        w = dot(inv, (beta * eg)[:, None] * k)  # [C, Dk]
        u = dot(inv, beta[:, None] * v) - dot(w, state)  # [C, BV] the chunk's deltas
        p = jnp.where(incl, jnp.exp(jnp.where(incl, diff, 0.0)) * dot(q, k, trans_b=True), 0.0)
        o_ref[sl, :] = (dot(eg[:, None] * q, state) + dot(p, u)).astype(o_ref.dtype)
        return jnp.exp(g_last) * state + dot_tn(jnp.exp(g_last - gc)[:, None] * k, u)

    s_ref[...] = jax.lax.fori_loop(0, n_chunks, body, s0_ref[...].astype(jnp.float32))


def _chunk_pallas(q, k, v, g, beta, initial_state, *, chunk_size, interpret):
    r, t, h, dk = q.shape
    dv = v.shape[-1]
    if not interpret:
        _check_gpu_shapes(chunk_size, dk, dv)
    c = chunk_size
    n = -(-t // c)
    tp = n * c
    bv = largest_pow2_divisor(dv, _BLOCK_V)
    q, k, v = (_pad_time(x, tp - t) for x in (q, k, v))  # [R, Tp, H, D]
    g_rht = jnp.moveaxis(_pad_time(g.astype(_f32), tp - t), 1, 2)  # [R, H, Tp]
    gcum = jnp.cumsum(g_rht.reshape(r, h, n, c), axis=-1).reshape(r, h, tp)
    beta_rht = jnp.moveaxis(_pad_time(beta.astype(_f32), tp - t), 1, 2)
    qk_spec = pl.BlockSpec((None, tp, None, dk), lambda i, j, b: (i, 0, j, 0))
    v_spec = pl.BlockSpec((None, tp, None, bv), lambda i, j, b: (i, 0, j, b))
    gb_spec = pl.BlockSpec((None, None, tp), lambda i, j, b: (i, j, 0))
    s_spec = pl.BlockSpec((None, None, dk, bv), lambda i, j, b: (i, j, 0, b))
    o, final = pl.pallas_call(
        functools.partial(_chunk_kernel, chunk=c),
        out_shape=(
            jax.ShapeDtypeStruct((r, tp, h, dv), _f32),
            jax.ShapeDtypeStruct((r, h, dk, dv), _f32),
        ),
        grid=(r, h, dv // bv),
        in_specs=[qk_spec, qk_spec, v_spec, gb_spec, gb_spec, s_spec],
        out_specs=(v_spec, s_spec),
        input_output_aliases={5: 1},  # state updated in place when donated
        name="chunk_gated_delta_rule",
        **pallas_params(interpret, num_warps=8, num_stages=1),
    )(q, k, v, gcum, beta_rht, initial_state.astype(_f32))
    return o[:, :t], final


def _step_kernel(q_ref, k_ref, v_ref, g_ref, b_ref, s0_ref, o_ref, s_ref):
    # q_ref, k_ref [Dk]; v_ref [BV]; g_ref, b_ref [B, H]; s0_ref/s_ref (aliased) [Dk, BV]; o_ref [BV]
    bi, hi = pl.program_id(0), pl.program_id(1)
    q = q_ref[...].astype(jnp.float32)
    k = k_ref[...].astype(jnp.float32)
    v = v_ref[...].astype(jnp.float32)
    s = s0_ref[...].astype(jnp.float32) * jnp.exp(g_ref[bi, hi])
    kv = jnp.sum(k[:, None] * s, axis=0)
    s = s + k[:, None] * (b_ref[bi, hi] * (v - kv))[None, :]
    o_ref[...] = jnp.sum(q[:, None] * s, axis=0)
    s_ref[...] = s


def _step_pallas(q, k, v, g, beta, state, *, interpret):
    b, h, dk = q.shape
    dv = v.shape[-1]
    bv = largest_pow2_divisor(dv, _BLOCK_V)
    if not interpret and not (is_pow2(dk) and bv >= 16):
        raise KernelArgumentError(f"backend 'pallas' needs Dk a power of two and Dv divisible by 16, got {dk}, {dv}")
    whole = pl.BlockSpec((b, h), lambda i, j, c: (0, 0))
    s_spec = pl.BlockSpec((None, None, dk, bv), lambda i, j, c: (i, j, 0, c))
    return pl.pallas_call(
        _step_kernel,
        out_shape=(
            jax.ShapeDtypeStruct((b, h, dv), _f32),
            jax.ShapeDtypeStruct((b, h, dk, dv), _f32),
        ),
        grid=(b, h, dv // bv),
        in_specs=[
            pl.BlockSpec((None, None, dk), lambda i, j, c: (i, j, 0)),
            pl.BlockSpec((None, None, dk), lambda i, j, c: (i, j, 0)),
            pl.BlockSpec((None, None, bv), lambda i, j, c: (i, j, c)),
            whole,
            whole,
            s_spec,
        ],
        out_specs=(pl.BlockSpec((None, None, bv), lambda i, j, c: (i, j, c)), s_spec),
        input_output_aliases={5: 1},
        name="recurrent_gated_delta_rule_step",
        **pallas_params(interpret),
    )(q, k, v, g.astype(_f32), beta.astype(_f32), state.astype(_f32))
