"""The engine's media cache: the vision tower's output per media item, under its own byte budget.

An entry is one item's tower tokens `[tokens, hidden]`, a Host numpy array (`Program.encode_media`
gives them there: each prefill chunk's media inputs are built on the Host, so that no device op
compiles anew for an item of a new size), keyed by the item's media
identity (`kind:digest`, the digest of its decoded pixels and processor settings). Requests take
it at each prefill chunk that covers the item; the same image in the next turn finds it here
and is not encoded again. Entries leave least recently used first when a new one would pass
`budget_bytes` (`EngineConfig.media_cache_bytes`); this budget is apart from the Host context
capacity and the pools. An entry a paused request needs again may be gone by then: its
Replay encodes the item again from the pixels the request keeps (PAUSE-6), and that is counted
(`vision_reencodes`). Budget 0 keeps nothing: every chunk that covers an item encodes it.

Encoding is deterministic per item (one item per tower call, the same bucket each time), so a
hit, a first encoding and a re-encoding give the same bits (doctrine 1).
"""
from __future__ import annotations

import collections
from typing import Callable

import numpy as np


class MediaCache:
    def __init__(self, budget_bytes: int):
        if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 0:
            raise ValueError(f"media cache budget must be a byte count >= 0, got {budget_bytes!r}")
        self.budget_bytes = budget_bytes
        self._entries: collections.OrderedDict[str, np.ndarray] = collections.OrderedDict()
        self.nbytes = 0

    def get(self, key: str, encode: Callable[[], np.ndarray]) -> tuple[np.ndarray, bool]:
        """(the item's tower tokens, whether they were encoded now). A miss runs `encode` and
        keeps the result if it fits the budget, evicting the least recently used first."""
        got = self._entries.get(key)
        if got is not None:
            self._entries.move_to_end(key)
            return got, False
        out = encode()
        size = out.nbytes
        if size <= self.budget_bytes:
            while self.nbytes + size > self.budget_bytes:
                _, old = self._entries.popitem(last=False)
                self.nbytes -= old.nbytes
            self._entries[key] = out
            self.nbytes += size
        return out, True

    def clear(self) -> None:
        self._entries.clear()
        self.nbytes = 0
