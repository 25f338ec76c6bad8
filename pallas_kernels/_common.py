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


def check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")
    return backend


def shape_error(name: str, shape, expected: str) -> ValueError:
    return ValueError(f"{name} has shape {tuple(shape)}, expected {expected}")


def check_ndim(name: str, x, ndim: int, expected: str) -> None:
    if len(x.shape) != ndim:
        raise shape_error(name, x.shape, expected)


def check_int(name: str, x) -> None:
    if not jnp.issubdtype(x.dtype, jnp.integer):
        raise ValueError(f"{name} must be an integer array, got dtype {x.dtype}")


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
