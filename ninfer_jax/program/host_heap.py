"""Give the process's freed heap back to the operating system once the engine has started.

Loading a checkpoint builds every tensor on the Host before it moves to the device, and
compiling the steps allocates and frees far more; glibc keeps that freed heap mapped (RSS that
nothing holds: 1.1 GiB after loading a bf16 Qwen3.5-0.8B-shaped checkpoint, issue 33).
`release_free_heap` asks glibc to return it (`malloc_trim(0)`, every arena). Elsewhere (another
C library, another OS) it does nothing and says so.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _trim():
    """glibc's malloc_trim, or None where the C library has none."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):
        return None


def release_free_heap() -> bool:
    """Return freed heap to the OS; True when the C library could (glibc)."""
    trim = _trim()
    if trim is None:
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
    return True
