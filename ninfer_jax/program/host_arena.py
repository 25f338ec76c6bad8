"""The Host arena buffer: one host byte buffer addressed by the ledger's extents (CFG-5).

The ledger's `HostArena` decides every offset; this class only holds the bytes: one numpy
buffer (allocated lazily by the OS, so a large default capacity costs nothing until written).
Transfers read and write it in place through `view` (a zero-copy numpy view of a region), so a
D2H copy lands straight in the arena's bytes and an H2D copy reads them from here
(program/transfers.py; which memory the device side of a copy uses is decided there).

A transfer still in flight may own a region (its bytes not yet written, or not yet read): the
`guard` (set by `Transfers`) settles such a region before `read` or `write` touch it, so these
two always see and leave the bytes the ledger's plans say.
"""
from __future__ import annotations

from typing import Callable

import numpy as np


class HostArenaBuffer:
    def __init__(self, capacity_bytes: int):
        if not isinstance(capacity_bytes, int) or capacity_bytes < 0:
            raise ValueError(f"host capacity must be a non-negative int, got {capacity_bytes!r}")
        self.capacity = capacity_bytes
        self.buf = np.zeros(capacity_bytes, dtype=np.uint8)
        # guard(lo, hi, write): settle transfers in flight over [lo, hi) before a host access.
        self.guard: Callable[[int, int, bool], None] | None = None

    def _check(self, offset: int, nbytes: int, what: str) -> None:
        if offset < 0 or nbytes < 0 or offset + nbytes > self.capacity:
            raise ValueError(f"host {what} [{offset}, {offset + nbytes}) outside the arena of {self.capacity} B")

    def view(self, offset: int, nbytes: int) -> np.ndarray:
        """The region's bytes themselves (no copy; no guard: the caller owns the region)."""
        self._check(offset, nbytes, "view")
        return self.buf[offset:offset + nbytes]

    def write(self, offset: int, data: np.ndarray) -> None:
        data = np.asarray(data, dtype=np.uint8).reshape(-1)
        self._check(offset, data.size, "write")
        if self.guard is not None:
            self.guard(offset, offset + data.size, True)
        self.buf[offset:offset + data.size] = data

    def read(self, offset: int, nbytes: int) -> np.ndarray:
        """A copy of the region's bytes, once every transfer writing them has landed."""
        self._check(offset, nbytes, "read")
        if self.guard is not None:
            self.guard(offset, offset + nbytes, False)
        return self.buf[offset:offset + nbytes].copy()
