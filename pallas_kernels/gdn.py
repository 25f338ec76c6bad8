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

from pallas_kernels._common import HIGHEST, check_backend, check_dims, check_ndim

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
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")


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
    s = s * jnp.exp(g)[..., None, None]
    kv = _mm("bhk,bhkv->bhv", k, s)
    delta = beta[..., None] * (v - kv)
    s = s + k[..., :, None] * delta[..., None, :]
    return _mm("bhk,bhkv->bhv", q, s), s


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
        return chunk_gated_delta_rule_reference(q, k, v, g, beta, initial_state, chunk_size=chunk_size)
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


def _chunk_pallas(*args, chunk_size, interpret):
    raise NotImplementedError("Pallas chunk_gated_delta_rule: not written yet")


def _step_pallas(*args, interpret):
    raise NotImplementedError("Pallas recurrent_gated_delta_rule_step: not written yet")
