"""Row gather / scatter / copy over a pool [N, ...]: the primitive behind copies between pools,
copy-on-write of a tail page and StateImage slot copies. Negative indices mean "no entry".
"""
from __future__ import annotations

import jax.numpy as jnp

from pallas_kernels._common import check_backend, check_dims, check_int


# ----------------------------------------------------------------------------- validation


def _check_index(name, idx):
    if len(idx.shape) != 1:
        raise ValueError(f"{name} has shape {idx.shape}, expected [M]")
    check_int(name, idx)


def _check_pool(pool):
    if len(pool.shape) < 1:
        raise ValueError(f"pool has shape {pool.shape}, expected [N, ...]")


# ----------------------------------------------------------------------------- references


def _drop_negative(idx, n):
    # jnp scatter wraps negative indices, so map "skip" to an out-of-range index and drop it.
    return jnp.where(idx < 0, n, idx.astype(jnp.int32))


def gather_reference(pool, idx):
    n = pool.shape[0]
    rows = pool[jnp.clip(idx, 0, n - 1)]
    keep = (idx >= 0).reshape((-1,) + (1,) * (pool.ndim - 1))
    return jnp.where(keep, rows, jnp.zeros((), pool.dtype))


def scatter_reference(pool, idx, values):
    return pool.at[_drop_negative(idx, pool.shape[0])].set(values.astype(pool.dtype), mode="drop")


def copy_reference(pool, src, dst):
    dst = jnp.where(src < 0, -1, dst)
    return scatter_reference(pool, dst, gather_reference(pool, src))


# ----------------------------------------------------------------------------- public


def gather(
    pool,  # [N, ...]
    idx,  # [M] int32; negative -> zeros
    *,
    backend: str = "xla",
):
    """Returns pool[idx] [M, ...], zeros where idx < 0."""
    check_backend(backend)
    _check_pool(pool)
    _check_index("idx", idx)
    if backend == "xla":
        return gather_reference(pool, idx)
    return _gather_pallas(pool, idx, interpret=backend == "interpret")


def scatter(
    pool,  # [N, ...]
    idx,  # [M] int32; negative -> skipped
    values,  # [M, ...] (cast to pool.dtype)
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
        raise ValueError(f"src has shape {src.shape} but dst has shape {dst.shape}; expected equal [M]")
    if backend == "xla":
        return copy_reference(pool, src, dst)
    return _copy_pallas(pool, src, dst, interpret=backend == "interpret")


# ----------------------------------------------------------------------------- Pallas


def _gather_pallas(*args, interpret):
    raise NotImplementedError("Pallas gather: not written yet")


def _scatter_pallas(*args, interpret):
    raise NotImplementedError("Pallas scatter: not written yet")


def _copy_pallas(*args, interpret):
    raise NotImplementedError("Pallas copy: not written yet")
