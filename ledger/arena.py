"""The Host arena model: one byte range addressed by extents (CFG-5, HOST-1, HOST-3).

A `HostArena` value is immutable. Free space is an `ExtentList` ordered by offset; every
allocation is an entry offset -> length in `used`. The allocator owns extent split, release
and coalescing (CFG-5):
- `alloc`  first-fit (lowest offset that fits), splitting the extent it takes from;
- `take`   carves a given range (what a committed plan replays);
- `free`   returns one allocation and coalesces it with free neighbours;
- `place`  places a whole request or nothing (HOST-1): each StateImage one contiguous block,
  KV in page groups that are halved and retried when they do not fit (HOST-3). Enough free
  bytes in total is not enough; the shortfall says which allocations found no extent.
"""
from __future__ import annotations

from collections import deque
from typing import NamedTuple, Sequence

import immutables

from ledger import extents as ex
from ledger.errors import ArenaError, InvalidRequest

# Sizes beyond this are refused as absurd (1 PiB); keeps arithmetic honest.
MAX_BYTES = 1 << 50


class HostArena(NamedTuple):
    capacity: int
    free: ex.ExtentList
    used: immutables.Map  # offset -> length of one allocation
    used_bytes: int

    @property
    def free_bytes(self) -> int:
        return self.free.total

    @property
    def largest_free(self) -> int:
        return ex.max_len(self.free)


class HostAllocation(NamedTuple):
    """One placement unit: `pieces` equal allocations laid out contiguously.

    pieces == 1: a block (a StateImage, HOST-1). pieces > 1: a KV page group of `pieces` pages
    that may be split in halves when it does not fit (HOST-3); each page stays its own
    allocation so it can be freed alone.
    """

    size: int
    pieces: int = 1


class HostShortfall(NamedTuple):
    """Why a Host request could not be placed (HOST-1): bytes, and allocations without room."""

    needed_bytes: int
    free_bytes: int
    bytes_missing: int  # max(0, needed - free): 0 when bytes suffice but nothing fits
    largest_free_extent: int
    unplaced: tuple[int, ...]  # sizes of the allocations that found no contiguous extent


def empty_arena(capacity: int) -> HostArena:
    _check_size(capacity, "host capacity", allow_zero=True)
    free = ex.from_sorted([(0, capacity)]) if capacity else ex.EMPTY
    return HostArena(capacity, free, immutables.Map(), 0)


def _check_size(n, what: str, allow_zero: bool = False) -> None:
    if not isinstance(n, int) or isinstance(n, bool):
        raise InvalidRequest(f"{what} must be an int, got {type(n).__name__}")
    if n < 0 or (n == 0 and not allow_zero):
        raise InvalidRequest(f"{what} must be {'>= 0' if allow_zero else '> 0'}, got {n}")
    if n > MAX_BYTES:
        raise InvalidRequest(f"{what} {n} exceeds the absurd-size bound {MAX_BYTES}")


def _carve(arena: HostArena, bi: int, j: int, offset: int, length: int, pieces: int) -> HostArena:
    """Remove [offset, offset+length) from the free extent at (bi, j) that contains it."""
    o, l = ex.get(arena.free, bi, j)
    left, right = offset - o, o + l - (offset + length)
    el = arena.free
    if left == 0 and right == 0:
        el = ex.remove_at(el, bi, j)
    elif left == 0:
        el = ex.replace_at(el, bi, j, offset + length, right)
    elif right == 0:
        el = ex.replace_at(el, bi, j, o, left)
    else:
        el = ex.insert(ex.replace_at(el, bi, j, o, left), offset + length, right)
    used = arena.used
    if pieces == 1:
        used = used.set(offset, length)
    else:
        piece = length // pieces
        m = used.mutate()
        for k in range(pieces):
            m[offset + k * piece] = piece
        used = m.finish()
    return HostArena(arena.capacity, el, used, arena.used_bytes + length)


def alloc(arena: HostArena, size: int, pieces: int = 1) -> tuple[HostArena, int] | None:
    """First-fit `size` bytes (as `pieces` equal allocations); None when no extent fits."""
    if type(size) is not int or not 0 < size <= MAX_BYTES or type(pieces) is not int or pieces < 1 or size % pieces:
        _check_size(size, "host allocation size")
        raise InvalidRequest(f"host allocation of {size} B cannot be {pieces!r} equal pieces")
    hit = ex.first_fit(arena.free, size)
    if hit is None:
        return None
    offset = arena.free.offs[hit[0]][hit[1]]
    return _carve(arena, hit[0], hit[1], offset, size, pieces), offset


def take(arena: HostArena, offset: int, length: int, pieces: int = 1) -> HostArena:
    """Carve exactly [offset, offset+length); ArenaError unless that range is wholly free."""
    if length <= 0 or pieces < 1 or length % pieces:
        raise ArenaError(f"cannot take {length} bytes as {pieces} pieces")
    el = arena.free
    bi, j = ex.position(el, offset)
    pos = ex.at_or_next(el, bi, j)
    if pos is None or el.offs[pos[0]][pos[1]] != offset:
        pos = ex.prev_pos(el, bi, j)
    if pos is not None:
        o, l = ex.get(el, *pos)
        if o <= offset and offset + length <= o + l:
            return _carve(arena, pos[0], pos[1], offset, length, pieces)
    raise ArenaError(f"host bytes [{offset}, {offset + length}) are not free")


def free(arena: HostArena, offset: int) -> HostArena:
    """Return the allocation at `offset` and coalesce; ArenaError if none is there."""
    length = arena.used.get(offset)
    if length is None:
        raise ArenaError(f"no host allocation starts at offset {offset} (double free?)")
    el = arena.free
    bi, j = ex.position(el, offset)
    pred = ex.prev_pos(el, bi, j)
    succ = ex.at_or_next(el, bi, j)
    po = pl = so = sl = None
    if pred is not None:
        po, pl = ex.get(el, *pred)
        if po + pl != offset:
            pred = None
    if succ is not None:
        so, sl = ex.get(el, *succ)
        if so != offset + length:
            succ = None
    if pred is not None and succ is not None:
        el = ex.replace_at(ex.remove_at(el, *succ), pred[0], pred[1], po, pl + length + sl)
    elif pred is not None:
        el = ex.replace_at(el, pred[0], pred[1], po, pl + length)
    elif succ is not None:
        el = ex.replace_at(el, succ[0], succ[1], offset, length + sl)
    else:
        el = ex.insert(el, offset, length)
    return HostArena(arena.capacity, el, arena.used.delete(offset), arena.used_bytes - length)


def place(
    arena: HostArena, allocations: Sequence[HostAllocation]
) -> tuple[HostArena, tuple[tuple[int, int, int], ...]] | HostShortfall:
    """Place every allocation first-fit or none (HOST-1); halve page groups that miss (HOST-3).

    Returns the new arena and placements (offset, size, pieces) in placement order, or the
    shortfall. The input arena is never changed.
    """
    start = arena
    queue = deque(allocations)
    placed: list[tuple[int, int, int]] = []
    unplaced: list[int] = []
    while queue:
        a = queue.popleft()
        got = alloc(arena, a.size, a.pieces)
        if got is not None:
            arena, offset = got
            placed.append((offset, a.size, a.pieces))
        elif a.pieces > 1:  # HOST-3: a page group that does not fit is split in half and retried
            piece = a.size // a.pieces
            lo = a.pieces // 2
            hi = a.pieces - lo
            queue.appendleft(HostAllocation(lo * piece, lo))
            queue.appendleft(HostAllocation(hi * piece, hi))
        else:
            unplaced.append(a.size)
    if unplaced:
        needed = sum(a.size for a in allocations)
        return HostShortfall(needed, start.free_bytes, max(0, needed - start.free_bytes),
                             start.largest_free, tuple(unplaced))
    return arena, tuple(placed)


def page_groups(page_bytes: int, n_pages: int, group_pages: int) -> list[HostAllocation]:
    """KV destinations in page groups of `group_pages` (HOST-3), the last one shorter."""
    out = []
    for start in range(0, n_pages, group_pages):
        k = min(group_pages, n_pages - start)
        out.append(HostAllocation(k * page_bytes, k))
    return out


def fits(arena: HostArena, allocations: Sequence[HostAllocation], freeing: Sequence[int] = ()) -> bool:
    """HOST-1 pre-check: would every allocation place after freeing the given offsets?"""
    for off in freeing:
        arena = free(arena, off)
    return not isinstance(place(arena, allocations), HostShortfall)
