"""Row gather / scatter / copy over a pool [N, ...]: the primitive behind copies between pools,
copy-on-write of a tail page and StateImage slot copies. Negative indices mean "no entry".
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels._common import (
    KernelArgumentError,
    check_backend,
    two_or_more,
    check_dims,
    check_int,
    largest_pow2_divisor,
    packed_as,
    pallas_params,
    unpacked,
)

# Elements moved per program: a power of two (Triton) that divides the row size exactly,
# so no masked tail is needed. Rows whose size has no large power-of-two factor still work,
# just with small blocks.
_MAX_BLOCK = 2048


# ----------------------------------------------------------------------------- validation


def _check_index(name, idx):
    if len(idx.shape) != 1:
        raise KernelArgumentError(f"{name} has shape {idx.shape}, expected [M]")
    check_int(name, idx)


def _check_pool(pool):
    if len(pool.shape) < 1:
        raise KernelArgumentError(f"pool has shape {pool.shape}, expected [N, ...]")


# ----------------------------------------------------------------------------- references


def _drop_negative(idx, n):
    # jnp scatter wraps negative indices, so map "skip" to an out-of-range index and drop it.
    return jnp.where(idx < 0, n, idx.astype(jnp.int32))


def gather_reference(pool, idx, *, unpack: bool = True):
    """`unpack`: a packed pool's rows read as bfloat16 (copy keeps them packed)."""
    n = pool.shape[0]
    rows = pool[two_or_more(jnp.clip(idx, 0, n - 1), 0)][:idx.shape[0]]
    keep = (idx >= 0).reshape((-1,) + (1,) * (pool.ndim - 1))
    rows = jnp.where(keep, rows, jnp.zeros((), pool.dtype))
    return unpacked(rows) if unpack else rows


def scatter_reference(pool, idx, values):
    n = pool.shape[0]
    values = two_or_more(packed_as(values, pool.dtype), 0)  # the padding row goes to index n: dropped
    return jnp.asarray(pool).at[two_or_more(_drop_negative(idx, n), n)].set(values, mode="drop")


def copy_reference(pool, src, dst):
    dst = jnp.where(src < 0, -1, dst)
    return scatter_reference(pool, dst, gather_reference(pool, src, unpack=False))


# ----------------------------------------------------------------------------- public


def gather(
    pool,  # [N, ...]
    idx,  # [M] int32; negative -> zeros
    *,
    backend: str = "xla",
):
    """Returns pool[idx] [M, ...], zeros where idx < 0 (a packed pool's rows as bfloat16)."""
    check_backend(backend)
    _check_pool(pool)
    _check_index("idx", idx)
    if backend == "xla":
        return gather_reference(pool, idx)
    return _gather_pallas(pool, idx, interpret=backend == "interpret")


def scatter(
    pool,  # [N, ...]
    idx,  # [M] int32; negative -> skipped
    values,  # [M, ...] (cast to pool.dtype; packed into a packed pool)
    *,
    backend: str = "xla",
):
    """Returns pool with pool[idx[m]] = values[m]. Duplicate non-negative indices: unspecified winner."""
    check_backend(backend)
    _check_pool(pool)
    _check_index("idx", idx)
    check_dims("values", values, (idx.shape[0],) + tuple(pool.shape[1:]), f"[{idx.shape[0]}, *{list(pool.shape[1:])}]")
    if backend == "xla":
        return scatter_reference(pool, idx, values)
    return _scatter_pallas(pool, idx, values, interpret=backend == "interpret")


def copy(
    pool,  # [N, ...]
    src,  # [M] int32
    dst,  # [M] int32; entries where src or dst is negative are skipped
    *,
    backend: str = "xla",
):
    """Returns pool with pool[dst[m]] = pool[src[m]]; every source is read before any write."""
    check_backend(backend)
    _check_pool(pool)
    _check_index("src", src)
    _check_index("dst", dst)
    if src.shape != dst.shape:
        raise KernelArgumentError(f"src has shape {src.shape} but dst has shape {dst.shape}; expected equal [M]")
    if backend == "xla":
        return copy_reference(pool, src, dst)
    return _copy_pallas(pool, src, dst, interpret=backend == "interpret")


# ----------------------------------------------------------------------------- Pallas
# Every pool is viewed as [N, nb, bf] (row m = nb blocks of bf elements); the grid is
# (M entries, nb blocks). Row indices are data, so the pool is passed whole and indexed by
# the scalar idx[m] inside the kernel (GPU Pallas has no scalar-prefetch index maps).


def _blocked(pool):
    n = pool.shape[0]
    f = math.prod(pool.shape[1:])
    bf = largest_pow2_divisor(f, _MAX_BLOCK)
    return pool.reshape(n, f // bf, bf), f // bf, bf


def _whole(shape):
    return pl.BlockSpec(tuple(shape), lambda *_: (0,) * len(shape))


def _gather_kernel(idx_ref, pool_ref, out_ref):
    # idx_ref [M] int32; pool_ref [N, nb, bf]; out_ref [bf] (entry m, block j)
    m, j = pl.program_id(0), pl.program_id(1)
    n = pool_ref.shape[0]
    i = idx_ref[m]
    row = pool_ref[jnp.clip(i, 0, n - 1), j, :]
    out_ref[...] = jnp.where(i >= 0, row, jnp.zeros_like(row))


def _scatter_kernel(idx_ref, values_ref, pool_ref, out_ref):
    # idx_ref [M]; values_ref [bf]; pool_ref (aliased to out_ref, not read) [N, nb, bf]
    del pool_ref
    m, j = pl.program_id(0), pl.program_id(1)
    n = out_ref.shape[0]
    i = idx_ref[m]

    @pl.when((i >= 0) & (i < n))
    def _():
        out_ref[i, j, :] = values_ref[...]


def _gather_pallas(pool, idx, *, interpret):
    flat, nb, bf = _blocked(pool)
    m = idx.shape[0]
    out = pl.pallas_call(
        _gather_kernel,
        out_shape=jax.ShapeDtypeStruct((m, nb, bf), pool.dtype),
        grid=(m, nb),
        in_specs=[_whole((m,)), _whole(flat.shape)],
        out_specs=pl.BlockSpec((None, None, bf), lambda i, j: (i, j, 0)),
        name="page_gather",
        **pallas_params(interpret),
    )(idx.astype(jnp.int32), flat)
    return out.reshape((m,) + tuple(pool.shape[1:]))


def _scatter_pallas(pool, idx, values, *, interpret):
    flat, nb, bf = _blocked(pool)
    m = idx.shape[0]
    vals = values.astype(pool.dtype).reshape(m, nb, bf)
    out = pl.pallas_call(
        _scatter_kernel,
        out_shape=jax.ShapeDtypeStruct(flat.shape, pool.dtype),
        grid=(m, nb),
        in_specs=[
            _whole((m,)),
            pl.BlockSpec((None, None, bf), lambda i, j: (i, j, 0)),
            _whole(flat.shape),
        ],
        out_specs=_whole(flat.shape),
        # The pool is updated in place when the caller donates it.
        input_output_aliases={2: 0},
        name="page_scatter",
        **pallas_params(interpret),
    )(idx.astype(jnp.int32), vals, flat)
    return out.reshape(pool.shape)


def _copy_pallas(pool, src, dst, *, interpret):
    # Two passes (gather all sources, then scatter) so that chains like 0->1, 1->2 read the
    # old rows: a single in-place pass would race between programs.
    rows = _gather_pallas(pool, src, interpret=interpret)
    dst = jnp.where(src < 0, -1, dst)
    return _scatter_pallas(pool, dst, rows, interpret=interpret)
