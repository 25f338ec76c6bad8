"""A Device gap's quote through the victim index (RCL-1..12, RD-8, WAIT-2, HEAT-4). `DeviceRanked`
yields the admissible actions best first, lazily, by merging the index's stored orders: each order
yields entries in ascending order of a lower bound of their true RCL-4 key (what the ledger adds —
leases, pins, active writers, the applicant's protected objects, unknown holders — only removes
objects), a taken entry is evaluated exactly (the reference's own rules, on the live state) and
waits in a small heap until no unread entry can rank before it. Normal-tier buckets share one
divisor each (RD-8); a budgeted capture stops reading a bucket at the first loss its budget
excludes (RCL-11); reuse-tier content ranks after normal but for owners beyond the soft target
(HEAT-4); special groups are ranked from their members (WAIT-2, PAUSE-4, SCH-4); demotions come
from demotion_sources.py. `device_quote` runs the shared selection (`selection.select_device`).
"""
from __future__ import annotations

import heapq

from ledger.cache_state import Tier
from ledger.reclamation.candidates import deletion_revokes, freed_holders, holders_ok
from ledger.reclamation.demotion_sources import DemotionSources
from ledger.reclamation.index import BIG, DEMOTE_REUSE, WIDE
from ledger.reclamation.index_keys import owner_status
from ledger.reclamation.pricing import admissible, may_take_reuse, rank_key, reuse_demand_limit
from ledger.reclamation.reference import LazyRanking
from ledger.reclamation.selection import select_device
from ledger.reclamation.terms import Action, Quote, budgeted, refused
from ledger.state import DEVICE


def classify(o, pool: str, protect: frozenset, keep: frozenset) -> str:
    """What the reference's candidate walk makes of a Device object: "skip", "dup" or "group"."""
    if o is None or o.pool != pool:
        return "skip"
    d = o.device
    if d is None or not d.complete or o.leases or o.pins:
        return "skip"  # TXN-1: readers and pins keep the replica
    for h in o.holders:
        if h[0] == "seq":
            return "skip"  # an active writer computes on it (SAVE-5, RCL-8)
    oid = o.object_id
    if oid in protect and oid not in keep:
        return "skip"  # RCL-8
    if o.host is not None and o.host.complete:
        return "dup"  # HOST-1 / RCL-6
    if oid in protect or oid in keep:
        return "skip"
    return "group"


def device_quote(state, cache, index, gap, applicant, protect, keep, pricing, cold) -> Quote:
    """One selection for a Device gap over the lazily ranked actions."""
    ranking = LazyRanking(state, cache, gap, applicant, protect, keep)
    po = index.orders[gap.pool]
    if po.held < gap.amount:  # fewer listed Device objects than the gap: nothing closes it
        return refused(gap, applicant, ranking, state, cache)
    ranked = DeviceRanked(state, cache, index, gap, applicant, protect, keep, pricing, cold)
    chosen = select_device(state, cache, gap, applicant, ranked, on_take=ranked.took)
    if chosen is None:
        return refused(gap, applicant, ranking, state, cache)
    freed = len({o for a in chosen for o in a.objects})
    return Quote(gap, applicant, ranking, tuple(chosen), freed, sum(a.loss for a in chosen), True, state, cache)


class DeviceRanked:
    """The ranked admissible actions of one Device quote, produced lazily (iterate it)."""

    def __init__(self, state, cache, index, gap, applicant, protect, keep, pricing, cold):
        self.state, self.cache, self.index = state, cache, index
        self.gap, self.applicant, self.protect, self.keep = gap, applicant, protect, keep
        self.pricing, self.cold = pricing, cold
        self.pool = gap.pool
        self.amount = gap.amount
        self.pool_order = index.orders[gap.pool]
        self.kind = state.pool(gap.pool).spec.kind
        self.budgeted = budgeted(applicant)
        self.budget_left = applicant.budget if self.budgeted else None  # RCL-11: what is left of the budget
        self.demote = applicant.demote and state.transaction is None
        self.demotions = DemotionSources(self)

    def over_budget(self, loss) -> bool:
        return self.budget_left is not None and loss > 0 and loss >= self.budget_left

    def took(self, loss: int) -> None:
        """The selection's cumulative loss after a pick (RCL-11: what is left of the budget)."""
        if self.budgeted:
            self.budget_left = self.applicant.budget - loss

    # -- sources: (lower-bound key, payload), ascending --
    def source_duplicates(self):
        for (oid,) in self.pool_order.duplicates:
            yield (0, 0, 0, 0.0, 0, False, (), (oid,)), oid

    def source_normal(self, bucket: int, order):
        """Normal-tier groups freeing `bucket` units (WIDE: more than 64, or many points), by
        loss: their useful amount is min(frees, gap) (RD-8), one divisor per bucket."""
        amount = self.amount
        div = min(bucket, amount) if bucket != WIDE else amount
        for loss, demand, cids, _ in order:
            if self.over_budget(loss):
                return  # ascending by loss: nothing later fits the budget (RCL-11)
            yield (0, 0, 0, loss / div, demand, True, cids), cids

    def source_reuse(self):
        limit = reuse_demand_limit(self.applicant)
        groups, pool, cold = self.index.groups, self.pool, self.cold

        def keep_chunk(least_loss):
            return not self.over_budget(least_loss)
        for demand, cids, loss in self.pool_order.reuse.scan(keep_chunk):
            if limit is not None and demand >= limit:
                return  # RCL-10: only reuse content older than the capture's own demand
            if self.over_budget(loss):
                continue
            if cold and groups[(pool, frozenset(("ckpt", c) for c in cids))].hot <= cold:
                continue  # every owner protecting it is beyond the soft target: ranked as normal
            yield (0, 0, 1, demand, 0, True, cids), cids

    # -- exact evaluation --
    def duplicate_action(self, oid):
        o = self.state.objects.get(oid)
        if classify(o, self.pool, self.protect, self.keep) != "dup":
            return None
        return Action("drop_replica", (), (oid,), 1, (), 0, Tier.NORMAL, 0, o.holders, (), DEVICE)

    def valid_members(self, hs):
        """The group's members the reference would group under exactly this holder set."""
        g = self.index.groups.get((self.pool, hs))
        if g is None:
            return []
        objects, pool, protect, keep = self.state.objects, self.pool, self.protect, self.keep
        out = []
        for oid in g.members:
            o = objects.get(oid)
            if o is not None and o.holders == hs and classify(o, pool, protect, keep) == "group":
                out.append(o)
        return out

    def group_action(self, cids: tuple):
        hs = frozenset(("ckpt", c) for c in cids)
        own = self.valid_members(hs)
        if not own:
            return None
        cache, pricing = self.cache, self.pricing
        cps = cache.checkpoints
        gone = frozenset(cids)
        if len(cids) == 1 and len(own) == 1:  # the reference's inline case
            o = own[0]
            c = cps[cids[0]]
            kind, okey = c.owner
            r = cache.records.get(okey) if kind == "rec" else None
            if r is not None and r.tier != Tier.REUSE:
                h, t = False, r.demand_time
            else:
                h, t = pricing.hot(c, gone)
            return Action("delete", cids, (o.object_id,), 1, (), pricing.loss(gone), Tier.REUSE if h else Tier.NORMAL,
                          t, o.holders, ())
        freed = {o.object_id: o for o in own}
        if len(cids) > 1:
            for sub in self.subgroups(hs):
                for o in self.valid_members(sub):
                    freed[o.object_id] = o
        tier, demand = pricing.tier(gone)
        holders, ids = freed_holders(freed)
        return Action("delete", cids, ids, len(freed), (), pricing.loss(gone), tier, demand, holders, (), DEVICE, (),
                      ())

    def subgroups(self, hs):
        """Ordinary groups of the pool strictly within holder set `hs` (RCL-1: they go with it)."""
        vi, pool = self.index, self.pool
        seen = set()
        for h in hs:
            if h[0] != "ckpt":
                continue
            for s in vi.groups_by_point.get((pool, h[1]), ()):
                if s not in seen:
                    seen.add(s)
                    if s != hs and s <= hs and not vi.groups[(pool, s)].special:
                        yield s
        if vi.memo.width(hs) > BIG:
            for s in vi.wide_groups.get(pool, ()):
                if s != hs and s <= hs and not vi.groups[(pool, s)].special:
                    yield s

    # -- exact lists (few) --
    def cold_actions(self) -> list:
        """Content of owners beyond the soft target (HEAT-4): ranked as normal content."""
        out = []
        if not self.cold:
            return out
        vi, pool, cache = self.index, self.pool, self.cache
        seen_groups, seen_points = set(), set()
        for owner in self.cold:
            _, _, points = owner_status(cache, owner)
            for p in points:
                for hs in vi.groups_by_point.get((pool, p), ()):
                    if hs in seen_groups:
                        continue
                    seen_groups.add(hs)
                    g = vi.groups[(pool, hs)]
                    if g.special or not g.hot or not g.hot <= self.cold or not g.items:
                        continue
                    a = self.group_action(vi.memo.point_ids(hs))
                    if a is not None:
                        out.append((a, 0))
                if self.demote and p not in seen_points:
                    seen_points.add(p)
                    d = vi.demotions.get((pool, p))
                    if d is not None and d[1] is not None and d[1][0] == DEMOTE_REUSE:
                        a = self.demotions.demote_action(p)
                        if a is not None:
                            out.append((a, 1))
        return out

    def special_actions(self) -> list:
        """Groups with waiters, pause snapshots or waiters' own points (WAIT-2, PAUSE-4): the
        reference's grouping, on their members only."""
        vi, pool = self.index, self.pool
        sp = vi.special_groups.get(pool)
        if not sp:
            return []
        cache, ap, pricing = self.cache, self.applicant, self.pricing
        objects = self.state.objects
        groups: dict = {}
        for hs in sp:
            for oid in vi.groups[(pool, hs)].members:
                o = objects.get(oid)
                if classify(o, pool, self.protect, self.keep) != "group":
                    continue
                got = holders_ok(o, cache, ap)
                if got is None:
                    continue
                cids, revoked = got
                if not cids:
                    continue
                key = (frozenset(cids), tuple(sorted(revoked, key=repr)) if revoked else ())
                groups.setdefault(key, []).append(o)
        snapshots = any(u.snapshot for u in cache.active.values())
        out = []
        for key, objs in groups.items():
            cids, waiters = key
            freed = {o.object_id: o for o in objs}
            if len(cids) > 1:
                for k2, objs2 in groups.items():
                    if k2 != key and k2[0] <= cids and set(k2[1]) <= set(waiters):
                        for o in objs2:
                            freed[o.object_id] = o
                hs = frozenset(("ckpt", c) for c in cids)
                for sub in self.subgroups(hs):
                    for o in self.valid_members(sub):
                        freed[o.object_id] = o
            tier, demand = pricing.tier(cids)
            holders, ids = freed_holders(freed)
            revokes = deletion_revokes(cache, cids, waiters) if waiters or snapshots else ()
            out.append((Action("delete", tuple(sorted(cids)), ids, len(freed), (), pricing.loss(cids), tier, demand,
                               holders, waiters, DEVICE, (), revokes), 0))
        return out

    # -- the merge --
    def _sources(self) -> list:
        """(ascending source, its exact evaluation, tie rank): the stored orders this quote reads."""
        demotions = self.demotions
        sources = [(self.source_duplicates(), self.duplicate_action, 0)]
        sources += [(self.source_normal(b, o), self.group_action, 0) for b, o in self.pool_order.normal.items()]
        if may_take_reuse(self.applicant):
            sources.append((self.source_reuse(), self.group_action, 0))
        if self.demote and demotions.units_free() == 0:
            # No demotion places as it is (HOST-1): only the few quoted with Host victims exist
            # (RCL-5), so the candidates are not walked.
            sources.append((demotions.source_pending(), demotions.pending_action, 1))
        elif self.demote:
            sources.append((demotions.source_normal(), demotions.demote_action, 1))
            if may_take_reuse(self.applicant):
                sources.append((demotions.source_reuse(), demotions.demote_action, 1))
        return sources

    def __iter__(self):
        amount, ap = self.amount, self.applicant
        ready: list = []  # (key, tie, seq, action)
        seq = 0

        def offer(a, tie):
            nonlocal seq
            if a is not None and admissible(a, ap):
                heapq.heappush(ready, (rank_key(a, amount), tie, seq, a))
                seq += 1
        self.demotions.prepare_pending()
        for a, tie in self.special_actions() + self.cold_actions():
            offer(a, tie)
        sources = self._sources()
        heads: list = []
        for i, (src, _, _) in enumerate(sources):
            for bound, payload in src:
                heads.append(((bound, -1), i, payload))
                break
        heapq.heapify(heads)
        while True:
            while heads and (not ready or (ready[0][0], ready[0][1]) >= heads[0][0]):
                _, i, payload = heapq.heappop(heads)
                src, evaluate, tie = sources[i]
                offer(evaluate(payload), tie)
                for bound, payload2 in src:
                    heapq.heappush(heads, ((bound, -1), i, payload2))
                    break
            if not ready:
                return
            yield heapq.heappop(ready)[3]
