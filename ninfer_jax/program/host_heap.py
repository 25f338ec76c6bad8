"""The Host memory the process keeps past weights and pools (issue 33: peak RSS while decoding).

- `settle`, once the engine has warmed up. Loading a checkpoint builds every tensor on the Host
  before it moves to the device, and compiling the steps allocates and frees far more; glibc
  keeps that freed heap mapped (RSS that nothing holds: 1.1 GiB after loading a bf16
  Qwen3.5-0.8B-shaped checkpoint). `settle` asks glibc to return it (`malloc_trim(0)`, every
  arena). In a process NInfer owns it also drops JAX's staging caches (`jax.clear_caches`): the
  traces the warm-up made hold 13–32 MiB for the 0.8B-shaped decode step, and the engine never traces
  again (its steps run as the executables `CompiledSteps` holds; a new bucket retraces). Inside
  a caller's JAX program they stay: clearing them would make the caller's own jitted functions
  trace again.
- `own_process`, first thing in the `ninfer` command, marks the process as NInfer's.

Capping glibc's malloc arenas as well (`mallopt(M_ARENA_MAX, 2)`) was measured and not kept: over
9 runs of `scripts/bench_dtype.py rss --geometry 0.8b` the peak was the same with 2 arenas as
with glibc's 16 (run-to-run spread ±1.5 %).

Elsewhere (another C library, another OS) the glibc calls do nothing and say so.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools

import jax

_owned = False


@functools.cache
def _libc():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def own_process() -> None:
    """Mark this process as NInfer's (the `ninfer` command): `settle` may then drop JAX's caches."""
    global _owned
    _owned = True


def owns_process() -> bool:
    return _owned


def release_free_heap() -> bool:
    """Return freed heap to the OS; True when the C library could (glibc)."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is None:
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
    return True


def settle() -> None:
    """After warm-up: drop JAX's staging caches where NInfer owns the process, then give the
    freed heap back."""
    if _owned:
        jax.clear_caches()
    release_free_heap()
