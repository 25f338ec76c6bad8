"""Selecting a victim set for a Host arena gap (HOST-1/2, RCL-5/7, RCL-11): duplicates first; then
the actions that let the request fit alone before those that only add bytes (`FitsFirst`: the
costly first-fit test is run only for what the selection reads); benefit capped by the byte gap
(or the largest allocation when bytes suffice but nothing fits); picks stop once the request
places; then actions no longer needed are dropped, the last chosen first; nothing if it cannot
fit. The reference feeds it every admissible action; a quote through the victim index feeds it a
lazy walk of the Host order and shares the figures of actions alone through a Host memo.
"""
from __future__ import annotations

from ledger import arena as host
from ledger.reclamation.pricing import rank_key
from ledger.reclamation.selection import ActionBatch
from ledger.reclamation.terms import Quote, Ranking, budgeted


def select_host(state, cache, gap, applicant, ok, excluded, order=None, memo=None) -> Quote:
    """HOST-1/2 over the admissible actions `ok` (`excluded`: how many were not). `order(rank,
    cap)`, when given, yields the admissible actions in `rank` order instead of `ok` (the victim
    index's lazy walk, ranked_host.py); `memo`, when given, keeps the figures of actions alone on
    this arena for the quotes on the same states (`ranked_host.HostMemo`)."""
    arena = state.arena
    allocs = list(gap.allocations) or [host.HostAllocation(gap.amount)]
    need = sum(a.size for a in allocs)
    fits_after = host.FitQuery(arena, allocs)  # HOST-1: one placement query, asked per freeing set
    if fits_after(()):
        return Quote(gap, applicant, Ranking(tuple(ok or ()), excluded), (), 0, 0, True, state, cache)
    byte_gap = max(0, need - arena.free_bytes)
    cap = byte_gap or max(a.size for a in allocs)
    is_budgeted = budgeted(applicant)

    def key(a):  # the rank but for "fits alone", which is placed in front by `FitsFirst`
        useful = min(a.frees, cap) or 1
        base = rank_key(a, cap)
        return (a.kind != "drop_replica", base[:2]), (base[2], a.loss / useful, base[3:])

    ordered = sorted(ok, key=key) if order is None else order(key, cap)

    # One allocation (a block, or a KV page group HOST-3 may halve) fits by a figure `host.Freeing`
    # keeps as frees grow: the largest extent holds the block, or the extents hold the group's pages.
    one = allocs[0] if len(allocs) == 1 else None
    page = one.size // one.pieces if one is not None and one.pieces > 1 else 0
    if page:
        base = memo.figure(("page count", page), lambda: host.page_count(arena, page)) if memo is not None \
            else host.page_count(arena, page)
    else:
        base = None

    def enough(largest: int, pages: int) -> bool:
        return pages >= one.pieces if page else largest >= need

    def figure(name, measure, a):  # a figure of action `a` alone, kept per states by the memo
        return memo.alone(a, name, measure) if memo is not None else measure(a)

    def alone(a) -> tuple[int, int]:
        g = host.Freeing(arena, a.offsets, page, base)
        return g.largest, g.pages

    def host_bytes(a) -> int:
        return sum(map(arena.used.__getitem__, a.offsets))

    def fits(a):  # "fits alone": no at once when the freed bytes cannot cover the gap
        if one is None:
            return figure(tuple(allocs), lambda b: fits_after(b.offsets), a)
        if need > arena.free_bytes + figure("bytes", host_bytes, a):
            return False
        return enough(*figure(("freed", page), alone, a))
    ranked = FitsFirst(ordered, key, fits)
    chosen, offsets, loss = [], {}, 0
    # HOST-1: the request cannot fit before the freed bytes cover it (what the placement query
    # answers first), so the query is asked only from then on
    used, short = arena.used, need - arena.free_bytes
    grown = host.Freeing(arena, (), page, base) if one is not None else None  # kept as picks free more
    batch = ActionBatch(state, cache)
    for a in ranked:
        new = [o for o in a.offsets if o not in offsets]
        if not new:
            continue  # its bytes already leave with a chosen action (no double counting, HOST-2)
        if is_budgeted and a.loss > 0 and loss + a.loss >= applicant.budget:
            continue  # RCL-11
        got = batch.check(a)
        if got is None:
            continue  # RCL-5/RCL-7: never drop a replica of what the chosen deletions free
        a, subsumed = got
        batch.take(a, subsumed, chosen)
        offsets.update(dict.fromkeys(new))
        short -= sum(map(used.__getitem__, new))
        loss += a.loss
        if grown is not None:
            grown.add(new)
            if enough(grown.largest, grown.pages):
                break
        elif short <= 0 and fits_after(list(offsets)):
            break
    else:  # HOST-2: delete nothing
        return Quote(gap, applicant, ranked.ranking(excluded), (), 0, 0, False, state, cache)
    chosen = _drop_unneeded(arena, need, one, page, base, grown, offsets, chosen, fits_after, enough)
    freed = sum(arena.used[o] for o in {o: None for b in chosen for o in b.offsets})
    return Quote(gap, applicant, ranked.ranking(excluded), tuple(chosen), freed, sum(a.loss for a in chosen),
                 True, state, cache)


def _drop_unneeded(arena, need, one, page, base, grown, offsets, chosen, fits_after, enough) -> list:
    """HOST-2: drop actions no longer needed, the last chosen first. Shared offsets are freed once:
    `times` counts the chosen actions freeing each, so the bytes left without an action are known
    before any placement test; a block keeps the allocations in the extents that hold it (an
    action freeing none of them goes as it is)."""
    used = arena.used
    holding = grown.beyond(need) if one is not None and not page else None
    times: dict = {}
    for b in chosen:
        for o in b.offsets:
            times[o] = times.get(o, 0) + 1
    have = sum(map(used.__getitem__, times))
    # page groups: the frees of the actions kept so far, so a drop that would leave too few
    # pages is refused from a bound (`pages_without`) before the extents are built again
    cur = None
    if page:
        cur = grown if times.keys() == offsets.keys() else host.Freeing(arena, list(times), page, base)
    for a in reversed(list(chosen)):
        own = [o for o in a.offsets if times[o] == 1]
        left_bytes = have - sum(map(used.__getitem__, own))
        if need - arena.free_bytes > left_bytes:
            continue  # the rest cannot cover the request
        rest = [b for b in chosen if b is not a]
        if holding is not None and holding.isdisjoint(a.offsets):
            pass  # the extents that hold the block stay as they are
        else:
            left = list({o: None for b in rest for o in b.offsets})
            if one is None:
                if not fits_after(left):
                    continue
            else:
                if cur is not None and cur.pages_without(own) < one.pieces:
                    continue
                again = host.Freeing(arena, left, page, base)
                if not enough(again.largest, again.pages):
                    continue
                if holding is not None:
                    holding = again.beyond(need)
                if cur is not None:
                    cur = again
        chosen, have = rest, left_bytes
        for o in a.offsets:
            times[o] -= 1
    return chosen


class FitsFirst:
    """HOST-2's order over actions sorted by every other part of the rank: within each class
    (duplicates, then deletions by revocation rung) the actions that let the request fit alone
    come first. "Fits alone" is a first-fit placement test on the arena, the costly part of a
    Host quote, so it is evaluated only for the actions the selection reads: a fitting action
    is yielded as soon as it is met (nothing unread in its class can rank before it), the others
    wait until their class is exhausted. `ranking()` completes the full order on demand."""

    def __init__(self, ordered, key, fits):
        self.ordered, self.key, self.fits = ordered, key, fits  # `ordered`: any iterable, read once
        self.out: list = []  # the order as far as it was read
        self.walk = self._walk()

    def _walk(self):
        key, out, cls, later = self.key, self.out, None, []
        for a in self.ordered:
            c = key(a)[0]
            if c != cls:
                out.extend(later)
                yield from later
                cls, later = c, []
            if self.fits(a):
                out.append(a)
                yield a
            else:
                later.append(a)
        out.extend(later)
        yield from later

    def __iter__(self):
        yield from self.out
        yield from self.walk

    def ranking(self, excluded: int) -> "LazyHostRanking":
        return LazyHostRanking(self, excluded)


class LazyHostRanking:
    """`Ranking` of a Host quote, completed (every placement test run) only when read."""

    def __init__(self, order: FitsFirst, excluded: int):
        self.order, self.excluded = order, excluded

    @property
    def actions(self) -> tuple:
        for _ in self.order.walk:
            pass
        return tuple(self.order.out)
