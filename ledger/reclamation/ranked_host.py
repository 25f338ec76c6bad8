"""A Host gap's quote through the victim index (HOST-1/2, RCL-5, RCL-11, WAIT-2, HEAT-4): the
reference's selection (`host_selection.select_host`) fed with the Host-resident actions in rank
order, produced lazily by `HostRanked` — the duplicate replicas, then the Host order's entries
(ordinary holder sets keyed by a lower bound) merged with the exact actions of the few
applicant-dependent groups and of the owners beyond the soft target, then the revoking deletions.
A taken entry is evaluated exactly by the reference's own enumeration on that group's objects,
and the evaluations are shared by the quotes on one (state, cache) pair through a `HostMemo`.
"""
from __future__ import annotations

import heapq

from ledger.cache_state import Tier
from ledger.reclamation.candidates import enumerate_actions
from ledger.reclamation.host_selection import select_host
from ledger.reclamation.index import BIG
from ledger.reclamation.index_keys import is_special, owner_status
from ledger.reclamation.pricing import LossPricing, admissible
from ledger.reclamation.terms import Action, Gap, Quote, budgeted
from ledger.state import HOST, HOST_MEDIUM


class HostMemo:
    """What the Host quotes on one (state, cache) pair share (RCL-2). A Device quote that must
    demote asks up to `MAX_VICTIM_DEMOTIONS` Host quotes, a capture its State then Host gaps, a
    retry the same again: each would evaluate the same Host-order entries exactly and test the
    same placements. Kept on one `QuoteFacts`, so it never outlives the states it read.

    `exact`: checkpoint ids -> (the action or None, the objects it was computed from, whether
    computing it read the HEAT-4 owners); valid for a quote protecting none of those objects —
    an ordinary holder set's deletion does not depend on the applicant otherwise (RCL-8: only
    waiters and pause snapshots do, and those sets are evaluated per quote). `fits`:
    (figure, action) -> what "fits alone" (HOST-2) reads of the action alone — the bytes it
    frees, the largest extent or the pages it leaves, or a several-allocation request's answer —
    for the actions kept here (`kept`, by identity); also figures of the arena itself (the page
    count a page group reads). `duplicates`: the duplicate replicas before a quote's protections
    (HOST-1)."""

    __slots__ = ("exact", "kept", "fits", "duplicates")

    def __init__(self):
        self.exact: dict = {}
        self.kept: dict = {}
        self.fits: dict = {}
        self.duplicates: list | None = None

    def alone(self, a, name, measure):
        """`measure(a)`, a figure of action `a` alone on the arena named `name`, once for the
        actions kept here (any other is measured each time)."""
        if self.kept.get(id(a)) is not a:
            return measure(a)
        k = (name, id(a))
        got = self.fits.get(k)
        if got is None:
            got = self.fits[k] = measure(a)
        return got

    def figure(self, name, compute):
        """`compute()`, a figure of the arena these states hold, once."""
        got = self.fits.get(name)
        if got is None:
            got = self.fits[name] = compute()
        return got


def host_quote(state, cache, index, gap, applicant, protect, keep, pricing: LossPricing) -> Quote:
    """HOST-1/2 through the Host order: the reference's selection (`select_host`) fed with the
    Host-resident actions in rank order, produced lazily (`HostRanked`)."""
    ranked = HostRanked(state, cache, index, applicant, protect, keep, pricing)
    q = select_host(state, cache, gap, applicant, None, 0, ranked.order, ranked.memo)
    ranked.record_cold()
    return q


class HostRanked:
    """The admissible Host-resident actions of one Host quote, in HOST-2 rank order but for
    "fits alone" (which `host_selection.FitsFirst` puts in front while reading):

    1. duplicate replicas (HOST-1), by object id: the pools' duplicate orders merged;
    2. deletions revoking nothing: the Host order (ordinary holder sets, keyed by a lower
       bound: stored tier, loss over the useful amount's cap — the true useful amount is at most
       the cap, and what the ledger adds only removes objects) merged with the exact actions of
       the few applicant-dependent groups (waiters, pause snapshots: WAIT-2, PAUSE-4) and of the
       owners beyond the soft target (HEAT-4, ranked as normal content);
    3. revoking deletions, by rung (SCH-4).

    A taken entry is evaluated exactly by the reference's own enumeration on that group's
    objects (and its subgroups', RCL-1), so actions equal the full walk's."""

    def __init__(self, state, cache, index, applicant, protect, keep, pricing: LossPricing):
        self.state, self.cache, self.index = state, cache, index
        self.applicant, self.protect, self.keep, self.pricing = applicant, protect, keep, pricing
        self.cold = pricing.cold_source or frozenset()
        self.memo = pricing.host_memo if pricing.host_memo is not None else HostMemo()
        # RCL-11: a budgeted applicant's selection skips every action whose loss reaches the budget
        self.loss_cap = max(applicant.budget, 1) if budgeted(applicant) else None

    # -- objects --
    def host_only_objects(self, hs) -> list:
        """Listed objects of holder set `hs` (every pool) with a complete Host replica only."""
        objects, out = self.state.objects, []
        for p in self.index.pools:
            g = self.index.groups.get((p, hs))
            if g is None:
                continue
            for oid in g.members:
                o = objects.get(oid)
                if o is not None and o.host is not None and o.host.complete and not (
                        o.device is not None and o.device.complete):
                    out.append(oid)
        return out

    def subsets(self, hs):
        """Holder sets strictly within `hs` that hold objects of some pool (RCL-1: they go with it)."""
        vi, seen = self.index, set()
        for p in vi.pools:
            for h in hs:
                if h[0] != "ckpt":
                    continue
                for s in vi.groups_by_point.get((p, h[1]), ()):
                    if s not in seen and s != hs and s <= hs:
                        seen.add(s)
                        yield s
            if vi.memo.width(hs) > BIG:
                for s in vi.wide_groups.get(p, ()):
                    if s not in seen and s != hs and s <= hs:
                        seen.add(s)
                        yield s

    def candidates(self, sets) -> dict:
        """These holder sets' Host-only objects and their subgroups' (RCL-1)."""
        cands = {}
        width = self.index.memo.width
        for hs in sets:
            for oid in self.host_only_objects(hs):
                cands[oid] = None
            if width(hs) > 1:
                for sub in self.subsets(hs):
                    for oid in self.host_only_objects(sub):
                        cands[oid] = None
        return cands

    def actions(self, sets, pricing=None, cands=None) -> list:
        """The reference's Host deletions (`enumerate_actions`) over these holder sets' Host-only
        objects and their subgroups'."""
        if cands is None:
            cands = self.candidates(sets)
        if not cands:
            return []
        actions, _ = enumerate_actions(self.state, self.cache, Gap(HOST, 1), self.applicant, self.protect,
                                       pricing or self.pricing, self.keep, candidates=cands.keys())
        return [a for a in actions if a.kind == "delete"]

    def exact(self, cids: tuple):
        """The exact deletion of the ordinary holder set of these points, through the memo."""
        memo, protect, keep = self.memo, self.protect, self.keep
        got = memo.exact.get(cids)
        if got is None or not (got[1].isdisjoint(protect) and got[1].isdisjoint(keep)):
            hs = frozenset(("ckpt", c) for c in cids)
            cands = self.candidates((hs,))
            probe = LossPricing(self.state, self.cache, cold_source=self.pricing.cold_source)
            a = None
            for b in self.actions((hs,), probe, cands):
                if b.cids == cids and not b.waiters:
                    a = b
                    break
            got = (a, frozenset(cands), probe.cold_read is not None)
            if got[1].isdisjoint(protect) and got[1].isdisjoint(keep):
                memo.exact[cids] = got
                if a is not None:
                    memo.kept[id(a)] = a
        a, _, read_cold = got
        if read_cold and self.pricing.cold_read is None:
            self.pricing.record_cold_read()  # HEAT-4: evaluating it reads the owners beyond the target
        return a

    def special_actions(self) -> list:
        vi, cache = self.index, self.cache
        sets = {hs for p in vi.pools for hs in vi.special_groups.get(p, ())}
        if not sets:
            return []
        out = []
        for a in self.actions(sets):
            hs = frozenset(("ckpt", c) for c in a.cids) | frozenset(("wait", w) for w in a.waiters)
            if a.waiters or is_special(cache, hs):
                out.append(a)
        return out

    def cold_actions(self) -> list:
        vi, cold, out, seen = self.index, self.cold, [], set()
        for owner in cold:
            _, _, points = owner_status(self.cache, owner)
            for pt in points:
                h = ("ckpt", pt)
                for p in vi.pools:
                    for hs in list(vi.groups_by_point.get((p, pt), ())) + [w for w in vi.wide_groups.get(p, ())
                                                                           if h in w]:
                        it = vi.host_items.get(hs)
                        if hs in seen or it is None or not it[1] or not it[1] <= cold:
                            continue
                        seen.add(hs)
                        a = self.exact(it[0][3])
                        if a is not None:
                            out.append(a)
        return out

    def duplicates(self):
        memo, protect, keep = self.memo, self.protect, self.keep
        if memo.duplicates is None:
            objects, dups = self.state.objects, []
            for (oid,) in heapq.merge(*(self.index.orders[p].duplicates for p in self.index.pools)):
                o = objects.get(oid)
                if o is None or o.leases or o.host is None or not o.host.complete or o.device is None \
                        or not o.device.complete:
                    continue
                a = Action("drop_replica", (), (oid,), o.host.nbytes, (o.host.location,), 0, Tier.NORMAL, 0,
                           o.holders, (), HOST_MEDIUM)
                dups.append(a)
                memo.kept[id(a)] = a
            memo.duplicates = dups
        for a in memo.duplicates:
            oid = a.objects[0]
            if oid in protect and oid not in keep:
                continue  # RCL-8: the applicant's own source
            yield a

    # -- the order --
    def order(self, rank, cap):
        ap = self.applicant
        yield from self.duplicates()
        ready, revoking, seq = [], [], 0
        for a in self.special_actions() + self.cold_actions():
            if admissible(a, ap):
                if a.revokes:
                    revoking.append(a)
                else:
                    heapq.heappush(ready, (rank(a)[1], seq, a))
                    seq += 1
        cold, host_items, loss_cap = self.cold, self.index.host_items, self.loss_cap
        stream = iter(self.index.host_order)
        head = next(stream, None)
        while True:
            while head is not None and (not ready or ready[0][0] >= (head[0], head[1] / cap)):
                tier, loss, demand, cids = head
                if loss_cap is not None and loss >= loss_cap:
                    # RCL-11: the entry's loss bound reaches the budget, and so does every later
                    # entry of its stored tier: the selection would skip them all unread
                    stream = self.index.host_order.scan(start=(tier + 1,))
                    head = next(stream, None)
                    continue
                head = next(stream, None)
                if tier == Tier.REUSE and cold:
                    hot = host_items[frozenset(("ckpt", c) for c in cids)][1]
                    if hot and hot <= cold:
                        continue  # ranked as normal content among the cold actions (HEAT-4)
                a = self.exact(cids)
                if a is not None and admissible(a, ap):
                    heapq.heappush(ready, (rank(a)[1], seq, a))
                    seq += 1
            if not ready:
                break
            yield heapq.heappop(ready)[2]
        revoking.sort(key=rank)
        yield from revoking

    def record_cold(self) -> None:
        """HEAT-4: the full enumeration reads the soft-target owners when it ranks a point of a
        reuse-tier owner; record that read (`Quote.cold`) when the lazy walk did not meet one."""
        pricing = self.pricing
        if pricing.cold_read is not None or not self.cold:
            return
        for hs in self.index.host_reuse.keys():
            if self.any_action(hs):
                pricing.record_cold_read()
                return
        # The applicant-dependent groups (waiters, pause snapshots: WAIT-2, PAUSE-4) are not in
        # `host_reuse`; the full enumeration prices those this applicant may take (reading the
        # owners when one is reuse tier), so evaluate them as the walk does, on this pricing.
        self.special_actions()

    def any_action(self, hs) -> bool:
        objects, protect, keep = self.state.objects, self.protect, self.keep
        for oid in self.host_only_objects(hs):
            o = objects[oid]
            if not o.leases and oid not in protect and oid not in keep and o.holders == hs:
                return True
        return False
