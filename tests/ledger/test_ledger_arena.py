"""The Host arena model: first-fit, split, coalescing, placement all-or-nothing (HOST-1, HOST-3)."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import ledger as L
from ledger import arena as A
from ledger import extents as ex
from ledger_helpers import SETTINGS


def _check(a: A.HostArena) -> None:
    """Free extents + allocations tile [0, capacity) exactly; free ones are coalesced."""
    free = list(ex.iter_extents(a.free))
    spans = sorted(free + list(a.used.items()))
    pos = 0
    for off, ln in spans:
        assert off == pos and ln > 0
        pos += ln
    assert pos == a.capacity
    for (o1, l1), (o2, _) in zip(free, free[1:]):
        assert o1 + l1 < o2
    assert a.free.total == sum(l for _, l in free) == a.capacity - a.used_bytes
    assert a.free.count == len(free)


def test_host1_first_fit_takes_lowest_offset_and_splits():
    a = A.empty_arena(1000)
    a, o1 = A.alloc(a, 100)
    a, o2 = A.alloc(a, 200)
    a, o3 = A.alloc(a, 100)
    assert (o1, o2, o3) == (0, 100, 300)
    a = A.free(a, o2)  # hole [100, 300)
    a, o4 = A.alloc(a, 50)  # first fit: the hole, split
    assert o4 == 100
    assert list(ex.iter_extents(a.free)) == [(150, 150), (400, 600)]
    _check(a)


def test_cfg5_free_coalesces_with_both_neighbours():
    a = A.empty_arena(300)
    a, x = A.alloc(a, 100)
    a, y = A.alloc(a, 100)
    a, z = A.alloc(a, 100)
    a = A.free(a, x)
    a = A.free(a, z)
    assert a.free.count == 2
    a = A.free(a, y)
    assert list(ex.iter_extents(a.free)) == [(0, 300)]
    _check(a)


def test_host1_fragmentation_enough_bytes_but_nothing_fits():
    a = A.empty_arena(400)
    offs = []
    for _ in range(4):
        a, o = A.alloc(a, 100)
        offs.append(o)
    a = A.free(a, offs[0])
    a = A.free(a, offs[2])  # 200 B free in two 100 B holes
    assert a.free_bytes == 200
    short = A.place(a, [A.HostAllocation(150)])
    assert isinstance(short, A.HostShortfall)
    assert short.bytes_missing == 0 and short.unplaced == (150,) and short.largest_free_extent == 100
    assert not A.fits(a, [A.HostAllocation(150)])
    # HOST-1 pre-check after deleting a victim set: freeing offs[1] makes one 300 B extent.
    assert A.fits(a, [A.HostAllocation(150)], freeing=[offs[1]])


def test_host1_place_is_all_or_nothing():
    a = A.empty_arena(300)
    res = A.place(a, [A.HostAllocation(200), A.HostAllocation(200)])
    assert isinstance(res, A.HostShortfall)
    assert res.needed_bytes == 400 and res.bytes_missing == 100 and res.unplaced == (200,)
    assert a.used_bytes == 0  # the input arena is a value: unchanged


def test_host3_page_group_halves_until_it_fits():
    a = A.empty_arena(800)
    offs = []
    for _ in range(8):
        a, o = A.alloc(a, 100)
        offs.append(o)
    for o in (offs[0], offs[1], offs[4], offs[5], offs[6], offs[7]):
        a = A.free(a, o)  # free: [0, 200) and [400, 800)
    a2, placed = A.place(a, [A.HostAllocation(600, 6)])  # a 6-page group does not fit whole
    # 6 pages fit nowhere whole; halves (3 + 3) and quarters are retried first-fit
    assert sum(size for _, size, _ in placed) == 600
    assert all(pieces * 100 == size for _, size, pieces in placed)
    assert len(a2.used) == 2 + 6  # every page is its own allocation
    _check(a2)
    for off, size, pieces in placed:
        for k in range(pieces):
            a2 = A.free(a2, off + 100 * k)
    _check(a2)
    assert a2.used_bytes == 200


def test_host3_single_page_that_fits_nowhere_is_a_shortfall():
    a = A.empty_arena(150)
    res = A.place(a, [A.HostAllocation(400, 4)])
    assert isinstance(res, A.HostShortfall) and res.unplaced == (100, 100, 100)


def test_bad_input_double_free_and_foreign_take_raise():
    a = A.empty_arena(100)
    a, o = A.alloc(a, 10)
    a2 = A.free(a, o)
    with pytest.raises(L.ArenaError):
        A.free(a2, o)
    with pytest.raises(L.ArenaError):
        A.take(a, 5, 10)  # overlaps the allocation
    with pytest.raises(L.InvalidRequest):
        A.empty_arena(-1)
    with pytest.raises(L.InvalidRequest):
        A.empty_arena(1 << 60)


def test_extent_list_splits_large_blocks():
    a = A.empty_arena(10_000)
    offs = []
    for _ in range(1000):
        a, o = A.alloc(a, 10)
        offs.append(o)
    for o in offs[::2]:
        a = A.free(a, o)
    assert a.free.count == 500 and len(a.free.offs) > 1
    assert max(len(b) for b in a.free.offs) <= 2 * ex.BLOCK
    _check(a)
    for o in offs[1::2]:
        a = A.free(a, o)
    assert list(ex.iter_extents(a.free)) == [(0, 10_000)]


@SETTINGS
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 40), st.integers(0, 1000)), max_size=80))
def test_host1_arena_matches_a_byte_map(steps):
    """Random alloc/free against a byte-level reference: same first-fit offsets, no overlap."""
    cap = 400
    a = A.empty_arena(cap)
    ref = [None] * cap  # byte -> allocation offset
    live = []
    for is_alloc, size, pick in steps:
        if is_alloc or not live:
            got = A.alloc(a, size)
            run = 0
            expect = None
            for i in range(cap):  # reference first fit
                run = run + 1 if ref[i] is None else 0
                if run == size:
                    expect = i - size + 1
                    break
            if expect is None:
                assert got is None
                continue
            a, off = got
            assert off == expect
            for i in range(off, off + size):
                ref[i] = off
            live.append(off)
        else:
            off = live.pop(pick % len(live))
            a = A.free(a, off)
            for i in range(cap):
                if ref[i] == off:
                    ref[i] = None
        _check(a)
    assert a.free_bytes == sum(1 for b in ref if b is None)


@pytest.mark.parametrize("size,pieces", [(0, 1), (-4, 1), (10, 3), (10, 0), (1 << 60, 1), (2.0, 1)])
def test_bad_input_alloc_sizes_are_typed(size, pieces):
    a = A.empty_arena(100)
    with pytest.raises(L.InvalidRequest):
        A.alloc(a, size, pieces)
