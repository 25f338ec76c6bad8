"""A persistent sorted sequence of distinct, comparable items (tuples), kept in chunks.

Each version is immutable; `add`/`remove` copy one chunk of at most 2 x CHUNK items and the
chunk directory (C-speed tuple copies), so a change costs O(CHUNK + n / CHUNK) and old versions
stay valid. Iteration walks the chunks in order. An optional per-chunk summary (`agg`, e.g. the
smallest freed amount in the chunk) lets a reader skip whole chunks that cannot hold what it
looks for (`scan(keep)`): the victim order uses it to serve a gap-dependent ranking from one
stored order, and the reuse segment to add up footprints chunk by chunk.
"""
from __future__ import annotations

from bisect import bisect_left
from typing import Callable, Iterator

CHUNK = 64


class PSorted:
    __slots__ = ("chunks", "maxes", "aggs", "agg", "size")

    def __init__(self, agg: Callable | None = None, chunks: tuple = (), maxes: tuple = (), aggs: tuple = (),
                 size: int = 0):
        self.agg = agg
        self.chunks = chunks
        self.maxes = maxes
        self.aggs = aggs
        self.size = size

    # -- reading -------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator:
        for c in self.chunks:
            yield from c

    def __contains__(self, item) -> bool:
        i = bisect_left(self.maxes, item)
        if i == len(self.chunks):
            return False
        c = self.chunks[i]
        j = bisect_left(c, item)
        return j < len(c) and c[j] == item

    def __eq__(self, other) -> bool:
        if self is other:
            return True
        if not isinstance(other, PSorted) or self.size != other.size:
            return False
        return list(self) == list(other)

    def __hash__(self):  # content equality; not meant as a dict key
        raise TypeError("PSorted is not hashable")

    def __repr__(self) -> str:
        return f"PSorted({list(self)[:8]}{'...' if self.size > 8 else ''}, n={self.size})"

    def first(self):
        return self.chunks[0][0] if self.chunks else None

    def scan(self, keep_chunk: Callable | None = None, start=None) -> Iterator:
        """Items in order (from `start` on); chunks whose summary fails `keep_chunk` are skipped."""
        chunks, aggs = self.chunks, self.aggs
        i0, j0 = 0, 0
        if start is not None:
            i0 = bisect_left(self.maxes, start)
            if i0 < len(chunks):
                j0 = bisect_left(chunks[i0], start)
        for i in range(i0, len(chunks)):
            if keep_chunk is not None and not keep_chunk(aggs[i]):
                j0 = 0
                continue
            c = chunks[i]
            if j0:
                yield from c[j0:]
                j0 = 0
            else:
                yield from c

    def chunk_view(self):
        """(summary, items) per chunk, in order."""
        return zip(self.aggs, self.chunks) if self.agg is not None else ((None, c) for c in self.chunks)

    # -- changing ------------------------------------------------------------------------
    def _with(self, i: int, new: tuple | None, split: bool = True, added=None) -> "PSorted":
        """Replace chunk i by `new` (None/empty: delete it), splitting an oversized chunk.
        `added`: the one item `new` gained, when the summary can simply take it in (`agg.add`)."""
        chunks, maxes, aggs = self.chunks, self.maxes, self.aggs
        agg = self.agg
        old = len(chunks[i]) if i < len(chunks) else 0
        if not new:
            return PSorted(agg, chunks[:i] + chunks[i + 1:], maxes[:i] + maxes[i + 1:],
                           aggs[:i] + aggs[i + 1:] if agg is not None else aggs, self.size - old)
        if not split or len(new) <= 2 * CHUNK:  # the common case: one chunk in place
            if agg is not None:
                grow = getattr(agg, "add", None)
                a = grow(aggs[i], added) if added is not None and grow is not None and i < len(aggs) else agg(new)
                aggs = aggs[:i] + (a,) + aggs[i + 1:]
            return PSorted(agg, chunks[:i] + (new,) + chunks[i + 1:], maxes[:i] + (new[-1],) + maxes[i + 1:], aggs,
                           self.size - old + len(new))
        h = len(new) // 2
        a, b = new[:h], new[h:]
        return PSorted(agg, chunks[:i] + (a, b) + chunks[i + 1:], maxes[:i] + (a[-1], b[-1]) + maxes[i + 1:],
                       aggs[:i] + (agg(a), agg(b)) + aggs[i + 1:] if agg is not None else aggs,
                       self.size - old + len(new))

    def add(self, item) -> "PSorted":
        chunks = self.chunks
        if not chunks:
            return PSorted(self.agg, ((item,),), (item,), (self.agg((item,)),) if self.agg else (), 1)
        i = bisect_left(self.maxes, item)
        if i == len(chunks):
            i -= 1
        c = chunks[i]
        j = bisect_left(c, item)
        if j < len(c) and c[j] == item:
            return self
        return self._with(i, c[:j] + (item,) + c[j:], added=item)

    def remove(self, item) -> "PSorted":
        i = bisect_left(self.maxes, item)
        if i == len(self.chunks):
            raise KeyError(item)
        c = self.chunks[i]
        j = bisect_left(c, item)
        if j == len(c) or c[j] != item:
            raise KeyError(item)
        new = c[:j] + c[j + 1:]
        if new and len(new) < CHUNK // 4 and len(self.chunks) > 1:  # merge a small chunk into a neighbour
            k = i - 1 if i > 0 else i + 1
            lo, hi = min(i, k), max(i, k)
            merged = (new + self.chunks[k]) if k > i else (self.chunks[k] + new)
            tmp = PSorted(self.agg, self.chunks[:lo] + (merged,) + self.chunks[hi + 1:],
                          self.maxes[:lo] + (merged[-1],) + self.maxes[hi + 1:],
                          (self.aggs[:lo] + (self.agg(merged),) + self.aggs[hi + 1:]) if self.agg else (),
                          self.size - 1)
            if len(merged) > 2 * CHUNK:
                return tmp._with(lo, merged)
            return tmp
        return self._with(i, new)

    def discard(self, item) -> "PSorted":
        try:
            return self.remove(item)
        except KeyError:
            return self

    def update(self, removes=(), adds=()) -> "PSorted":
        """Many changes at once (one rebuild of the touched chunks when the batch is large)."""
        if len(removes) + len(adds) > 64 and len(removes) + len(adds) > self.size // 8:
            items = set(self)
            items.difference_update(removes)
            items.update(adds)
            return from_sorted(sorted(items), self.agg)
        out = self
        for r in removes:
            out = out.remove(r)
        for a in adds:
            out = out.add(a)
        return out


def from_sorted(items, agg: Callable | None = None) -> PSorted:
    items = tuple(items)
    chunks = tuple(items[i:i + CHUNK] for i in range(0, len(items), CHUNK))
    return PSorted(agg, chunks, tuple(c[-1] for c in chunks), tuple(agg(c) for c in chunks) if agg else (),
                   len(items))
