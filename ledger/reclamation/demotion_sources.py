"""The demotions a Device quote through the victim index may take (RCL-5/6, RCL-10, HOST-1, HEAT-4):
the stored demotion candidates, read in (tier, demand, checkpoint) order and only where a
candidate's group can take something at this gap (its `reach`, and the wide reach of pages more
than BIG points list, read only when such a page may move for the applicant); each candidate's
group as the reference decides it (demotion_claims.py); and the few demotions that need Host
victims (the oldest `MAX_VICTIM_DEMOTIONS`, as the reference fixes them before ranking), each one's
Host quote asked only when the merge reaches its rank's lower bound.
"""
from __future__ import annotations

import heapq

from ledger import extents as ex
from ledger.cache_state import Tier
from ledger.reclamation import ranked_host
from ledger.reclamation.demotion_claims import DemotionClaims
from ledger.reclamation.index import DEMOTE_NORMAL
from ledger.reclamation.pricing import demotion_writeback, may_take_reuse, rank_key, reuse_demand_limit
from ledger.reclamation.selection import all_freed, freed_whole, removed_by
from ledger.reclamation.terms import MAX_VICTIM_DEMOTIONS, Action, Gap
from ledger.state import DEVICE, HOST


class DemotionSources:
    """The demotion side of one Device quote (`ranked_device.DeviceRanked`, whose states, index,
    gap and applicant it reads). `pending`: cid -> the demotion needing Host victims (among the
    first MAX_VICTIM_DEMOTIONS), or None; `unquoted`: cid -> (tier, demand, checkpoint, group),
    found but its Host quote not yet asked."""

    def __init__(self, ranked):
        self.state, self.cache, self.index = ranked.state, ranked.cache, ranked.index
        self.pool, self.amount, self.kind = ranked.pool, ranked.amount, ranked.kind
        self.applicant, self.protect, self.pricing, self.cold = ranked.applicant, ranked.protect, ranked.pricing, \
            ranked.cold
        self.pool_order = ranked.pool_order
        self.enabled = ranked.demote
        self._claims = None
        self._wide_open = None
        self._units_free = None
        self.pending: dict = {}
        self.unquoted: dict = {}

    @property
    def claims(self) -> DemotionClaims:
        if self._claims is None:
            self._claims = DemotionClaims(self)
        return self._claims

    @property
    def wide_open(self) -> bool:
        """May a point take a widely shared object (listed by more than BIG points) that another
        point lists first (RCL-6)? Only if one of this pool's may move for this applicant and
        has at least the gap ahead of it at its first point; usually the applicant protects them."""
        if self._wide_open is None:
            amount, pool, listers, claims = self.amount, self.pool, self.index.listers, self.claims
            self._wide_open = any(p == pool and listers[oid][0][2] >= amount and claims.eligible(oid)
                                  for oid, p in self.index.wide_objects.items())
        return self._wide_open

    def reaches(self, reach: int, wide: int) -> bool:
        """Can this demotion candidate's group take anything at this gap (RCL-6)? Else its
        objects surely go to other points' groups, or may not move."""
        amount = self.amount
        return reach >= amount or (wide >= amount and self.wide_open)

    def keep_chunk(self, summary) -> bool:
        """A chunk of candidates whose farthest reaches (`FARTHEST_REACHES`) may reach this gap."""
        amount = self.amount
        return summary[0] >= amount or (summary[1] >= amount and self.wide_open)

    def units_free(self) -> int:
        """HOST-1 pre-check: Host room in units of this pool (as the reference counts it), exact
        below the gap, stopping once the gap is covered (each demotion moves at most the gap)."""
        if self._units_free is None:
            unit = self.state.pool(self.pool).spec.unit_bytes
            n = 0
            for _, length in ex.iter_extents(self.state.arena.free):
                n += length // unit
                if n >= self.amount:
                    break
            self._units_free = n
        return self._units_free

    # -- sources: (lower-bound key, cid), ascending --
    def source_normal(self):
        reaches = self.reaches
        for demand, cid, reach, wide in self.pool_order.demote_normal.scan(self.keep_chunk):
            if reaches(reach, wide):
                yield (0, 0, 0, 0.0, demand, True, (cid,)), cid

    def source_reuse(self):
        limit = reuse_demand_limit(self.applicant)
        cps, cold = self.cache.checkpoints, self.cold
        reaches = self.reaches
        for demand, cid, reach, wide in self.pool_order.demote_reuse.scan(self.keep_chunk):
            if limit is not None and demand >= limit:
                return
            if not reaches(reach, wide) or (cold and cps[cid].owner in cold):
                continue
            yield (0, 0, 1, demand, 0, True, (cid,)), cid

    def source_pending(self):
        """The few demotions needing Host victims, by a lower bound of their rank: the Host
        victims' loss is at least 0 (normal tier); a reuse-tier key does not read it (RCL-4)."""
        heads = []
        for cid, (tier, demand, _, _) in self.unquoted.items():
            if self.listed(cid):
                heads.append(((0, 0, 0, 0.0, demand, True, (cid,)) if tier == Tier.NORMAL
                              else (0, 0, 1, demand, 0, True, (cid,)), cid))
        for cid, a in self.pending.items():
            if a is not None and self.listed(cid):
                heads.append((rank_key(a, self.amount), cid))
        heads.sort()
        yield from heads

    def listed(self, cid) -> bool:
        """Would `source_normal`/`source_reuse` (or the cold actions, which offer it themselves)
        list this demotion candidate for this applicant?"""
        d = self.index.demotions.get((self.pool, cid))
        if d is None or d[1] is None:
            return False
        name, (demand, _, reach, wide) = d[1]
        if name == DEMOTE_NORMAL:
            return self.reaches(reach, wide)
        if self.cold and self.cache.checkpoints[cid].owner in self.cold:
            return False  # offered among the cold actions
        limit = reuse_demand_limit(self.applicant)
        return may_take_reuse(self.applicant) and self.reaches(reach, wide) and (limit is None or demand < limit)

    # -- exact evaluation --
    def demote_action(self, cid):
        group = self.claims.group(cid)
        if not group:
            return None
        c = self.cache.checkpoints[cid]
        hot, demand = self.pricing.hot(c, frozenset())
        tier = Tier.REUSE if hot else Tier.NORMAL
        if self.units_free() >= len(group):
            objects = self.state.objects
            holders = frozenset(h for oid in group for h in objects[oid].holders)
            return Action("demote", (cid,), tuple(group), len(group), (), 0, tier, demand, holders, (), DEVICE, ())
        return self.pending_action(cid)

    def prepare_pending(self) -> None:
        """The demotions that need Host victims: the reference quotes the oldest few by (tier,
        demand, checkpoint) (`MAX_VICTIM_DEMOTIONS`); fixed before ranking (RCL-5). Which few is
        fixed here; each one's Host quote is asked when the merge reaches its lower bound
        (`source_pending`), since the selection usually closes on cheaper actions first. With
        owners beyond the soft target every quote is asked now: a Host quote may record the
        HEAT-4 read (`Quote.cold`) that the reference makes."""
        if not self.enabled or self.units_free() >= self.amount:
            return
        cps, cold = self.cache.checkpoints, self.cold
        # read lazily, oldest first: only the first few candidates are quoted
        reaches, keep = self.reaches, self.keep_chunk
        normal = ((d, cid) for d, cid, r, w in self.pool_order.demote_normal.scan(keep) if reaches(r, w))
        if cold:
            normal = heapq.merge(normal, sorted((d, cid) for d, cid, r, w in self.pool_order.demote_reuse
                                                if reaches(r, w) and cps[cid].owner in cold))
        reuse = ((d, cid) for d, cid, r, w in self.pool_order.demote_reuse.scan(keep)
                 if reaches(r, w) and not (cold and cps[cid].owner in cold))
        found = []
        free = self.units_free()
        for tier, seq in ((Tier.NORMAL, normal), (Tier.REUSE, reuse)):
            for demand, cid in seq:
                group = self.claims.group(cid)
                if group and len(group) > free:
                    found.append((tier, demand, cps[cid], group))
                    if len(found) >= MAX_VICTIM_DEMOTIONS:
                        break
            if len(found) >= MAX_VICTIM_DEMOTIONS:
                break
        for tier, demand, c, group in found:
            self.pricing.hot(c, frozenset())  # the reference ranks it (and reads its tier) before quoting
            self.unquoted[c.cid] = (tier, demand, c, group)
        if cold:
            for cid in list(self.unquoted):
                self.pending_action(cid)

    def pending_action(self, cid):
        """The demotion of `cid` with its Host victims, its Host quote asked on first use (RCL-5);
        None when it is not among the few or no admissible Host selection makes room."""
        got = self.unquoted.pop(cid, None)
        if got is None:
            return self.pending.get(cid)
        tier, demand, c, group = got
        state, cache, pricing = self.state, self.cache, self.pricing
        self.pending[cid] = None
        holders = frozenset(h for oid in group for h in state.objects[oid].holders)
        need, wb = demotion_writeback(state.pool(self.pool).spec, c, group, tier, self.applicant, pricing)
        # through the module: its Host quotes are what the tests count
        q = ranked_host.host_quote(state, cache, self.index, Gap(HOST, need.size, (need,)), wb,
                                   self.protect | set(group), frozenset(), pricing)
        if not q.admitted:
            return None
        victims = tuple(v._replace(objects=all_freed(state, cache, v)) for v in q.chosen)
        cids, waiters = removed_by(victims)
        if freed_whole(state, cache, group, cids, waiters):
            return None  # RCL-5/RCL-7: the victims together would free the very pages being demoted
        a = self.pending[cid] = Action("demote", (cid,), tuple(group), len(group), (), q.loss, tier, demand,
                                       holders, (), DEVICE, victims)
        return a
