"""Small helpers shared by the kernel files: backend names and static shape checks.

Kept free of model knowledge: every kernel file imports only jax, numpy and this module.
"""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp

BACKENDS = ("xla", "pallas", "interpret")

# float32 matmuls must not silently drop to TF32/bf16 passes on GPU: the references are the
# exactness oracle for the kernels and the CPU model.
HIGHEST = jax.lax.Precision.HIGHEST


class KernelArgumentError(ValueError):
    """A kernel wrapper's argument of the wrong shape or dtype, or an unknown backend.

    Raised by the wrappers' static checks, which read only shapes and dtypes: under jit they
    run once, at trace time, so a compiled step pays nothing for them. The message names the
    argument, where XLA would report an anonymous operand deep inside the kernel.
    """


def check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise KernelArgumentError(f"unknown backend {backend!r}; expected one of {BACKENDS}")
    return backend


def shape_error(name: str, shape, expected: str) -> KernelArgumentError:
    return KernelArgumentError(f"{name} has shape {tuple(shape)}, expected {expected}")


def check_ndim(name: str, x, ndim: int, expected: str) -> None:
    if len(x.shape) != ndim:
        raise shape_error(name, x.shape, expected)


def check_int(name: str, x) -> None:
    if not jnp.issubdtype(x.dtype, jnp.integer):
        raise KernelArgumentError(f"{name} must be an integer array, got dtype {x.dtype}")


def check_float(name: str, x) -> None:
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise KernelArgumentError(f"{name} must be a floating array, got dtype {x.dtype}")


# XLA's CPU backend has no bfloat16 scatter: it converts the whole operand to float32 and
# back, a round trip through every byte of a pool at each write (issue 33: 59 ms a step at 8192
# pages). The "xla" path therefore keeps a bfloat16 pool as its uint16 bit patterns, "packed":
# a write packs the rows it writes, a read unpacks the rows it read, a copy moves bits. The
# Pallas path keeps bfloat16 (its kernels write rows, not a scatter).
PACKED = jnp.dtype(jnp.uint16)


def storage_dtype(dtype, backend: str):
    """The dtype a pool of `dtype` is stored in on `backend` (PACKED for bfloat16 on "xla")."""
    dtype = jnp.dtype(dtype)
    return PACKED if backend == "xla" and dtype == jnp.bfloat16 else dtype


def unpacked(x):
    """Rows read from a pool, as numbers: a packed pool's bits read as bfloat16."""
    return jax.lax.bitcast_convert_type(x, jnp.bfloat16) if x.dtype == PACKED else x


def packed_as(values, pool_dtype):
    """`values` in a pool's storage dtype: cast, then packed if the pool is (packed values,
    moved from another packed pool, stay as they are)."""
    if jnp.dtype(pool_dtype) == PACKED and values.dtype != PACKED:
        return jax.lax.bitcast_convert_type(values.astype(jnp.bfloat16), PACKED)
    return values.astype(pool_dtype)


def check_pool_float(name: str, x) -> None:
    """A pool of numbers: floating, or packed bfloat16."""
    if x.dtype != PACKED:
        check_float(name, x)


def check_float32(name: str, x) -> None:
    """Recurrent states stay float32 whatever the model dtype (their error compounds per token)."""
    if x.dtype != jnp.float32:
        raise KernelArgumentError(f"{name} must be float32, got dtype {x.dtype}")


def check_dims(name: str, x, expected_dims: Sequence[int | None], expected: str) -> None:
    """x.shape must match expected_dims (None = any size)."""
    if len(x.shape) != len(expected_dims) or any(
        e is not None and s != e for s, e in zip(x.shape, expected_dims)
    ):
        raise shape_error(name, x.shape, expected)


def is_pow2(n: int) -> bool:
    return n > 0 and (n & (n - 1)) == 0


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def pallas_params(interpret: bool, num_warps: int = 4, num_stages: int = 2) -> dict:
    """pallas_call keyword arguments selecting the Triton lowering (or the interpreter).

    JAX >= 0.10 lowers a plain pallas_call on GPU with Mosaic GPU; these kernels are written
    for Triton (power-of-two blocks, pointer loads), so the Triton CompilerParams are explicit.
    """
    if interpret:
        return {"interpret": True}
    from jax.experimental.pallas import triton as pltriton

    return {"compiler_params": pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages)}


def largest_pow2_divisor(n: int, cap: int) -> int:
    """Largest power of two dividing n, at most cap: a block size that tiles n exactly."""
    b = 1
    while b * 2 <= cap and n % (b * 2) == 0:
        b *= 2
    return b


def dot(a, b, *, trans_b: bool = False):
    """2-D matmul for kernel bodies, float32 accumulation.

    float32 operands use Precision.HIGHEST (Triton "ieee", no TF32) so kernels match the
    references; bf16 operands run on tensor cores as they are.
    """
    dims = (((1,), (1 if trans_b else 0,)), ((), ()))
    return jax.lax.dot_general(a, b, dims, precision=HIGHEST, preferred_element_type=jnp.float32)


def dot_tn(a, b):
    """a^T @ b for 2-D a [K, M], b [K, N] -> [M, N] (float32)."""
    dims = (((0,), (0,)), ((), ()))
    return jax.lax.dot_general(a, b, dims, precision=HIGHEST, preferred_element_type=jnp.float32)


def two_or_more(idx, fill):
    """`idx` ([M] or [M, ...] indices) with one row of `fill` appended when M is 1.

    XLA rewrites a gather or scatter of a single index into a dynamic-slice or
    dynamic-update-slice, which its fusion pass then duplicates into every consumer; a
    duplicated read of a pool that an in-place write does not depend on (or a duplicated write)
    makes copy insertion copy the whole pool. With two indices the op stays a gather or
    scatter, read or written once. `fill`: an index the caller drops (scatter, out of range) or
    discards (gather, sliced off)."""
    if idx.shape[0] != 1:
        return idx
    return jnp.concatenate([idx, jnp.full_like(idx, fill)], axis=0)


def _tree(x, axis: int, combine, fill):
    """`combine` over `axis` as a fixed binary tree of elementwise ops (padded with `fill` to a
    power of two)."""
    axis = axis % x.ndim  # halves are sliced along `axis` in place: no transpose of x
    n = x.shape[axis]
    width = next_pow2(n)
    if width != n:
        pad = list(x.shape)
        pad[axis] = width - n
        x = jnp.concatenate([x, jnp.full(pad, fill, x.dtype)], axis=axis)
    while x.shape[axis] > 1:
        half = x.shape[axis] // 2
        x = combine(jax.lax.slice_in_dim(x, 0, half, axis=axis), jax.lax.slice_in_dim(x, half, 2 * half, axis=axis))
    return jnp.squeeze(x, axis)


def tree_sum(x, axis: int = -1):
    """Sum over `axis` as a fixed binary tree of elementwise adds (zero-padded to a power of two).

    Batch invariance (doctrine 1): XLA's CPU reduce vectorises by the shape and the fusion it
    lands in, so the same row summed alone or beside other rows can round differently; a tree of
    slices and adds is the same arithmetic for every element whatever the rest of the array."""
    return _tree(x, axis, jnp.add, 0)


def tree_max(x, axis: int = -1):
    """Max over `axis` as a fixed binary tree of elementwise maxima (padded with -inf).

    A max is exact in any order, but a reduce op is not neutral either: above a size XLA's CPU
    backend hands a reduce to a YNNPACK fusion that also takes the elementwise ops after it (the
    softmax's exp), which round otherwise than XLA's own loops, so a row's exp would depend on
    how many rows share the array (batch invariance, doctrine 1). Slices and maxima stay XLA's."""
    return _tree(x, axis, jnp.maximum, -jnp.inf)


def softmax(s):
    """Softmax over the last axis with `tree_sum` (its max is exact in any order)."""
    e = jnp.exp(s - jnp.max(s, axis=-1, keepdims=True))
    return e / tree_sum(e)[..., None]
