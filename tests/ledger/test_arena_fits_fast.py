"""`arena.fits` / `FitQuery` answer exactly what freeing one by one and `place` answer (HOST-1, HOST-3).

The reference below is the replay `fits` used to be; the fast one merges the freed ranges
locally and simulates first-fit with page-group halving over the persistent free list.
"""
from __future__ import annotations

from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger import arena as A
from ledger import extents as ex
from ledger.errors import ArenaError, InvalidRequest
from ledger_helpers import SETTINGS

UNIT = 8  # byte granularity of the random arenas (pages and blocks are multiples of it)


def _fits_by_replay(arena, allocations, freeing=()):
    """The reference: free each offset into the persistent arena, then `place` the request."""
    for off in freeing:
        arena = A.free(arena, off)
    return not isinstance(A.place(arena, allocations), A.HostShortfall)


def _outcome(f, *args):
    try:
        return ("ok", f(*args))
    except (ArenaError, InvalidRequest) as e:
        return (type(e).__name__, str(e))


@st.composite
def arenas(draw):
    """An arena built by random block / page-group allocs, frees and takes (fragmented space)."""
    cap = draw(st.integers(1, 400)) * UNIT
    a = A.empty_arena(cap)
    for _ in range(draw(st.integers(0, 120))):
        op = draw(st.sampled_from(("alloc", "alloc", "group", "free", "free", "take")))
        if op == "alloc":
            got = A.alloc(a, draw(st.integers(1, 12)) * UNIT)
            a = got[0] if got else a
        elif op == "group":
            pieces = draw(st.integers(2, 8))
            got = A.alloc(a, pieces * draw(st.sampled_from((1, 2))) * UNIT, pieces)
            a = got[0] if got else a
        elif op == "free" and a.used:
            a = A.free(a, draw(st.sampled_from(sorted(a.used))))
        elif op == "take" and a.free.count:
            o, n = draw(st.sampled_from(list(ex.iter_extents(a.free))))
            units = n // UNIT
            at = draw(st.integers(0, units - 1))
            k = draw(st.integers(1, units - at))
            a = A.take(a, o + at * UNIT, k * UNIT)
    return a


allocations = st.lists(
    st.one_of(
        st.builds(lambda k: A.HostAllocation(k * UNIT), st.integers(1, 40)),
        st.builds(lambda p, u: A.HostAllocation(p * u * UNIT, p), st.integers(2, 24), st.sampled_from((1, 2))),
    ),
    max_size=8,
)


@settings(SETTINGS, max_examples=400)
@given(st.data(), st.sampled_from((1, 2, 3, 64)))
def test_host1_fits_equals_free_then_place(data, block):
    with mock.patch.object(ex, "BLOCK", block):  # small blocks: merges and fits across block edges
        a = data.draw(arenas())
        q = None
        for _ in range(3):
            used = sorted(a.used)
            freeing = data.draw(st.permutations(used).flatmap(
                lambda p: st.integers(0, len(p)).map(lambda k: p[:k]))) if used else []
            allocs = data.draw(allocations)
            mode = data.draw(st.sampled_from(("random", "edge", "fill", "tight", "runs")))
            if mode == "edge":  # a size at the largest extent's edge (the early answers)
                units = max(1, a.largest_free // UNIT + data.draw(st.integers(-1, 1)))
                pieces = data.draw(st.sampled_from((1, units)))
                allocs.insert(data.draw(st.integers(0, len(allocs))), A.HostAllocation(units * UNIT, pieces))
            elif mode == "fill":  # pages between the largest extent and every free byte
                room = (a.free_bytes + sum(a.used[o] for o in freeing)) // UNIT
                n = data.draw(st.integers(max(1, a.largest_free // UNIT), max(1, room + 1)))
                allocs = A.page_groups(UNIT, n, data.draw(st.integers(1, 16))) + allocs[:1]
            elif mode == "runs":  # equal page groups in a row, then blocks (HOST-3 halves keep their place)
                p = data.draw(st.integers(2, 8))
                allocs = [A.HostAllocation(p * UNIT, p)] * data.draw(st.integers(2, 4)) + allocs[:2]
            elif mode == "tight":  # blocks about as long as the extents the frees leave
                after = a
                for off in freeing:
                    after = A.free(after, off)
                units = [n // UNIT for _, n in ex.iter_extents(after.free)] or [1]
                allocs = [A.HostAllocation(max(1, u) * UNIT) for u in data.draw(st.lists(
                    st.sampled_from(units).flatmap(lambda u: st.integers(u - 2, u + 1)), min_size=1, max_size=6))]
            want = _fits_by_replay(a, allocs, freeing)
            assert A.fits(a, allocs, freeing) == want
            assert A.fits(a, allocs, tuple(freeing)) == want
            if q is None:
                q, q_allocs = A.FitQuery(a, allocs), allocs
            assert q(freeing) == _fits_by_replay(a, q_allocs, freeing)  # one query, many freeing sets
            assert q(()) == _fits_by_replay(a, q_allocs)


@settings(SETTINGS, max_examples=150)
@given(st.data())
def test_host3_halving_and_nearly_full_arenas(data):
    """Page groups that must be halved, and requests that need almost every freed byte."""
    with mock.patch.object(ex, "BLOCK", data.draw(st.sampled_from((1, 2, 64)))):
        a = A.empty_arena(64 * UNIT)
        while True:  # fill with single pages, then punch holes by freeing
            got = A.alloc(a, UNIT)
            if got is None:
                break
            a = got[0]
        holes = data.draw(st.sets(st.sampled_from(sorted(a.used)), max_size=40))
        for off in sorted(holes):
            a = A.free(a, off)
        used = sorted(a.used)
        freeing = data.draw(st.lists(st.sampled_from(used), unique=True, max_size=len(used))) if used else []
        free_units = (a.free_bytes + sum(a.used[o] for o in freeing)) // UNIT
        n = data.draw(st.integers(1, max(1, free_units + 1)))
        group = data.draw(st.integers(2, 16))
        allocs = A.page_groups(UNIT, n, group)
        if data.draw(st.booleans()):  # blocks after (or before) the groups compete for the same holes
            blocks = [A.HostAllocation(k * UNIT) for k in data.draw(st.lists(st.integers(1, 4), max_size=4))]
            allocs = allocs + blocks if data.draw(st.booleans()) else blocks + allocs
        assert A.fits(a, allocs, freeing) == _fits_by_replay(a, allocs, freeing)


def test_host1_fits_errors_match_the_replay():
    a = A.empty_arena(100 * UNIT)
    a, o1 = A.alloc(a, 10 * UNIT)
    a, o2 = A.alloc(a, 10 * UNIT)
    good = [A.HostAllocation(5 * UNIT)]
    bad = [A.HostAllocation(3, 2)]  # not 2 equal pieces
    cases = [
        (good, [o1, 12345]),  # no allocation there
        (good, [o2, o1, o2]),  # double free
        (good, [o1, o1, 777]),  # the double free comes first
        (good, [777, o1, o1]),  # the missing offset comes first
        (bad, [o1]),  # the frees succeed, then the allocation is refused
        (bad, [o1, o1]),  # the double free is met before the allocation
        ([A.HostAllocation(0)], []),
        ([A.HostAllocation(UNIT), A.HostAllocation(-1)], [o2]),
        ([A.HostAllocation(UNIT, 0)], []),
        ([A.HostAllocation(A.MAX_BYTES + 1)], []),
    ]
    for allocs, freeing in cases:
        want = _outcome(_fits_by_replay, a, allocs, freeing)
        assert want[0] != "ok"
        assert _outcome(A.fits, a, allocs, freeing) == want


@pytest.mark.parametrize("cap", [0, 4 * UNIT])
def test_host1_fits_on_a_full_or_empty_arena(cap):
    a = A.empty_arena(cap)
    offs = []
    while True:
        got = A.alloc(a, UNIT)
        if got is None:
            break
        a, o = got
        offs.append(o)
    assert a.free.count == 0
    for allocs in ([], [A.HostAllocation(UNIT)], [A.HostAllocation(2 * UNIT, 2)], [A.HostAllocation(2 * UNIT)]):
        for freeing in ([], offs[:1], offs[1:3], offs[::2], offs[::-1]):
            assert A.fits(a, allocs, freeing) == _fits_by_replay(a, allocs, freeing)


@pytest.mark.parametrize("block", [1, 64])
def test_host1_freed_range_joins_its_free_neighbours_once(block):
    """A freed allocation extends the free extent before it (and after it): the merged extent
    replaces both, so carving it cannot leave the old neighbour's bytes behind."""
    with mock.patch.object(ex, "BLOCK", block):
        a = A.empty_arena(20 * UNIT)
        offs = []
        for _ in range(20):
            a, o = A.alloc(a, UNIT)
            offs.append(o)
        for o in offs[0:4] + offs[9:11] + offs[19:20]:  # free [0,4) [9,11) [19,20): extents 4, 2, 1
            a = A.free(a, o)
        for freeing, allocs in (
            ([offs[4], offs[5]], [A.HostAllocation(3 * UNIT), A.HostAllocation(4 * UNIT)]),  # pred
            ([offs[8], offs[7]], [A.HostAllocation(2 * UNIT), A.HostAllocation(3 * UNIT)]),  # succ
            ([offs[4], offs[8], offs[7], offs[6], offs[5]], [A.HostAllocation(10 * UNIT)] * 2),  # chain
            ([offs[4], offs[8], offs[7], offs[6], offs[5]], [A.HostAllocation(11 * UNIT)]),
            ([offs[4], offs[6]], [A.HostAllocation(5 * UNIT), A.HostAllocation(3 * UNIT, 3)]),
            ([offs[18]], [A.HostAllocation(2 * UNIT, 2), A.HostAllocation(6 * UNIT, 3)]),
        ):
            assert A.fits(a, allocs, freeing) == _fits_by_replay(a, allocs, freeing), (freeing, allocs)


def test_host3_halves_of_a_group_place_before_the_next_allocation():
    """Holes 3, 3, 3, 2; two 4-page groups, then a 3-byte-unit block: each group is halved in
    its turn, so the second group's halves take the last 3-hole and the block finds none."""
    a = A.empty_arena(16 * UNIT)
    for _ in range(16):
        a = A.alloc(a, UNIT)[0]
    for u in (0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13):
        a = A.free(a, u * UNIT)
    allocs = [A.HostAllocation(4 * UNIT, 4)] * 2 + [A.HostAllocation(3 * UNIT)]
    assert not _fits_by_replay(a, allocs)
    assert not A.fits(a, allocs)
    assert A.fits(a, allocs[1:]) == _fits_by_replay(a, allocs[1:]) is True


def test_host1_one_byte_unit_over_the_largest_extent():
    """Holes of 3 and 2 units: a 4-unit block has bytes enough but no extent; 4 pages do fit."""
    a = A.empty_arena(8 * UNIT)
    for _ in range(8):
        a = A.alloc(a, UNIT)[0]
    for u in (0, 1, 2, 4, 5):
        a = A.free(a, u * UNIT)
    for allocs, want in (([A.HostAllocation(4 * UNIT)], False), ([A.HostAllocation(3 * UNIT)], True),
                         ([A.HostAllocation(4 * UNIT, 4)], True), ([A.HostAllocation(6 * UNIT, 2)], False)):
        assert _fits_by_replay(a, allocs) is want
        assert A.fits(a, allocs) is want
    assert A.fits(a, [A.HostAllocation(5 * UNIT)], [3 * UNIT]) is _fits_by_replay(a, [A.HostAllocation(5 * UNIT)], [3 * UNIT]) is True


@settings(SETTINGS, max_examples=150)
@given(arenas(), st.data())
def test_host1_freeing_grows_as_the_frees_one_by_one(arena, data):
    """`Freeing` (a Host selection's extents as its picks free more, HOST-1/2/3): after each
    step its largest extent is the arena's after freeing those allocations one by one,
    `beyond(size)` lists exactly the freed allocations inside extents of at least `size`, and a
    page group places (free one by one, then `place` with halving) exactly when its page count
    covers the group; `pages_without` bounds the page count of the same frees less a few."""
    order = data.draw(st.permutations(sorted(arena.used)))
    steps = data.draw(st.lists(st.integers(1, 4), max_size=8))
    page = data.draw(st.sampled_from((UNIT, 2 * UNIT, 3 * UNIT)))
    grown, done, replay, i = A.Freeing(arena, (), page), [], arena, 0
    for k in steps + [len(order)]:
        batch = list(order[i:i + k])
        i += len(batch)
        grown.add(batch)
        done += batch
        for off in batch:
            replay = A.free(replay, off)
        assert grown.largest == replay.largest_free
        size = data.draw(st.integers(1, max(1, replay.capacity)))
        want = {o for o in done for s, n in ex.iter_extents(replay.free) if s <= o < s + n and n >= size}
        assert grown.beyond(size) == want
        # HOST-3: a group of n pages places exactly when the extents hold n pages
        assert grown.pages == sum(n // page for _, n in ex.iter_extents(replay.free))
        n = data.draw(st.integers(1, 12))
        assert (grown.pages >= n) == _fits_by_replay(arena, [A.HostAllocation(n * page, n)], done)
        # a drop pass's bound: the frees less some of them hold at most `pages_without` pages
        if done:
            back = data.draw(st.lists(st.sampled_from(done), unique=True, max_size=4))
            fewer = A.Freeing(arena, [o for o in done if o not in back], page)
            assert fewer.pages <= grown.pages_without(back)
        if i >= len(order):
            break
    with pytest.raises(ArenaError, match="double free"):
        A.Freeing(arena, [arena.capacity + 1])
