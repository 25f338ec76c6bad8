"""A persistent sorted list of free extents: (offset, length) pairs ordered by offset.

The Host arena keeps its free space here. Extents are stored in blocks of at most 2·BLOCK
entries, each block with its first offset and its largest length, so that
- first-fit (lowest offset whose length is at least `size`, HOST-1) scans block maxima and
  then one block;
- locating an offset is two bisections;
- an update copies one block and the short outer tuples (structural sharing for the rest).
Nothing here coalesces or checks overlap: `ledger.arena` owns those rules.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import Iterator, NamedTuple

BLOCK = 64  # target entries per block; a block splits above 2·BLOCK


class ExtentList(NamedTuple):
    offs: tuple[tuple[int, ...], ...]  # per block: offsets, ascending
    lens: tuple[tuple[int, ...], ...]  # per block: lengths, aligned with offs
    firsts: tuple[int, ...]  # first offset of each block
    maxes: tuple[int, ...]  # largest length of each block
    count: int  # number of extents
    total: int  # sum of lengths


EMPTY = ExtentList((), (), (), (), 0, 0)


def from_sorted(pairs: list[tuple[int, int]]) -> ExtentList:
    """Build from (offset, length) pairs already sorted by offset."""
    offs, lens, firsts, maxes = [], [], [], []
    for i in range(0, len(pairs), BLOCK):
        chunk = pairs[i : i + BLOCK]
        o = tuple(p[0] for p in chunk)
        l = tuple(p[1] for p in chunk)
        offs.append(o)
        lens.append(l)
        firsts.append(o[0])
        maxes.append(max(l))
    return ExtentList(tuple(offs), tuple(lens), tuple(firsts), tuple(maxes), len(pairs), sum(p[1] for p in pairs))


def iter_extents(el: ExtentList) -> Iterator[tuple[int, int]]:
    for o, l in zip(el.offs, el.lens):
        yield from zip(o, l)


def max_len(el: ExtentList) -> int:
    return max(el.maxes) if el.maxes else 0


def first_fit(el: ExtentList, size: int) -> tuple[int, int] | None:
    """(block, index) of the lowest-offset extent with length >= size, or None."""
    for bi, m in enumerate(el.maxes):
        if m >= size:
            for j, l in enumerate(el.lens[bi]):
                if l >= size:
                    return bi, j
    return None


def position(el: ExtentList, offset: int) -> tuple[int, int]:
    """(block, index) where an extent starting at `offset` is or would be inserted."""
    if not el.firsts:
        return 0, 0
    bi = bisect_right(el.firsts, offset) - 1
    if bi < 0:
        bi = 0
    return bi, bisect_left(el.offs[bi], offset)


def get(el: ExtentList, bi: int, j: int) -> tuple[int, int]:
    return el.offs[bi][j], el.lens[bi][j]


def prev_pos(el: ExtentList, bi: int, j: int) -> tuple[int, int] | None:
    """The position before (bi, j) (which may be one past a block's end), or None."""
    if j > 0:
        return bi, j - 1
    if bi > 0:
        return bi - 1, len(el.offs[bi - 1]) - 1
    return None


def at_or_next(el: ExtentList, bi: int, j: int) -> tuple[int, int] | None:
    """(bi, j) itself if it names an extent, else the first extent of the next block."""
    if bi < len(el.offs) and j < len(el.offs[bi]):
        return bi, j
    if bi + 1 < len(el.offs):
        return bi + 1, 0
    return None


def _with_block(el: ExtentList, bi: int, o: tuple, l: tuple, dcount: int, dtotal: int) -> ExtentList:
    head_o, tail_o = el.offs[:bi], el.offs[bi + 1 :]
    head_l, tail_l = el.lens[:bi], el.lens[bi + 1 :]
    head_f, tail_f = el.firsts[:bi], el.firsts[bi + 1 :]
    head_m, tail_m = el.maxes[:bi], el.maxes[bi + 1 :]
    if not o:
        return ExtentList(head_o + tail_o, head_l + tail_l, head_f + tail_f, head_m + tail_m,
                          el.count + dcount, el.total + dtotal)
    if len(o) > 2 * BLOCK:
        h = len(o) // 2
        return ExtentList(head_o + (o[:h], o[h:]) + tail_o, head_l + (l[:h], l[h:]) + tail_l,
                          head_f + (o[0], o[h]) + tail_f, head_m + (max(l[:h]), max(l[h:])) + tail_m,
                          el.count + dcount, el.total + dtotal)
    return ExtentList(head_o + (o,) + tail_o, head_l + (l,) + tail_l, head_f + (o[0],) + tail_f,
                      head_m + (max(l),) + tail_m, el.count + dcount, el.total + dtotal)


def replace_at(el: ExtentList, bi: int, j: int, offset: int, length: int) -> ExtentList:
    """Replace the extent at (bi, j); the caller keeps the offset order intact."""
    o, l = el.offs[bi], el.lens[bi]
    old = l[j]
    return _with_block(el, bi, o[:j] + (offset,) + o[j + 1 :], l[:j] + (length,) + l[j + 1 :], 0, length - old)


def remove_at(el: ExtentList, bi: int, j: int) -> ExtentList:
    o, l = el.offs[bi], el.lens[bi]
    old = l[j]
    return _with_block(el, bi, o[:j] + o[j + 1 :], l[:j] + l[j + 1 :], -1, -old)


def insert(el: ExtentList, offset: int, length: int) -> ExtentList:
    """Insert an extent at its offset position (no coalescing, no overlap check)."""
    if not el.offs:
        return ExtentList(((offset,),), ((length,),), (offset,), (length,), 1, length)
    bi, j = position(el, offset)
    o, l = el.offs[bi], el.lens[bi]
    return _with_block(el, bi, o[:j] + (offset,) + o[j:], l[:j] + (length,) + l[j:], 1, length)
