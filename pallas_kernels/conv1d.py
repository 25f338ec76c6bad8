"""Depthwise causal conv1d + SiLU over [q|k|v] channels of a GDN layer, with a rolling state.

Semantics of transformers' `causal_conv1d_fn` / `causal_conv1d_update` (qwen3_next) with
weight [C, K] = conv1d.weight.squeeze(1), no bias, activation silu. The state holds the
last K-1 inputs (zeros for a fresh request).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels._common import check_backend, check_dims, check_int, check_ndim

_f32 = jnp.float32


# ----------------------------------------------------------------------------- validation


def _validate_weight(weight, c):
    check_ndim("weight", weight, 2, "[C, K]")
    if weight.shape[0] != c or weight.shape[1] < 2:
        raise ValueError(f"weight has shape {weight.shape}, expected [{c}, K] with K >= 2")


def _validate_prefill(x, conv_state, weight, lengths):
    check_ndim("x", x, 3, "[R, T, C]")
    r, _, c = x.shape
    _validate_weight(weight, c)
    kk = weight.shape[1]
    check_dims("conv_state", conv_state, (r, kk - 1, c), f"[{r}, {kk - 1}, {c}]")
    check_dims("lengths", lengths, (r,), f"[{r}]")
    check_int("lengths", lengths)


def _validate_update(x, conv_state, weight):
    check_ndim("x", x, 2, "[B, C]")
    b, c = x.shape
    _validate_weight(weight, c)
    kk = weight.shape[1]
    check_dims("conv_state", conv_state, (b, kk - 1, c), f"[{b}, {kk - 1}, {c}]")


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


def _prefill_pallas(*args, interpret):
    raise NotImplementedError("Pallas causal_conv1d_prefill: not written yet")


def _update_pallas(*args, interpret):
    raise NotImplementedError("Pallas causal_conv1d_update: not written yet")
