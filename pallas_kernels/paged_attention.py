"""Paged KV cache: write a chunk of K/V into pages, prefill (chunked, causal) and decode attention.

Layout: the Main KV pool of one attention layer is
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
from jax.experimental import pallas as pl

from pallas_kernels._common import (
    HIGHEST,
    KernelArgumentError,
    check_backend,
    check_dims,
    check_float,
    check_int,
    check_pool_float,
    check_ndim,
    dot,
    is_pow2,
    next_pow2,
    packed_as,
    pallas_params,
    tree_max,
    tree_sum,
    two_or_more,
    unpacked,
)

# Finite "minus infinity": a fully masked row then gives a finite (discarded) result instead
# of NaN from (-inf) - (-inf).
_NEG = -1e30


# ----------------------------------------------------------------------------- validation


def _check_pools(k_pages, v_pages):
    check_ndim("k_pages", k_pages, 4, "[num_pages, page_size, kv_heads, head_dim]")
    if v_pages.shape != k_pages.shape:
        raise KernelArgumentError(f"v_pages has shape {v_pages.shape}, expected k_pages' shape {k_pages.shape}")
    check_pool_float("k_pages", k_pages)
    if v_pages.dtype != k_pages.dtype:
        raise KernelArgumentError(f"v_pages dtype {v_pages.dtype} differs from k_pages dtype {k_pages.dtype}")


def _check_rows(page_table, rows, **per_row):
    check_ndim("page_table", page_table, 2, "[R, P]")
    check_int("page_table", page_table)
    if page_table.shape[0] != rows:
        raise KernelArgumentError(f"page_table has shape {page_table.shape}, expected [{rows}, P]")
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
    check_float("k_new", k_new)
    check_float("v_new", v_new)
    _check_rows(page_table, r, start_pos=start_pos, lengths=lengths)


def _validate_attn(q, k_pages, v_pages, page_table, has_t: bool, **per_row):
    _check_pools(k_pages, v_pages)
    _, _, hkv, d = k_pages.shape
    if has_t:
        check_ndim("q", q, 4, "[R, T, Hq, head_dim]")
    else:
        check_ndim("q", q, 3, "[B, Hq, head_dim]")
    check_float("q", q)
    hq = q.shape[-2]
    if q.shape[-1] != d:
        raise KernelArgumentError(f"q has shape {q.shape}, its head_dim must equal k_pages' head_dim {d}")
    if hq % hkv:
        raise KernelArgumentError(f"q has {hq} heads (shape {q.shape}), not a multiple of kv_heads {hkv}")
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

    def put(pool, new):  # a lone token's write stays a scatter (two_or_more)
        flat = jnp.asarray(pool).reshape(n * ps, hkv, d)
        rows = two_or_more(packed_as(new.reshape(r * t, hkv, d), pool.dtype), 0)
        flat = flat.at[two_or_more(slots, n * ps)].set(rows, mode="drop")
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
    return unpacked(rows).reshape(r, p * ps, hkv, d).astype(jnp.float32)


# Keys of at most this many floats (kv_heads * head_dim) are attended in one batched program;
# wider ones row by row. Measured (issue 33): the tiny built-in model (2 x 16) pays more for a
# row loop's ops than for its arithmetic, a 0.8B-width model (2 x 256) more for transposing all
# rows' keys at once than row by row. A model constant: every bucket takes the same path.
_BATCHED_KV_WIDTH = 128


def _attend_row(q, k, v, key_limit, scale):
    """One row: q [T, Hq, D]; k, v [S, Hkv, D]; key_limit [T]: key s visible iff s < key_limit."""
    t, hq, d = q.shape
    s_len, hkv = k.shape[0], k.shape[1]
    g = hq // hkv
    qg = q.astype(jnp.float32).reshape(t, hkv, g, d)
    s = jnp.einsum("tkgd,skd->kgts", qg, k, precision=HIGHEST) * jnp.float32(scale)
    visible = jnp.arange(s_len, dtype=jnp.int32)[None, :] < key_limit[:, None]  # [T, S]
    s = jnp.where(visible[None, None], s, _NEG)
    p = jax.nn.softmax(s, axis=-1)
    o = jnp.einsum("kgts,skd->tkgd", p, v, precision=HIGHEST)
    return o.reshape(t, hq, d)


def _attend_batched(q, k, v, key_limit, scale):
    """All rows in one program, each row's arithmetic its own (batch invariance, doctrine 1).

    Both products are batched over (row, kv head): every batch element is the same
    [G*T, D] @ [D, S] (and [G*T, S] @ [S, D]) product, which XLA's CPU backend runs alike
    whatever the batch (decode buckets start at two rows, never the one-element batch). The
    softmax takes no reduce op: above a size XLA hands a reduce, with the exp after it, to a
    YNNPACK fusion whose exp rounds otherwise than XLA's loops, so a row's exp would change with
    R; a tree of maxima and of adds (`tree_max`, `tree_sum`) keeps it elementwise."""
    r, t, hq, d = q.shape
    s_len, hkv = k.shape[1], k.shape[2]
    g = hq // hkv
    qg = q.astype(jnp.float32).reshape(r, t, hkv, g, d)
    s = jnp.einsum("rtkgd,rskd->rkgts", qg, k, precision=HIGHEST) * jnp.float32(scale)
    visible = jnp.arange(s_len, dtype=jnp.int32)[None, None, :] < key_limit[:, :, None]  # [R, T, S]
    s = jnp.where(visible[:, None, None], s, _NEG)
    e = jnp.exp(s - tree_max(s)[..., None])
    p = e / tree_sum(e)[..., None]
    o = jnp.einsum("rkgts,rskd->rtkgd", p, v, precision=HIGHEST)
    return o.reshape(r, t, hq, d)


def _attend_reference(q, k, v, key_limit, scale):
    """q [R, T, Hq, D]; k, v [R, S, Hkv, D]; key_limit [R, T]: key s visible iff s < key_limit.

    A row's result must not depend on how many rows share the call (batch invariance, doctrine
    1): narrow keys in one batched program (`_attend_batched`), wide ones row by row (a loop of
    identical one-row programs). One row (a prefill chunk) runs the one-row body alone."""
    if q.shape[0] == 1:
        return _attend_row(q[0], k[0], v[0], key_limit[0], scale)[None]
    if k.shape[2] * k.shape[3] <= _BATCHED_KV_WIDTH:
        return _attend_batched(q, k, v, key_limit, scale)
    return jax.lax.map(lambda a: _attend_row(*a, scale), (q, k, v, key_limit))


def prefill_attention_reference(q, k_pages, v_pages, page_table, start_pos, lengths, *, scale, key_offset=0):
    """`key_offset` (static): the row's logical key s is stored at slot s + key_offset of its pages,
    slots below the offset are never read (the MTP layers store index i at slot i + 1)."""
    r, t = q.shape[:2]
    k = _gather_row_kv(k_pages, page_table)[:, key_offset:]
    v = _gather_row_kv(v_pages, page_table)[:, key_offset:]
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
# Page ids are data, so the pools are passed whole and indexed inside the kernels with the
# scalar page id (GPU Pallas has no scalar-prefetch index maps); one page of one kv head,
# [page_size, head_dim], is the unit of every load. Triton needs page_size and head_dim to be
# powers of two and matmul dims >= 16, hence query heads of a kv group padded to >= 16 rows.

_QUERY_ROWS = 64  # target rows (queries x heads of one kv group) per prefill program
_MAX_SPLITS = 16  # decode: key ranges per (row, kv head) processed in parallel


def _check_gpu_pool(k_pages):
    _, ps, _, d = k_pages.shape
    if not (is_pow2(ps) and ps >= 16 and is_pow2(d) and d >= 16):
        raise KernelArgumentError(
            f"backend 'pallas' needs page_size and head_dim powers of two >= 16, got k_pages {k_pages.shape}"
        )


def _write_kv_kernel(pt_ref, start_ref, len_ref, kn_ref, vn_ref, kp_ref, vp_ref, ko_ref, vo_ref):
    # pt_ref [R, P]; start_ref, len_ref [R]; kn_ref, vn_ref [Hkv, D] (token t of row r);
    # kp_ref/vp_ref aliased with ko_ref/vo_ref [num_pages, page_size, Hkv, D]
    del kp_ref, vp_ref
    r, t = pl.program_id(0), pl.program_id(1)
    n_pages, ps, hkv, _ = ko_ref.shape
    p = pt_ref.shape[1]
    pos = start_ref[r] + t
    logical = pos // ps
    page = pt_ref[r, jnp.clip(logical, 0, p - 1)]
    ok = (t < len_ref[r]) & (logical >= 0) & (logical < p) & (page >= 0) & (page < n_pages)

    @pl.when(ok)  # padding tokens write nothing, not even to page 0
    def _():
        off = pos % ps
        for h in range(hkv):
            ko_ref[page, off, h, :] = kn_ref[h, :].astype(ko_ref.dtype)
            vo_ref[page, off, h, :] = vn_ref[h, :].astype(vo_ref.dtype)


def _write_kv_pallas(k_pages, v_pages, k_new, v_new, page_table, start_pos, lengths, *, interpret):
    r, t, hkv, d = k_new.shape
    if not interpret and not is_pow2(d):
        raise KernelArgumentError(f"backend 'pallas' needs head_dim a power of two, got k_pages {k_pages.shape}")
    whole = lambda shape: pl.BlockSpec(shape, lambda *_: (0,) * len(shape))  # noqa: E731
    tok = pl.BlockSpec((None, None, hkv, d), lambda i, j: (i, j, 0, 0))
    return pl.pallas_call(
        _write_kv_kernel,
        out_shape=(
            jax.ShapeDtypeStruct(k_pages.shape, k_pages.dtype),
            jax.ShapeDtypeStruct(v_pages.shape, v_pages.dtype),
        ),
        grid=(r, t),
        in_specs=[
            whole(page_table.shape),
            whole((r,)),
            whole((r,)),
            tok,
            tok,
            whole(k_pages.shape),
            whole(v_pages.shape),
        ],
        out_specs=(whole(k_pages.shape), whole(v_pages.shape)),
        input_output_aliases={5: 0, 6: 1},  # pools updated in place when donated
        name="paged_write_kv",
        **pallas_params(interpret, num_warps=1, num_stages=1),
    )(
        page_table.astype(jnp.int32),
        start_pos.astype(jnp.int32),
        lengths.astype(jnp.int32),
        k_new,
        v_new,
        k_pages,
        v_pages,
    )


def _compute_dtype(q_dtype, kv_dtype):
    # bf16 x bf16 runs on tensor cores; any mix falls back to float32 (exact "ieee" dots).
    return q_dtype if q_dtype == kv_dtype else jnp.float32


def _attend_pages(q, kp_ref, vp_ref, pt_row, kh, j0, j1, visible, scale, carry):
    """Online softmax of q [M, D] over logical pages j0..j1-1 of one row, one kv head.

    visible(key_pos [page_size]) -> [M, page_size] mask. carry = (acc [M, D], m [M], l [M]).
    """
    n_pages, ps = kp_ref.shape[0], kp_ref.shape[1]
    cd = q.dtype

    def body(j, carry):
        acc, m_prev, l_prev = carry
        page = jnp.clip(pt_row(j), 0, n_pages - 1)
        k = kp_ref[page, :, kh, :].astype(cd)  # [page_size, D]
        v = vp_ref[page, :, kh, :].astype(cd)
        s = dot(q, k, trans_b=True) * scale  # [M, page_size] float32
        s = jnp.where(visible(j * ps + jax.lax.broadcasted_iota(jnp.int32, (ps,), 0)), s, _NEG)
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=1))
        corr = jnp.exp(m_prev - m_new)
        p = jnp.exp(s - m_new[:, None])
        l_new = corr * l_prev + jnp.sum(p, axis=1)
        acc = corr[:, None] * acc + dot(p.astype(cd), v)
        return acc, m_new, l_new

    return jax.lax.fori_loop(j0, j1, body, carry)


def _init_carry(m_rows, d):
    return (
        jnp.zeros((m_rows, d), jnp.float32),
        jnp.full((m_rows,), _NEG, jnp.float32),
        jnp.zeros((m_rows,), jnp.float32),
    )


def _prefill_kernel(pt_ref, start_ref, len_ref, q_ref, kp_ref, vp_ref, o_ref, *, scale):
    # pt_ref [R, P]; start_ref, len_ref [R]; q_ref, o_ref [BT, Gp, D] (BT queries x the padded
    # query heads of kv head kh); kp_ref, vp_ref [num_pages, page_size, Hkv, D]
    r, kh, tb = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    bt, gp, d = q_ref.shape
    ps, p = kp_ref.shape[1], pt_ref.shape[1]
    m_rows = bt * gp
    cd = _compute_dtype(q_ref.dtype, kp_ref.dtype)
    q = q_ref[...].reshape(m_rows, d).astype(cd)
    t0 = tb * bt
    n_rows = jnp.clip(len_ref[r] - t0, 0, bt)  # valid queries in this block
    first = start_ref[r] + t0
    # Pages holding keys 0 .. position of the block's last valid query.
    n_pages = jnp.where(n_rows > 0, jnp.minimum((first + n_rows - 1) // ps + 1, p), 0)
    q_row = jax.lax.broadcasted_iota(jnp.int32, (m_rows,), 0) // gp  # query index in block
    q_pos = first + q_row
    acc, _, l = _attend_pages(
        q, kp_ref, vp_ref, lambda j: pt_ref[r, j], kh, 0, n_pages,
        lambda k_pos: k_pos[None, :] <= q_pos[:, None], scale, _init_carry(m_rows, d),
    )
    out = acc / jnp.where(l > 0, l, 1.0)[:, None]
    out = jnp.where((q_row < n_rows)[:, None], out, 0.0)
    o_ref[...] = out.reshape(bt, gp, d).astype(o_ref.dtype)


def _prefill_attention_pallas(q, k_pages, v_pages, page_table, start_pos, lengths, *, scale, interpret):
    r, t, hq, d = q.shape
    hkv = k_pages.shape[2]
    g = hq // hkv
    if not interpret:
        _check_gpu_pool(k_pages)
    gp = next_pow2(g)
    bt = min(max(1, _QUERY_ROWS // gp), next_pow2(t))
    bt = max(bt, -(-16 // gp))  # >= 16 matmul rows
    tp = -(-t // bt) * bt
    q5 = q.reshape(r, t, hkv, g, d)
    q5 = jnp.pad(q5, ((0, 0), (0, tp - t), (0, 0), (0, gp - g), (0, 0)))  # [R, Tp, Hkv, Gp, D]
    whole = lambda shape: pl.BlockSpec(shape, lambda *_: (0,) * len(shape))  # noqa: E731
    q_spec = pl.BlockSpec((None, bt, None, gp, d), lambda i, h, tb: (i, tb, h, 0, 0))
    o = pl.pallas_call(
        functools.partial(_prefill_kernel, scale=float(scale)),
        out_shape=jax.ShapeDtypeStruct(q5.shape, q.dtype),
        grid=(r, hkv, tp // bt),
        in_specs=[
            whole(page_table.shape),
            whole((r,)),
            whole((r,)),
            q_spec,
            whole(k_pages.shape),
            whole(v_pages.shape),
        ],
        out_specs=q_spec,
        name="paged_prefill_attention",
        **pallas_params(interpret, num_warps=4, num_stages=2),
    )(page_table.astype(jnp.int32), start_pos.astype(jnp.int32), lengths.astype(jnp.int32), q5, k_pages, v_pages)
    return o[:, :t, :, :g].reshape(r, t, hq, d)


def _decode_kernel(pt_ref, ctx_ref, q_ref, kp_ref, vp_ref, o_ref, m_ref, l_ref, *, scale, pages_per_split):
    # pt_ref [B, P]; ctx_ref [B]; q_ref [Gp, D]; kp_ref, vp_ref [num_pages, page_size, Hkv, D];
    # o_ref [Gp, D], m_ref, l_ref [Gp]: unnormalised partial result of split s
    b, kh, sp = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    gp, d = q_ref.shape
    ps, p = kp_ref.shape[1], pt_ref.shape[1]
    cd = _compute_dtype(q_ref.dtype, kp_ref.dtype)
    ctx = ctx_ref[b]
    j0 = sp * pages_per_split
    j1 = jnp.minimum(jnp.minimum(j0 + pages_per_split, (ctx + ps - 1) // ps), p)
    acc, m, l = _attend_pages(
        q_ref[...].astype(cd), kp_ref, vp_ref, lambda j: pt_ref[b, j], kh, j0, j1,
        lambda k_pos: jnp.broadcast_to(k_pos[None, :] < ctx, (gp, ps)), scale, _init_carry(gp, d),
    )
    o_ref[...] = acc
    m_ref[...] = m
    l_ref[...] = l


def _decode_attention_pallas(q, k_pages, v_pages, page_table, context_lens, *, scale, interpret):
    bsz, hq, d = q.shape
    hkv = k_pages.shape[2]
    p = page_table.shape[1]
    g = hq // hkv
    if not interpret:
        _check_gpu_pool(k_pages)
    gp = max(next_pow2(g), 16)  # >= 16 matmul rows
    pps = -(-p // _MAX_SPLITS)
    splits = -(-p // pps)
    q4 = jnp.pad(q.reshape(bsz, hkv, g, d), ((0, 0), (0, 0), (0, gp - g), (0, 0)))  # [B, Hkv, Gp, D]
    whole = lambda shape: pl.BlockSpec(shape, lambda *_: (0,) * len(shape))  # noqa: E731
    o, m, l = pl.pallas_call(
        functools.partial(_decode_kernel, scale=float(scale), pages_per_split=pps),
        out_shape=(
            jax.ShapeDtypeStruct((bsz, hkv, splits, gp, d), jnp.float32),
            jax.ShapeDtypeStruct((bsz, hkv, splits, gp), jnp.float32),
            jax.ShapeDtypeStruct((bsz, hkv, splits, gp), jnp.float32),
        ),
        grid=(bsz, hkv, splits),
        in_specs=[
            whole(page_table.shape),
            whole((bsz,)),
            pl.BlockSpec((None, None, gp, d), lambda i, h, s: (i, h, 0, 0)),
            whole(k_pages.shape),
            whole(v_pages.shape),
        ],
        out_specs=(
            pl.BlockSpec((None, None, None, gp, d), lambda i, h, s: (i, h, s, 0, 0)),
            pl.BlockSpec((None, None, None, gp), lambda i, h, s: (i, h, s, 0)),
            pl.BlockSpec((None, None, None, gp), lambda i, h, s: (i, h, s, 0)),
        ),
        name="paged_decode_attention",
        **pallas_params(interpret, num_warps=4, num_stages=2),
    )(page_table.astype(jnp.int32), context_lens.astype(jnp.int32), q4, k_pages, v_pages)
    # Merge the splits (flash-decoding): rescale each to the common max; empty splits have
    # l = 0 and m = _NEG, so they weigh nothing.
    m_all = jnp.max(m, axis=2, keepdims=True)
    w = jnp.exp(m - m_all)  # [B, Hkv, S, Gp]
    l_all = jnp.sum(w * l, axis=2)
    o = jnp.sum(w[..., None] * o, axis=2) / jnp.where(l_all > 0, l_all, 1.0)[..., None]
    o = o[:, :, :g].reshape(bsz, hq, d)
    return jnp.where((context_lens > 0)[:, None, None], o, 0.0).astype(q.dtype)
