"""Depthwise causal conv1d + SiLU over [q|k|v] channels of a GDN layer, with a rolling state.

Semantics of transformers' `causal_conv1d_fn` / `causal_conv1d_update` (qwen3_next) with
weight [C, K] = conv1d.weight.squeeze(1), no bias, activation silu. The state holds the
last K-1 inputs (zeros for a fresh request).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels._common import (
    KernelArgumentError,
    check_backend,
    check_dims,
    check_float,
    check_int,
    check_ndim,
    largest_pow2_divisor,
    next_pow2,
    pallas_params,
)

_BLOCK_T = 32  # time steps per program
_BLOCK_C = 128  # channels per program (largest power of two dividing C, at most this)

_f32 = jnp.float32


# ----------------------------------------------------------------------------- validation


def _validate_weight(weight, c):
    check_ndim("weight", weight, 2, "[C, K]")
    if weight.shape[0] != c or weight.shape[1] < 2:
        raise KernelArgumentError(f"weight has shape {weight.shape}, expected [{c}, K] with K >= 2")
    check_float("weight", weight)


def _validate_prefill(x, conv_state, weight, lengths):
    check_ndim("x", x, 3, "[R, T, C]")
    r, _, c = x.shape
    _validate_weight(weight, c)
    kk = weight.shape[1]
    check_dims("conv_state", conv_state, (r, kk - 1, c), f"[{r}, {kk - 1}, {c}]")
    check_dims("lengths", lengths, (r,), f"[{r}]")
    check_int("lengths", lengths)
    check_float("x", x)
    check_float("conv_state", conv_state)


def _validate_update(x, conv_state, weight):
    check_ndim("x", x, 2, "[B, C]")
    b, c = x.shape
    _validate_weight(weight, c)
    kk = weight.shape[1]
    check_dims("conv_state", conv_state, (b, kk - 1, c), f"[{b}, {kk - 1}, {c}]")
    check_float("x", x)
    check_float("conv_state", conv_state)


# ----------------------------------------------------------------------------- references


def causal_conv1d_prefill_reference(x, conv_state, weight, lengths):
    t = x.shape[1]
    kk = weight.shape[1]
    xx = jnp.concatenate([conv_state.astype(_f32), x.astype(_f32)], axis=1)  # [R, K-1+T, C]
    w = weight.astype(_f32)
    acc = sum(w[:, j] * xx[:, j : j + t] for j in range(kk))
    y = jax.nn.silu(acc).astype(x.dtype)
    # The state after the row's last valid token: inputs lengths .. lengths+K-2 of xx.
    start = jnp.clip(lengths.astype(jnp.int32), 0, t)
    new_state = jax.vmap(lambda row, s: jax.lax.dynamic_slice_in_dim(row, s, kk - 1, axis=0))(xx, start)
    return y, new_state.astype(conv_state.dtype)


def causal_conv1d_update_reference(x, conv_state, weight):
    kk = weight.shape[1]
    xx = jnp.concatenate([conv_state.astype(_f32), x.astype(_f32)[:, None]], axis=1)  # [B, K, C]
    w = weight.astype(_f32)
    acc = sum(w[:, j] * xx[:, j] for j in range(kk))
    return jax.nn.silu(acc).astype(x.dtype), xx[:, 1:].astype(conv_state.dtype)


# ----------------------------------------------------------------------------- public


def causal_conv1d_prefill(
    x,  # [R, T, C]
    conv_state,  # [R, K-1, C] last K-1 inputs before this chunk
    weight,  # [C, K]
    lengths,  # [R] int32 valid tokens per row (0 leaves the state unchanged)
    *,
    backend: str = "xla",
):
    """Returns (y [R, T, C] in x.dtype, new_state [R, K-1, C] in conv_state.dtype)."""
    check_backend(backend)
    _validate_prefill(x, conv_state, weight, lengths)
    if backend == "xla":
        return causal_conv1d_prefill_reference(x, conv_state, weight, lengths)
    return _prefill_pallas(x, conv_state, weight, lengths, interpret=backend == "interpret")


def causal_conv1d_update(
    x,  # [B, C] one token per row
    conv_state,  # [B, K-1, C]
    weight,  # [C, K]
    *,
    backend: str = "xla",
):
    """Returns (y [B, C] in x.dtype, new_state [B, K-1, C] in conv_state.dtype)."""
    check_backend(backend)
    _validate_update(x, conv_state, weight)
    if backend == "xla":
        return causal_conv1d_update_reference(x, conv_state, weight)
    return _update_pallas(x, conv_state, weight, interpret=backend == "interpret")


# ----------------------------------------------------------------------------- Pallas
# Grid (row, time block, channel block). The wrapper materialises xx = [state | x | pad] so
# every program reads K shifted [BT, BC] windows with no boundary case; the program of time
# block 0 also writes the row's new state (K-1 single-row loads at the valid length).


def _conv_kernel(lengths_ref, xx_ref, wt_ref, y_ref, state_ref):
    # lengths_ref [R]; xx_ref [K-1+Tp, BC]; wt_ref [K, BC]; y_ref [BT, BC]; state_ref [K-1, BC]
    r, tb = pl.program_id(0), pl.program_id(1)
    kk = wt_ref.shape[0]
    bt = y_ref.shape[0]
    t0 = tb * bt
    acc = jnp.zeros(y_ref.shape, jnp.float32)
    for j in range(kk):  # K is tiny (4): unrolled
        w = wt_ref[j, :].astype(jnp.float32)
        acc = acc + w[None, :] * xx_ref[pl.ds(t0 + j, bt), :].astype(jnp.float32)
    y_ref[...] = (acc / (1.0 + jnp.exp(-acc))).astype(y_ref.dtype)  # silu

    @pl.when(tb == 0)
    def _():
        n_valid = lengths_ref[r]
        for i in range(kk - 1):
            state_ref[i, :] = xx_ref[n_valid + i, :].astype(state_ref.dtype)


def _prefill_pallas(x, conv_state, weight, lengths, *, interpret):
    r, t, c = x.shape
    kk = weight.shape[1]
    bt = min(_BLOCK_T, next_pow2(t))
    bc = largest_pow2_divisor(c, _BLOCK_C)
    tp = -(-t // bt) * bt
    dtype = jnp.promote_types(x.dtype, conv_state.dtype)
    xx = jnp.concatenate(
        [conv_state.astype(dtype), x.astype(dtype), jnp.zeros((r, tp - t, c), dtype)], axis=1
    )  # [R, K-1+Tp, C]
    wt = weight.T.astype(jnp.float32)  # [K, C]: rows contiguous over channels
    n_valid = jnp.clip(lengths.astype(jnp.int32), 0, t)
    y, new_state = pl.pallas_call(
        _conv_kernel,
        out_shape=(
            jax.ShapeDtypeStruct((r, tp, c), x.dtype),
            jax.ShapeDtypeStruct(conv_state.shape, conv_state.dtype),
        ),
        grid=(r, tp // bt, c // bc),
        in_specs=[
            pl.BlockSpec((r,), lambda i, tb, cb: (0,)),
            pl.BlockSpec((None, kk - 1 + tp, bc), lambda i, tb, cb: (i, 0, cb)),
            pl.BlockSpec((kk, bc), lambda i, tb, cb: (0, cb)),
        ],
        out_specs=(
            pl.BlockSpec((None, bt, bc), lambda i, tb, cb: (i, tb, cb)),
            pl.BlockSpec((None, kk - 1, bc), lambda i, tb, cb: (i, 0, cb)),
        ),
        name="causal_conv1d",
        **pallas_params(interpret),
    )(n_valid, xx, wt)
    return y[:, :t], new_state


def _update_pallas(x, conv_state, weight, *, interpret):
    # One token per row is the prefill kernel with T = 1 and every row valid.
    ones = jnp.ones((x.shape[0],), jnp.int32)
    y, new_state = _prefill_pallas(x[:, None], conv_state, weight, ones, interpret=interpret)
    return y[:, 0], new_state
