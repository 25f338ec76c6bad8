"""The Host arena buffer: one host byte buffer addressed by the ledger's extents (CFG-5).

The ledger's `HostArena` decides every offset; this class only holds the bytes. In the
original it is pinned host memory; here a numpy buffer (allocated lazily by the OS, so a
large default capacity costs nothing until written).
"""
from __future__ import annotations

import numpy as np


class HostArenaBuffer:
    def __init__(self, capacity_bytes: int):
        if not isinstance(capacity_bytes, int) or capacity_bytes < 0:
            raise ValueError(f"host capacity must be a non-negative int, got {capacity_bytes!r}")
        self.capacity = capacity_bytes
        self.buf = np.zeros(capacity_bytes, dtype=np.uint8)

    def write(self, offset: int, data: np.ndarray) -> None:
        data = np.asarray(data, dtype=np.uint8).reshape(-1)
        if offset < 0 or offset + data.size > self.capacity:
            raise ValueError(f"host write [{offset}, {offset + data.size}) outside the arena of {self.capacity} B")
        self.buf[offset:offset + data.size] = data

    def read(self, offset: int, nbytes: int) -> np.ndarray:
        if offset < 0 or nbytes < 0 or offset + nbytes > self.capacity:
            raise ValueError(f"host read [{offset}, {offset + nbytes}) outside the arena of {self.capacity} B")
        return self.buf[offset:offset + nbytes].copy()
