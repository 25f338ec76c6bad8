"""`release_free_heap` (issue 33): freed heap that glibc keeps goes back to the OS."""
import ctypes.util
import platform

import numpy as np
import pytest

from ninfer_jax.program.host_heap import release_free_heap


def _rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                    reason="malloc_trim is glibc's")
def test_freed_heap_returns_to_the_os():
    assert ctypes.util.find_library("c")
    # 256 MiB in 64 KiB blocks (below glibc's mmap threshold: they come from the heap), then a
    # block above them, so freeing them leaves a hole that free() itself does not return.
    blocks = [np.ones(16384, np.float32) for _ in range(4096)]
    pin = np.ones(16384, np.float32)
    del blocks
    before = _rss()
    assert release_free_heap() is True
    after = _rss()
    assert before - after > 128 * 2**20, (before, after)
    del pin
