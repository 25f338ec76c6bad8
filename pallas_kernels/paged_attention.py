"""Paged KV cache: write a chunk of K/V into pages, prefill (chunked, causal) and decode attention.

Layout (DESIGN.md, "The model"): the Main KV pool of one attention layer is
`[num_pages, page_size, kv_heads, head_dim]`; a row reads its keys through its page table
`[P]` of physical page ids (logical page j holds absolute positions j*page_size ...).
GQA: query head h uses kv head h // (Hq // Hkv).

Each public function takes `backend`: "xla" (pure-JAX reference, CPU default),
"pallas" (Triton lowering on NVIDIA GPU) or "interpret" (same pallas_call, interpret=True).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pallas_kernels._common import HIGHEST, check_backend, check_dims, check_int, check_ndim

# Finite "minus infinity": a fully masked row then gives a finite (discarded) result instead
# of NaN from (-inf) - (-inf).
_NEG = -1e30


# ----------------------------------------------------------------------------- validation


def _check_pools(k_pages, v_pages):
    check_ndim("k_pages", k_pages, 4, "[num_pages, page_size, kv_heads, head_dim]")
    if v_pages.shape != k_pages.shape:
        raise ValueError(f"v_pages has shape {v_pages.shape}, expected k_pages' shape {k_pages.shape}")
    if v_pages.dtype != k_pages.dtype:
        raise ValueError(f"v_pages dtype {v_pages.dtype} differs from k_pages dtype {k_pages.dtype}")


def _check_rows(page_table, rows, **per_row):
    check_ndim("page_table", page_table, 2, "[R, P]")
    check_int("page_table", page_table)
    if page_table.shape[0] != rows:
        raise ValueError(f"page_table has shape {page_table.shape}, expected [{rows}, P]")
    for name, x in per_row.items():
        check_dims(name, x, (rows,), f"[{rows}]")
        check_int(name, x)


def _validate_write(k_pages, v_pages, k_new, v_new, page_table, start_pos, lengths):
    _check_pools(k_pages, v_pages)
    _, _, hkv, d = k_pages.shape
    check_ndim("k_new", k_new, 4, "[R, T, kv_heads, head_dim]")
    r, t = k_new.shape[:2]
    check_dims("k_new", k_new, (r, t, hkv, d), f"[R, T, {hkv}, {d}]")
    check_dims("v_new", v_new, k_new.shape, f"{list(k_new.shape)} (k_new's shape)")
    _check_rows(page_table, r, start_pos=start_pos, lengths=lengths)


def _validate_attn(q, k_pages, v_pages, page_table, has_t: bool, **per_row):
    _check_pools(k_pages, v_pages)
    _, _, hkv, d = k_pages.shape
    if has_t:
        check_ndim("q", q, 4, "[R, T, Hq, head_dim]")
    else:
        check_ndim("q", q, 3, "[B, Hq, head_dim]")
    hq = q.shape[-2]
    if q.shape[-1] != d:
        raise ValueError(f"q has shape {q.shape}, its head_dim must equal k_pages' head_dim {d}")
    if hq % hkv:
        raise ValueError(f"q has {hq} heads (shape {q.shape}), not a multiple of kv_heads {hkv}")
    _check_rows(page_table, q.shape[0], **per_row)


# ----------------------------------------------------------------------------- write_kv


def _write_slots(page_table, start_pos, lengths, t: int, page_size: int, num_pages: int):
    """Flat slot (page * page_size + offset) of every chunk token; num_pages*page_size = drop."""
    p = page_table.shape[1]
    tt = jnp.arange(t, dtype=jnp.int32)[None, :]
    pos = start_pos[:, None].astype(jnp.int32) + tt  # [R, T] absolute positions
    logical = pos // page_size
    page = jnp.take_along_axis(page_table.astype(jnp.int32), jnp.clip(logical, 0, p - 1), axis=1)
    ok = (tt < lengths[:, None]) & (logical >= 0) & (logical < p) & (page >= 0) & (page < num_pages)
    # Out-of-range sentinel rather than -1: jnp scatter wraps negative indices.
    return jnp.where(ok, page * page_size + pos % page_size, num_pages * page_size)


def write_kv_reference(k_pages, v_pages, k_new, v_new, page_table, start_pos, lengths):
    n, ps, hkv, d = k_pages.shape
    r, t = k_new.shape[:2]
    slots = _write_slots(page_table, start_pos, lengths, t, ps, n).reshape(-1)

    def put(pool, new):
        flat = pool.reshape(n * ps, hkv, d)
        flat = flat.at[slots].set(new.reshape(r * t, hkv, d).astype(pool.dtype), mode="drop")
        return flat.reshape(pool.shape)

    return put(k_pages, k_new), put(v_pages, v_new)


def write_kv(
    k_pages,  # [num_pages, page_size, kv_heads, head_dim]
    v_pages,  # [num_pages, page_size, kv_heads, head_dim]
    k_new,  # [R, T, kv_heads, head_dim]
    v_new,  # [R, T, kv_heads, head_dim]
    page_table,  # [R, P] int32 physical page of each logical page
    start_pos,  # [R] int32 absolute position of token 0
    lengths,  # [R] int32 valid tokens per row (0 = inactive)
    *,
    backend: str = "xla",
):
    """Writes token t < lengths[r] of row r at position start_pos[r] + t; nothing else is touched."""
    check_backend(backend)
    _validate_write(k_pages, v_pages, k_new, v_new, page_table, start_pos, lengths)
    if backend == "xla":
        return write_kv_reference(k_pages, v_pages, k_new, v_new, page_table, start_pos, lengths)
    return _write_kv_pallas(
        k_pages, v_pages, k_new, v_new, page_table, start_pos, lengths, interpret=backend == "interpret"
    )


# ----------------------------------------------------------------------------- attention reference


def _gather_row_kv(pages, page_table):
    """[R, P*page_size, kv_heads, head_dim] float32: each row's logical key sequence."""
    n, ps, hkv, d = pages.shape
    r, p = page_table.shape
    rows = pages[jnp.clip(page_table, 0, n - 1)]  # [R, P, page_size, kv_heads, head_dim]
    return rows.reshape(r, p * ps, hkv, d).astype(jnp.float32)


def _attend_reference(q, k, v, key_limit, scale):
    """q [R, T, Hq, D]; k, v [R, S, Hkv, D]; key_limit [R, T]: key s visible iff s < key_limit."""
    r, t, hq, d = q.shape
    s_len, hkv = k.shape[1], k.shape[2]
    g = hq // hkv
    qg = q.astype(jnp.float32).reshape(r, t, hkv, g, d)
    s = jnp.einsum("rtkgd,rskd->rkgts", qg, k, precision=HIGHEST) * jnp.float32(scale)
    visible = jnp.arange(s_len, dtype=jnp.int32)[None, None, :] < key_limit[:, :, None]  # [R, T, S]
    s = jnp.where(visible[:, None, None], s, _NEG)
    p = jax.nn.softmax(s, axis=-1)
    o = jnp.einsum("rkgts,rskd->rtkgd", p, v, precision=HIGHEST)
    return o.reshape(r, t, hq, d)


def prefill_attention_reference(q, k_pages, v_pages, page_table, start_pos, lengths, *, scale):
    r, t = q.shape[:2]
    k = _gather_row_kv(k_pages, page_table)
    v = _gather_row_kv(v_pages, page_table)
    tt = jnp.arange(t, dtype=jnp.int32)[None, :]
    key_limit = start_pos[:, None].astype(jnp.int32) + tt + 1  # causal, inclusive of self
    o = _attend_reference(q, k, v, key_limit, scale)
    valid = tt < lengths[:, None]
    return jnp.where(valid[:, :, None, None], o, 0.0).astype(q.dtype)


def decode_attention_reference(q, k_pages, v_pages, page_table, context_lens, *, scale):
    k = _gather_row_kv(k_pages, page_table)
    v = _gather_row_kv(v_pages, page_table)
    o = _attend_reference(q[:, None], k, v, context_lens[:, None].astype(jnp.int32), scale)[:, 0]
    return jnp.where((context_lens > 0)[:, None, None], o, 0.0).astype(q.dtype)


def prefill_attention(
    q,  # [R, T, Hq, head_dim], RoPE applied
    k_pages,  # [num_pages, page_size, kv_heads, head_dim]
    v_pages,  # [num_pages, page_size, kv_heads, head_dim]
    page_table,  # [R, P] int32
    start_pos,  # [R] int32 absolute position of query 0
    lengths,  # [R] int32 valid queries per row
    *,
    scale: float,
    backend: str = "xla",
):
    """Causal attention of a chunk over its row's paged keys (the chunk's K/V already written).

    Returns [R, T, Hq, head_dim] in q.dtype; queries t >= lengths[r] give zeros.
    """
    check_backend(backend)
    _validate_attn(q, k_pages, v_pages, page_table, True, start_pos=start_pos, lengths=lengths)
    if backend == "xla":
        return prefill_attention_reference(q, k_pages, v_pages, page_table, start_pos, lengths, scale=scale)
    return _prefill_attention_pallas(
        q, k_pages, v_pages, page_table, start_pos, lengths, scale=scale, interpret=backend == "interpret"
    )


def decode_attention(
    q,  # [B, Hq, head_dim]
    k_pages,  # [num_pages, page_size, kv_heads, head_dim]
    v_pages,  # [num_pages, page_size, kv_heads, head_dim]
    page_table,  # [B, P] int32
    context_lens,  # [B] int32 keys incl. the current token (0 = inactive row)
    *,
    scale: float,
    backend: str = "xla",
):
    """One query per row over keys 0..context_lens-1. Returns [B, Hq, head_dim] in q.dtype."""
    check_backend(backend)
    _validate_attn(q, k_pages, v_pages, page_table, False, context_lens=context_lens)
    if backend == "xla":
        return decode_attention_reference(q, k_pages, v_pages, page_table, context_lens, scale=scale)
    return _decode_attention_pallas(
        q, k_pages, v_pages, page_table, context_lens, scale=scale, interpret=backend == "interpret"
    )


# ----------------------------------------------------------------------------- Pallas


def _write_kv_pallas(*args, interpret):
    raise NotImplementedError("Pallas write_kv: not written yet")


def _prefill_attention_pallas(*args, scale, interpret):
    raise NotImplementedError("Pallas prefill_attention: not written yet")


def _decode_attention_pallas(*args, scale, interpret):
    raise NotImplementedError("Pallas decode_attention: not written yet")
