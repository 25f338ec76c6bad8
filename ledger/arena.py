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

from bisect import bisect_left, bisect_right
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


def _valid_alloc(size, pieces) -> bool:
    return type(size) is int and 0 < size <= MAX_BYTES and type(pieces) is int and pieces >= 1 and not size % pieces


def _check_alloc(size, pieces) -> None:
    if not _valid_alloc(size, pieces):
        _check_size(size, "host allocation size")
        raise InvalidRequest(f"host allocation of {size} B cannot be {pieces!r} equal pieces")


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
    _check_alloc(size, pieces)
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
    pred, succ = _free_neighbours(el, offset, offset + length)
    if pred is not None and succ is not None:
        el = ex.replace_at(ex.remove_at(el, *succ[0]), pred[0][0], pred[0][1], pred[1], pred[2] + length + succ[2])
    elif pred is not None:
        el = ex.replace_at(el, pred[0][0], pred[0][1], pred[1], pred[2] + length)
    elif succ is not None:
        el = ex.replace_at(el, succ[0][0], succ[0][1], offset, length + succ[2])
    else:
        el = ex.insert(el, offset, length)
    return HostArena(arena.capacity, el, arena.used.delete(offset), arena.used_bytes - length)


def _free_neighbours(el: ex.ExtentList, s: int, e: int) -> tuple:
    """The free extents ending at `s` and starting at `e` around used bytes [s, e), each as
    ((block, index), offset, length) or None: what freeing [s, e) coalesces with (CFG-5)."""
    if not el.offs:
        return None, None
    bi, j = ex.position(el, s)
    pred, succ = ex.prev_pos(el, bi, j), ex.at_or_next(el, bi, j)
    if pred is not None:
        po, pl = ex.get(el, *pred)
        pred = (pred, po, pl) if po + pl == s else None
    if succ is not None:
        so, sl = ex.get(el, *succ)
        succ = (succ, so, sl) if so == e else None
    return pred, succ


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
    """HOST-1 pre-check: would every allocation place after freeing the given offsets?

    The answer (and any error) is that of freeing each offset in turn and running `place`
    on the result; `FitQuery` computes it without building those arenas."""
    return FitQuery(arena, allocations)(freeing)


class FitQuery:
    """`q = FitQuery(arena, allocations)`; `q(freeing) == fits(arena, allocations, freeing)`.

    A Host quote asks this once per candidate action (HOST-1/2), so the allocations are read
    once here. Each call merges the freed ranges with each other and with the free extents next
    to them (`_merge_freed`), answers from bytes and the largest extent where those decide, and
    otherwise runs `place`'s first-fit with HOST-3 halving over local copies of the blocks the
    merge changes and the untouched blocks of the persistent ExtentList; no arena is built."""

    __slots__ = ("arena", "allocs", "bad", "need", "piece", "largest", "_alone")

    def __init__(self, arena: HostArena, allocations: Sequence[HostAllocation]):
        self.arena = arena
        pairs = [(a.size, a.pieces) for a in allocations]
        # `place` validates every allocation, after the frees: an invalid one raises at call time.
        self.bad = next(((s, p) for s, p in pairs if not _valid_alloc(s, p)), None)
        self.need = sum(s for s, _ in pairs) if self.bad is None else 0
        self.piece = max((s // p for s, p in pairs), default=0) if self.bad is None else 0
        self.allocs = []  # runs (size, pieces, count) of equal consecutive allocations
        for s, p in pairs:
            if self.allocs and self.allocs[-1][:2] == (s, p):
                self.allocs[-1] = (s, p, self.allocs[-1][2] + 1)
            else:
                self.allocs.append((s, p, 1))
        self.largest = arena.largest_free
        self._alone = None  # the answer without freeing, once computed

    def __call__(self, freeing: Sequence[int] = ()) -> bool:
        arena = self.arena
        if type(freeing) is not list and type(freeing) is not tuple:
            freeing = list(freeing)
        lengths = list(map(arena.used.get, freeing))
        freed = dict(zip(freeing, lengths))
        if None in lengths or len(freed) < len(freeing):
            _free_error(arena, freeing)  # what the first failing `free` raises
        if self.bad is not None:
            _check_alloc(*self.bad)
        el = arena.free
        need = self.need
        if need > el.total + sum(lengths):
            return False  # HOST-1: the bytes cannot cover the request, whatever the layout
        if need <= self.largest:
            return True  # the largest extent holds it all (as in `_answer`); freeing only grows extents
        if not freeing:
            if self._alone is None:
                self._alone = self._answer([], [])
            return self._alone
        offsets = sorted(freed)
        return self._answer(offsets, list(map(freed.__getitem__, offsets)))

    def _answer(self, offsets: list, lengths: list) -> bool:
        el = self.arena.free
        new, drop = _merge_freed(el, offsets, lengths)
        # A merged extent is longer than each free extent it absorbed, so the largest extent after
        # freeing is the larger of the arena's and the merged ones'.
        largest = max(self.largest, max((e - s for s, e in new), default=0))
        if largest >= self.need:
            return True  # every allocation finds room in what is left of the largest extent
        if self.piece > largest:
            return False  # HOST-3 halving stops at one page, and that page has no extent
        bmax = list(el.maxes)
        return _first_fit_all(self.allocs, bmax, _edited_blocks(el, new, drop, bmax), el)


class Freeing:
    """The free extents of `arena` after freeing a growing set of its allocations, kept as they
    grow: `add(offsets)` frees more, `largest` is the largest extent after the frees. One
    allocation of `size` bytes in one piece places after the frees exactly when `size <=
    largest` (first fit takes any extent that holds it), which a Host selection asks after each
    pick (HOST-1/2) — here in O(log n) per freed allocation instead of a merge of them all.

    With `page`, it also keeps `pages`: how many `page`-byte pieces the extents hold together
    (each extent its length // page). One page group of n pages places after the frees exactly
    when `pages >= n`: HOST-3 halves a group that misses down to single pages, first fit carves
    a placed piece from an extent's start, so each placement takes from the extents exactly the
    pages it places and a single page always finds an extent while the count covers what is
    left. `base` is that count before any free (`page_count(arena, page)`), when known.

    Each extent that holds freed allocations (merged with the free extents next to them, as
    `free` coalesces) is kept with its members, so `beyond(size)` names the allocations that
    lie in the extents of at least `size` bytes."""

    __slots__ = ("arena", "starts", "ends", "members", "largest", "page", "pages", "_where")

    def __init__(self, arena: HostArena, offsets=(), page: int = 0, base: int | None = None):
        self.arena = arena
        self.starts: dict = {}  # start -> end of an extent holding freed allocations
        self.ends: dict = {}  # its end -> start
        self.members: dict = {}  # its start -> the offsets of the freed allocations in it
        self.largest = arena.largest_free
        self.page = page
        self.pages = (page_count(arena, page) if base is None else base) if page else 0
        self._where = None  # freed offset -> the start of its extent (`pages_without`)
        self.add(offsets)

    def add(self, offsets) -> None:
        """Free the allocations at `offsets` (each once, none freed before)."""
        el, used, page = self.arena.free, self.arena.used, self.page
        starts, ends, members = self.starts, self.ends, self.members
        self._where = None
        for o, e, mem in _runs(used, offsets):
            s = o
            gone = 0  # the pages the joined extents held apart
            left, right = ends.pop(s, None), starts.pop(e, None)
            # the arena's own free neighbours of the run, where no freed extent is joined there
            pred, succ = _free_neighbours(el, s, e) if left is None or right is None else (None, None)
            if left is not None:  # a freed extent ends here: one extent now
                del starts[left]
                mem = _joined(members.pop(left), mem)
                s = left
                if page:
                    gone += (o - left) // page
            elif pred is not None:
                s = pred[1]  # coalesce with the free extent before it (as `free` does)
                if page:
                    gone += pred[2] // page
            if right is not None:
                del ends[right]
                mem = _joined(mem, members.pop(e))
                if page:
                    gone += (right - e) // page
                e = right
            elif succ is not None:
                e = succ[1] + succ[2]
                if page:
                    gone += succ[2] // page
            starts[s], ends[e], members[s] = e, s, mem
            if e - s > self.largest:
                self.largest = e - s
            if page:
                self.pages += (e - s) // page - gone

    def pages_without(self, offsets) -> int:
        """At least the `pages` of the same frees less the allocations at `offsets` (freed
        here): an extent holding some of them keeps their bytes less, and can only split
        further, so it holds at most (length - their bytes) // page pages."""
        where = self._where
        if where is None:
            where = self._where = {o: s for s, mem in self.members.items() for o in mem}
        used, lost = self.arena.used, {}
        for o in offsets:
            s = where[o]
            lost[s] = lost.get(s, 0) + used[o]
        n, page, starts = self.pages, self.page, self.starts
        for s, r in lost.items():
            length = starts[s] - s
            n -= length // page - (length - r) // page
        return n

    def beyond(self, size: int) -> set:
        """The freed allocations lying in extents of at least `size` bytes."""
        return {o for s, e in self.starts.items() if e - s >= size for o in self.members[s]}


def _runs(used, offsets):
    """The allocations at `offsets` as runs of touching ones: (start, end, offsets), in offset
    order — a page group's pages lie end to end, and a run joins its free neighbours once."""
    run = None
    for o in sorted(offsets):
        n = used.get(o)
        if n is None:
            raise ArenaError(f"no host allocation starts at offset {o} (double free?)")
        if run is not None and run[1] == o:
            run[1] = o + n
            run[2].append(o)
            continue
        if run is not None:
            yield run
        run = [o, o + n, [o]]
    if run is not None:
        yield run


def page_count(arena: HostArena, page: int) -> int:
    """How many `page`-byte pieces the arena's free extents hold (HOST-3)."""
    return sum(length // page for lens in arena.free.lens for length in lens)


def _joined(a: list, b: list) -> list:
    if len(a) < len(b):
        b.extend(a)
        return b
    a.extend(b)
    return a


def _free_error(arena: HostArena, freeing) -> None:
    """Raise what freeing `freeing` one by one raises (a missing offset or a double free)."""
    seen = set()
    for off in freeing:
        if arena.used.get(off) is None or off in seen:
            raise ArenaError(f"no host allocation starts at offset {off} (double free?)")
        seen.add(off)


def _merge_freed(el: ex.ExtentList, offsets: list, lengths: list) -> tuple[list, dict]:
    """What `free` of every allocation at the sorted `offsets` does to the free list, in any
    order of the frees: allocations that touch become one extent, joined with the free extent
    ending at its start and the one starting at its end. Returns the merged extents [start, end)
    in offset order and, per block of `el`, the indices of the extents they absorbed."""
    offs, lens, firsts = el.offs, el.lens, el.firsts
    nb = len(offs)
    runs: list = []  # freed allocations that touch, as one range [s, e)
    for o, n in zip(offsets, lengths):
        if runs and runs[-1][1] == o:
            runs[-1][1] += n
        else:
            runs.append([o, o + n])
    if not nb:
        return runs, {}
    new: list = []
    drop: dict = {}
    last_succ = None
    for s, e in runs:
        bi = bisect_right(firsts, s) - 1
        if bi < 0:
            bi = 0
        j = bisect_left(offs[bi], s)
        pred = (bi, j - 1) if j else ((bi - 1, len(offs[bi - 1]) - 1) if bi else None)
        if pred is not None and offs[pred[0]][pred[1]] + lens[pred[0]][pred[1]] != s:
            pred = None
        succ = (bi, j) if j < len(offs[bi]) else ((bi + 1, 0) if bi + 1 < nb else None)
        if succ is not None and offs[succ[0]][succ[1]] != e:
            succ = None
        end = e + lens[succ[0]][succ[1]] if succ is not None else e
        if pred is not None and pred == last_succ:
            new[-1][1] = end  # one free extent lay between the previous run and this one
        else:
            if pred is not None:
                drop.setdefault(pred[0], []).append(pred[1])
            new.append([offs[pred[0]][pred[1]] if pred is not None else s, end])
        if succ is not None:
            drop.setdefault(succ[0], []).append(succ[1])
        last_succ = succ
    return new, drop


def _edited_blocks(el: ex.ExtentList, new: list, drop: dict, bmax: list) -> dict:
    """Local copies [offsets, lengths] of the blocks of `el` that the merge changes (by block
    index; a merged extent goes to the block its start falls in), their maxima set in `bmax`."""
    offs, lens, firsts = el.offs, el.lens, el.firsts
    if not offs:  # the arena had no free extent: the merged ones are the whole list
        bmax.append(max((e - s for s, e in new), default=0))
        return {0: [[s for s, _ in new], [e - s for s, e in new]]}
    per: dict = {}
    for s, e in new:
        bi = bisect_right(firsts, s) - 1
        per.setdefault(bi if bi > 0 else 0, []).append((s, e - s))
    blocks = {}
    for bi in per.keys() | drop.keys():
        gone = drop.get(bi, ())
        items = [x for j, x in enumerate(zip(offs[bi], lens[bi])) if j not in gone]
        items.extend(per.get(bi, ()))
        items.sort()
        blocks[bi] = [[o for o, _ in items], [n for _, n in items]]
        bmax[bi] = max(blocks[bi][1], default=0)
    return blocks


def _first_fit_all(allocs: list, bmax: list, blocks: dict, el: ex.ExtentList) -> bool:
    """`place`'s loop on the free list given by `blocks` over `el`: True when all allocations
    place. `allocs`: runs [size, pieces, count] of equal allocations in request order.

    Lengths only shrink while placing (first-fit carves from an extent's start), so a block
    maximum stays an upper bound and is made exact when its block misses; a size that found its
    fit in block b has nothing before b for any later size at least as large; a size that found
    nothing fails again for any size at least as large; and an extent that takes one of a run
    stays the first fit for the next one as long as it holds another."""
    lens_b, offs_b = el.lens, el.offs
    nb = len(bmax)
    queue = deque(list(r) for r in allocs)
    hint_size = hint_bi = 0
    fail = MAX_BYTES + 1
    while queue:
        run = queue[0]
        size, pieces, count = run
        hit = -1
        if size < fail:
            bi = hint_bi if size >= hint_size else 0
            while bi < nb:
                if bmax[bi] >= size:
                    blk = blocks.get(bi)
                    lens = lens_b[bi] if blk is None else blk[1]
                    for j, l in enumerate(lens):
                        if l >= size:
                            hit = j
                            break
                    if hit >= 0:
                        break
                    bmax[bi] = max(lens, default=0)
                bi += 1
        if hit >= 0:
            if blk is None:
                blk = blocks[bi] = [list(offs_b[bi]), list(lens_b[bi])]
            o, l = blk
            k = min(count, l[hit] // size)  # this many of the run in a row, all from this extent
            if l[hit] == k * size:
                del o[hit], l[hit]
            else:
                o[hit] += k * size
                l[hit] -= k * size
            hint_size, hint_bi = size, bi
            if k == count:
                queue.popleft()
            else:
                run[2] = count - k
        elif pieces > 1:  # HOST-3: a page group that does not fit is split in half and retried
            fail = min(fail, size)
            if count == 1:
                queue.popleft()
            else:
                run[2] = count - 1  # the rest of the run comes after both halves
            piece = size // pieces
            lo = pieces // 2
            hi = pieces - lo
            queue.appendleft([lo * piece, lo, 1])
            queue.appendleft([hi * piece, hi, 1])
        else:
            return False  # HOST-1: one allocation without an extent refuses the whole request
    return True
