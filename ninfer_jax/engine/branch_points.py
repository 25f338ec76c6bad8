"""Branch points: a documented reading of SH-6 (an automatic structure position the frontend
may offer), for every prompt.

A pre-tokenised prompt (`Engine.submit`, token-level traces) has no structure: it is saved only
at its end (P) and E, so a system prompt that every session shares is never a source unless the
client names it. A rendered chat prompt has the structure its rendering marks (markers,
recovery points), which is its own conversation's: the default marker lies at its last part, so
the system prompt and tool block that other sessions share were not a source either (on the
chat trace at a small cache, no first turn reused one). `KnownHistories` remembers, block by
block (the identity's 64-token digests), the prompts admitted recently; at a prompt's first
admission the position where it leaves every known history — the end of the longest block
prefix it shares with one of them — becomes one automatic shared-entry save opportunity
(`SavePoint(shared=True, explicit=False)`), when it lies past the bound source and before the
prompt's end; a rendered prompt's gives way when four shared markers are in use, as an
automatic marker does. The next prompt that shares that prefix finds a source there, the way a
radix tree splits a node where two requests diverge. Two different prompts reaching the same
block prefix is the repeated demand that makes the position worth a save.

Block granularity (64 tokens) keeps this O(blocks) per admission and a few bytes per remembered
block; the point is the last shared block boundary, so up to 63 shared tokens are left to
prefill. The memory is bounded (`capacity` blocks, least recently seen dropped first) and is a
hint only: the saved entry goes through admission, reclamation and every cache rule like any.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

from ledger.identity import BLOCK

DEFAULT_CAPACITY = 1 << 18  # remembered blocks (16M tokens of history)


class KnownHistories:
    def __init__(self, capacity: int = DEFAULT_CAPACITY):
        self.capacity = capacity
        self._blocks: OrderedDict = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def shared_blocks(self, blocks: Sequence) -> int:
        """How many leading blocks of `blocks` (chained digests) some remembered history has."""
        k = 0
        for digest in blocks:
            if (k, digest) not in self._blocks:
                break
            k += 1
        return k

    def remember(self, blocks: Sequence) -> None:
        known = self._blocks
        for k, digest in enumerate(blocks):
            key = (k, digest)
            if key in known:
                known.move_to_end(key)
            else:
                known[key] = None
        while len(known) > self.capacity:
            known.popitem(last=False)

    def branch_point(self, blocks: Sequence, n_tokens: int, bound: int) -> int | None:
        """The frontier where a prompt of `n_tokens` with these blocks leaves every remembered
        history, when that lies strictly between `bound` (what its source covers) and its end."""
        b = self.shared_blocks(blocks) * BLOCK
        return b if bound < b < n_tokens else None
