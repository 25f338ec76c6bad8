"""A reclamation quote through the cache's victim order (RCL-1..12, HOST-1..3, WAIT-2, RD-8).

`quote_fast` makes the very selection `reclaim.quote_reference` makes, without enumerating
every action: the ranked admissible actions are produced lazily, best first, by merging the
stored orders of ledger/victims.py, and the selection (`reclaim.select_device`, shared with the
reference) stops reading at its closing pick.

The merge. Each stored order yields entries in ascending order of a *lower bound* of their
true RCL-4 key: a group's stored loss, frees, tier and demand come from the cache's facts; what
the ledger adds — leases, pins, active writers, the applicant's protected objects, holders the
cache does not know — can only remove objects, i.e. raise the key (fewer useful units) or drop
the action. A taken entry is evaluated exactly (the reference's own rules, on the live state)
and waits in a small heap until no unread entry can rank before it. The gap-dependent useful
amount (RD-8: freed units capped at the gap) is served by buckets of groups freeing the same
units (`n`): within a bucket loss orders them, one divisor per bucket; a budgeted capture
(RCL-11) stops reading a bucket at the first loss the rest of its budget excludes.

Reuse-tier content (`r`, `dr`) ranks after normal content, except for owners the HEAT-4 segment
puts beyond the soft target: those few are ranked here as normal content (`cold`), exactly. Groups
with waiters, pause snapshots or waiters' own points (`special`) depend on the applicant
(WAIT-2, PAUSE-4, SCH-4) and are ranked here from their members. Demotions (RCL-6) are taken
in (tier, demand, checkpoint) order; the page a group takes is decided as the reference
decides it (the first checkpoint in `walk_key` order claims a shared page). Host gaps merge
the Host order (`hord`) the same way (`_HostRanked`), "fits alone" tested only for what the
selection reads.
"""
from __future__ import annotations

import heapq

from ledger import extents as ex
from ledger import reclaim as rc
from ledger import victims as vx
from ledger.cache_state import Tier
from ledger.reclaim import Action, Applicant, ApplicantKind, Gap, Quote, _Facts
from ledger.state import DEVICE, HOST, KV_PAGES


class QuoteFacts:
    """RCL-2: the facts one synchronous decision shares between its quotes — the victim order
    brought to the ledger's replicas, the HEAT-4 owners beyond the soft target — computed once
    for one (state, cache) pair and reused by every quote on it: one per scarce pool, the
    revoking re-quote (WAIT-2), a capture's State then Host gaps. Void once either changes
    (`valid_for`); permissions stay per applicant."""

    __slots__ = ("state", "cache", "vi", "_cold", "host")

    def __init__(self, state, cache):
        self.state, self.cache = state, cache
        self.vi = vx.sync(cache.victims, state, cache) if cache.victims is not None else None
        self._cold = None
        self.host = HostMemo()  # the Host evaluations its quotes share

    def valid_for(self, state, cache) -> bool:
        return state is self.state and cache is self.cache

    @property
    def cold(self) -> frozenset:
        if self._cold is None:
            vi = self.vi
            self._cold = vx.beyond_target(vi, self.state)[0] if vi is not None and vi.heat.seg.size else frozenset()
        return self._cold

    def quote(self, gap: Gap, applicant: Applicant, protect=(), keep_content=()) -> Quote:
        """`ledger.quote(state, cache, gap, applicant, protect, keep_content)` on these facts."""
        rc._check_args(self.state, gap, applicant)
        if self.vi is None:
            return rc.quote_reference(self.state, self.cache, gap, applicant, protect, keep_content)
        return quote_fast(self.state, self.cache, gap, applicant, frozenset(protect), frozenset(keep_content), self)


def quote_fast(state, cache, gap: Gap, applicant: Applicant, protect: frozenset, keep: frozenset,
               shared: QuoteFacts | None = None) -> Quote:
    if shared is None:
        shared = QuoteFacts(state, cache)
    vi, cold = shared.vi, shared.cold
    facts = _Facts(state, cache, cold_source=cold)
    facts.memo = shared.host
    if gap.pool == HOST:
        q = _host_quote(state, cache, vi, gap, applicant, protect, keep, facts)
        # the listing order of `actions` is the full walk's (an arena that fits lists them unranked)
        return q._replace(cold=facts._cold or frozenset(),
                          ranking=rc.LazyRanking(state, cache, gap, applicant, protect, keep))
    q = _device_quote(state, cache, vi, gap, applicant, protect, keep, facts, cold)
    if not q.admitted and applicant.demote:
        q2 = _device_quote(state, cache, vi, gap, applicant._replace(demote=False), protect, keep, facts, cold)
        if q2.admitted:
            q = q2._replace(applicant=applicant)
    if cold and facts._cold is None and _reference_reads_cold(state, cache, vi, gap, applicant, protect, keep, facts,
                                                              cold):
        facts._cold = cold  # the full enumeration would have met a reuse-tier owner (HEAT-4, recorded on commit)
    return q._replace(cold=facts._cold or frozenset())


# -- Host gaps ---------------------------------------------------------------------------------
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
    count a page group reads). `dups`: the duplicate replicas before a quote's protections
    (HOST-1)."""

    __slots__ = ("exact", "kept", "fits", "dups")

    def __init__(self):
        self.exact: dict = {}
        self.kept: dict = {}
        self.fits: dict = {}
        self.dups: list | None = None

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


def _host_quote(state, cache, vi, gap, applicant, protect, keep, facts) -> Quote:
    """HOST-1/2 through the Host order: the reference's selection (`reclaim._select_host`) fed
    with the Host-resident actions in rank order, produced lazily (`_HostRanked`)."""
    ranked = _HostRanked(state, cache, vi, applicant, protect, keep, facts)
    q = rc._select_host(state, cache, gap, applicant, None, 0, ranked.order, ranked.memo)
    ranked.record_cold()
    return q


class _HostRanked:
    """The admissible Host-resident actions of one Host quote, in HOST-2 rank order but for
    "fits alone" (which `reclaim._fits_first` puts in front while reading):

    1. duplicate replicas (HOST-1), by object id: the pools' `x` orders merged;
    2. deletions revoking nothing: the Host order `hord` (ordinary holder sets, keyed by a lower
       bound: stored tier, loss over the useful amount's cap — the true useful amount is at most
       the cap, and what the ledger adds only removes objects) merged with the exact actions of
       the few applicant-dependent groups (waiters, pause snapshots: WAIT-2, PAUSE-4) and of the
       owners beyond the soft target (HEAT-4, ranked as normal content);
    3. revoking deletions, by rung (SCH-4).

    A taken entry is evaluated exactly by the reference's own enumeration on that group's
    objects (and its subgroups', RCL-1), so actions equal the full walk's."""

    def __init__(self, state, cache, vi, applicant, protect, keep, facts):
        self.state, self.cache, self.vi = state, cache, vi
        self.ap, self.protect, self.keep, self.facts = applicant, protect, keep, facts
        self.cold = facts._cold_source or frozenset()
        self.memo = facts.memo if facts.memo is not None else HostMemo()
        # RCL-11: a budgeted applicant's selection skips every action whose loss reaches the budget
        budgeted = applicant.kind in (ApplicantKind.CAPTURE, ApplicantKind.WRITEBACK) and not applicant.demand_time
        self.loss_cap = max(applicant.budget, 1) if budgeted else None

    # -- objects --
    def _host_only(self, hs) -> list:
        """Listed objects of holder set `hs` (every pool) with a complete Host replica only."""
        objects, out = self.state.objects, []
        for p in self.vi.pools:
            g = self.vi.groups.get((p, hs))
            if g is None:
                continue
            for oid in g.members:
                o = objects.get(oid)
                if o is not None and o.host is not None and o.host.complete and not (
                        o.device is not None and o.device.complete):
                    out.append(oid)
        return out

    def _subsets(self, hs):
        """Holder sets strictly within `hs` that hold objects of some pool (RCL-1: they go with it)."""
        vi, seen = self.vi, set()
        for p in vi.pools:
            for h in hs:
                if h[0] != "ckpt":
                    continue
                for s in vi.gidx.get((p, h[1]), ()):
                    if s not in seen and s != hs and s <= hs:
                        seen.add(s)
                        yield s
            if vx._width(hs) > vx.BIG:
                for s in vi.big.get(p, ()):
                    if s not in seen and s != hs and s <= hs:
                        seen.add(s)
                        yield s

    def _candidates(self, sets) -> dict:
        """These holder sets' Host-only objects and their subgroups' (RCL-1)."""
        cands = {}
        for hs in sets:
            for oid in self._host_only(hs):
                cands[oid] = None
            if vx._width(hs) > 1:
                for sub in self._subsets(hs):
                    for oid in self._host_only(sub):
                        cands[oid] = None
        return cands

    def _actions(self, sets, facts=None, cands=None) -> list:
        """The reference's Host actions (`reclaim._enumerate`) over these holder sets' Host-only
        objects and their subgroups'."""
        if cands is None:
            cands = self._candidates(sets)
        if not cands:
            return []
        actions, _ = rc._enumerate(self.state, self.cache, Gap(HOST, 1), self.ap, self.protect,
                                   facts or self.facts, self.keep, candidates=cands.keys())
        return [a for a in actions if a.kind == "delete"]

    def _exact(self, cids: tuple):
        """The exact deletion of the ordinary holder set of these points, through the memo."""
        memo, protect, keep = self.memo, self.protect, self.keep
        got = memo.exact.get(cids)
        if got is None or not (got[1].isdisjoint(protect) and got[1].isdisjoint(keep)):
            hs = frozenset(("ckpt", c) for c in cids)
            cands = self._candidates((hs,))
            probe = rc._Facts(self.state, self.cache, cold_source=self.facts._cold_source)
            a = None
            for b in self._actions((hs,), probe, cands):
                if b.cids == cids and not b.waiters:
                    a = b
                    break
            got = (a, frozenset(cands), probe._cold is not None)
            if got[1].isdisjoint(protect) and got[1].isdisjoint(keep):
                memo.exact[cids] = got
                if a is not None:
                    memo.kept[id(a)] = a
        a, _, read_cold = got
        if read_cold and self.facts._cold is None:
            self.facts._cold = self.facts.cold  # HEAT-4: evaluating it reads the owners beyond the target
        return a

    def _special(self) -> list:
        vi, cache = self.vi, self.cache
        sets = {hs for p in vi.pools for hs in vi.special.get(p, ())}
        if not sets:
            return []
        out = []
        for a in self._actions(sets):
            hs = frozenset(("ckpt", c) for c in a.cids) | frozenset(("wait", w) for w in a.waiters)
            if a.waiters or vx.is_special(cache, hs):
                out.append(a)
        return out

    def _cold_actions(self) -> list:
        vi, cold, out, seen = self.vi, self.cold, [], set()
        for owner in cold:
            _, _, points = vx.owner_status(self.cache, owner)
            for pt in points:
                h = ("ckpt", pt)
                for p in vi.pools:
                    for hs in list(vi.gidx.get((p, pt), ())) + [w for w in vi.big.get(p, ()) if h in w]:
                        it = vi.hitems.get(hs)
                        if hs in seen or it is None or not it[1] or not it[1] <= cold:
                            continue
                        seen.add(hs)
                        a = self._exact(it[0][3])
                        if a is not None:
                            out.append(a)
        return out

    def _dups(self):
        memo, protect, keep = self.memo, self.protect, self.keep
        if memo.dups is None:
            objects, dups = self.state.objects, []
            for (oid,) in heapq.merge(*(self.vi.orders[p].x for p in self.vi.pools)):
                o = objects.get(oid)
                if o is None or o.leases or o.host is None or not o.host.complete or o.device is None \
                        or not o.device.complete:
                    continue
                a = Action("drop_replica", (), (oid,), o.host.nbytes, (o.host.location,), 0, Tier.NORMAL, 0,
                           o.holders, (), rc.HOST_MEDIUM)
                dups.append(a)
                memo.kept[id(a)] = a
            memo.dups = dups
        for a in memo.dups:
            oid = a.objects[0]
            if oid in protect and oid not in keep:
                continue  # RCL-8: the applicant's own source
            yield a

    # -- the order --
    def order(self, rank, cap):
        ap, admissible = self.ap, rc._admissible
        yield from self._dups()
        ready, revoking, seq = [], [], 0
        for a in self._special() + self._cold_actions():
            if admissible(a, ap):
                if a.revokes:
                    revoking.append(a)
                else:
                    heapq.heappush(ready, (rank(a)[1], seq, a))
                    seq += 1
        cold, hitems, loss_cap = self.cold, self.vi.hitems, self.loss_cap
        stream = iter(self.vi.hord)
        head = next(stream, None)
        while True:
            while head is not None and (not ready or ready[0][0] >= (head[0], head[1] / cap)):
                tier, loss, demand, cids = head
                if loss_cap is not None and loss >= loss_cap:
                    # RCL-11: the entry's loss bound reaches the budget, and so does every later
                    # entry of its stored tier: the selection would skip them all unread
                    stream = self.vi.hord.scan(start=(tier + 1,))
                    head = next(stream, None)
                    continue
                head = next(stream, None)
                if tier == Tier.REUSE and cold:
                    hot = hitems[frozenset(("ckpt", c) for c in cids)][1]
                    if hot and hot <= cold:
                        continue  # ranked as normal content among the cold actions (HEAT-4)
                a = self._exact(cids)
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
        facts = self.facts
        if facts._cold is not None or not self.cold:
            return
        for hs in self.vi.hreuse.keys():
            if self._actions_exist(hs):
                facts._cold = facts.cold
                return

    def _actions_exist(self, hs) -> bool:
        objects, protect, keep = self.state.objects, self.protect, self.keep
        for oid in self._host_only(hs):
            o = objects[oid]
            if not o.leases and oid not in protect and oid not in keep and o.holders == hs:
                return True
        return False


# -- Device gaps -------------------------------------------------------------------------------
def _classify(o, pool: str, protect: frozenset, keep: frozenset) -> str:
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


class _Select:
    """The ranked admissible actions of one Device quote, produced lazily."""

    def __init__(self, state, cache, vi, gap, applicant, protect, keep, facts, cold):
        self.state, self.cache, self.vi = state, cache, vi
        self.gap, self.ap, self.protect, self.keep = gap, applicant, protect, keep
        self.facts, self.cold = facts, cold
        self.pool = gap.pool
        self.g = gap.amount
        self.po = vi.orders[gap.pool]
        self.kind = state.pool(gap.pool).spec.kind
        ap = applicant
        self.budgeted = ap.kind in (ApplicantKind.CAPTURE, ApplicantKind.WRITEBACK) and not ap.demand_time
        self.brem = ap.budget if self.budgeted else None  # RCL-11: what is left of the budget
        self.demote = ap.demote and state.transaction is None
        self._claims = None
        self._wide_open = None
        self.free_units = None
        self.pending: dict = {}  # cid -> the demotion needing Host victims (first MAX_VICTIM_DEMOTIONS), or None
        self._unquoted: dict = {}  # cid -> (tier, demand, checkpoint, group): found, its Host quote not yet asked

    # -- what the applicant may take (RCL-10) --
    def _reuse_ok(self) -> bool:
        ap = self.ap
        if ap.kind in (ApplicantKind.NECESSARY, ApplicantKind.SNAPSHOT) or ap.demand_time:
            return True
        return Tier.REUSE <= ap.tier

    def _over_budget(self, loss) -> bool:
        return self.brem is not None and loss > 0 and loss >= self.brem

    # -- sources: (lower-bound key, kind, payload), ascending --
    def _src_x(self):
        for (oid,) in self.po.x:
            yield (0, 0, 0, 0.0, 0, False, (), (oid,)), "x", oid

    def _src_n(self, bucket: int, order):
        """Normal-tier groups freeing `bucket` units (WIDE: more than 64, or many points), by
        loss: their useful amount is min(frees, gap) (RD-8), one divisor per bucket."""
        g = self.g
        div = min(bucket, g) if bucket != vx.WIDE else g
        for loss, demand, cids, f in order:
            if self._over_budget(loss):
                return  # ascending by loss: nothing later fits the budget (RCL-11)
            yield (0, 0, 0, loss / div, demand, True, cids), "g", cids

    def _src_r(self):
        ap = self.ap
        lim = ap.demand_time if ap.kind in (ApplicantKind.CAPTURE, ApplicantKind.WRITEBACK) and ap.demand_time else None
        groups, pool, cold = self.vi.groups, self.pool, self.cold

        def keep_chunk(agg):
            return not self._over_budget(agg)
        for it in self.po.r.scan(keep_chunk):
            demand, cids, loss = it
            if lim is not None and demand >= lim:
                return  # RCL-10: only reuse content older than the capture's own demand
            if self._over_budget(loss):
                continue
            if cold and groups[(pool, frozenset(("ckpt", c) for c in cids))].hot <= cold:
                continue  # every owner protecting it is beyond the soft target: ranked as normal
            yield (0, 0, 1, demand, 0, True, cids), "g", cids

    @property
    def wide_open(self) -> bool:
        """May a point take a widely shared object (listed by more than BIG points) that another
        point lists first (RCL-6)? Only if one of this pool's may move for this applicant and
        has at least the gap ahead of it at its first point; usually the applicant protects them."""
        if self._wide_open is None:
            g, pool, walk, claims = self.g, self.pool, self.vi.walk, self.claims
            self._wide_open = any(p == pool and walk[oid][0][2] >= g and claims._eligible(oid)
                                  for oid, p in self.vi.wide.items())
        return self._wide_open

    def _reaches(self, reach: int, wide: int) -> bool:
        """Can this demotion candidate's group take anything at this gap (RCL-6)? Else its
        objects surely go to other points' groups, or may not move."""
        g = self.g
        return reach >= g or (wide >= g and self.wide_open)

    def _keep_dem(self, agg) -> bool:
        g = self.g
        return agg[0] >= g or (agg[1] >= g and self.wide_open)

    def _src_dn(self):
        reaches = self._reaches
        for demand, cid, reach, wide in self.po.dn.scan(self._keep_dem):
            if reaches(reach, wide):
                yield (0, 0, 0, 0.0, demand, True, (cid,)), "d", cid

    def _src_dr(self):
        ap = self.ap
        lim = ap.demand_time if ap.kind in (ApplicantKind.CAPTURE, ApplicantKind.WRITEBACK) and ap.demand_time else None
        cps, cold, g = self.cache.checkpoints, self.cold, self.g
        reaches = self._reaches
        for demand, cid, reach, wide in self.po.dr.scan(self._keep_dem):
            if lim is not None and demand >= lim:
                return
            if not reaches(reach, wide) or (cold and cps[cid].owner in cold):
                continue
            yield (0, 0, 1, demand, 0, True, (cid,)), "d", cid

    def _listed_demotion(self, cid) -> bool:
        """Would `_src_dn`/`_src_dr` (or `_cold_actions`, which offers it itself) list this
        demotion candidate for this applicant?"""
        d = self.vi.dem.get((self.pool, cid))
        if d is None or d[1] is None:
            return False
        name, (demand, _, reach, wide) = d[1]
        if name == "dn":
            return self._reaches(reach, wide)
        if self.cold and self.cache.checkpoints[cid].owner in self.cold:
            return False  # offered among the cold actions
        ap = self.ap
        lim = ap.demand_time if ap.kind in (ApplicantKind.CAPTURE, ApplicantKind.WRITEBACK) and ap.demand_time else None
        return self._reuse_ok() and self._reaches(reach, wide) and (lim is None or demand < lim)

    # -- exact evaluation --
    def _x_action(self, oid):
        o = self.state.objects.get(oid)
        if _classify(o, self.pool, self.protect, self.keep) != "dup":
            return None
        return Action("drop_replica", (), (oid,), 1, (), 0, Tier.NORMAL, 0, o.holders, (), DEVICE)

    def _valid_members(self, hs):
        g = self.vi.groups.get((self.pool, hs))
        if g is None:
            return []
        objects, pool, protect, keep = self.state.objects, self.pool, self.protect, self.keep
        out = []
        for oid in g.members:
            o = objects.get(oid)
            if o is not None and o.holders == hs and _classify(o, pool, protect, keep) == "group":
                out.append(o)
        return out

    def _group_action(self, cids: tuple):
        hs = frozenset(("ckpt", c) for c in cids)
        own = self._valid_members(hs)
        if not own:
            return None
        cache, facts = self.cache, self.facts
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
                h, t = facts.hot(c, gone)
            return Action("delete", cids, (o.object_id,), 1, (), facts.loss(gone), Tier.REUSE if h else Tier.NORMAL,
                          t, o.holders, ())
        freed = {o.object_id: o for o in own}
        if len(cids) > 1:
            for sub in self._subgroups(hs):
                for o in self._valid_members(sub):
                    freed[o.object_id] = o
        tier, demand = facts.tier(gone)
        holders, ids = rc.freed_holders(freed)
        return Action("delete", cids, ids, len(freed), (), facts.loss(gone), tier, demand, holders, (), DEVICE, (), ())

    def _subgroups(self, hs):
        """Ordinary groups of the pool strictly within holder set `hs` (RCL-1: they go with it)."""
        vi, pool = self.vi, self.pool
        seen = set()
        for h in hs:
            if h[0] != "ckpt":
                continue
            for s in vi.gidx.get((pool, h[1]), ()):
                if s not in seen:
                    seen.add(s)
                    if s != hs and s <= hs and not vi.groups[(pool, s)].special:
                        yield s
        if vx._width(hs) > vx.BIG:
            for s in vi.big.get(pool, ()):
                if s != hs and s <= hs and not vi.groups[(pool, s)].special:
                    yield s

    # -- demotions (RCL-5/6) --
    @property
    def claims(self):
        if self._claims is None:
            self._claims = _Claims(self)
        return self._claims

    def _units_free(self) -> int:
        """HOST-1 pre-check: Host room in units of this pool (as the reference counts it), exact
        below the gap, stopping once the gap is covered (each demotion moves at most the gap)."""
        if self.free_units is None:
            unit = self.state.pool(self.pool).spec.unit_bytes
            n = 0
            for _, length in ex.iter_extents(self.state.arena.free):
                n += length // unit
                if n >= self.g:
                    break
            self.free_units = n
        return self.free_units

    def _demote_action(self, cid):
        group = self.claims.group(cid)
        if not group:
            return None
        c = self.cache.checkpoints[cid]
        hot, demand = self.facts.hot(c, frozenset())
        tier = Tier.REUSE if hot else Tier.NORMAL
        if self._units_free() >= len(group):
            objects = self.state.objects
            holders = frozenset(h for oid in group for h in objects[oid].holders)
            return Action("demote", (cid,), tuple(group), len(group), (), 0, tier, demand, holders, (), DEVICE, ())
        return self._pending(cid)

    def _prepare_pending(self) -> None:
        """The demotions that need Host victims: the reference quotes the oldest few by (tier,
        demand, checkpoint) (`MAX_VICTIM_DEMOTIONS`); fixed before ranking (RCL-5). Which few is
        fixed here; each one's Host quote is asked when the merge reaches its lower bound
        (`_src_p`), since the selection usually closes on cheaper actions first. With owners
        beyond the soft target every quote is asked now: a Host quote may record the HEAT-4 read
        (`Quote.cold`) that the reference makes."""
        if not self.demote or self._units_free() >= self.g:
            return
        cps, cold = self.cache.checkpoints, self.cold
        g = self.g
        # read lazily, oldest first: only the first few candidates are quoted
        reaches, keep = self._reaches, self._keep_dem
        normal = ((d, cid) for d, cid, r, w in self.po.dn.scan(keep) if reaches(r, w))
        if cold:
            normal = heapq.merge(normal, sorted((d, cid) for d, cid, r, w in self.po.dr
                                                if reaches(r, w) and cps[cid].owner in cold))
        reuse = ((d, cid) for d, cid, r, w in self.po.dr.scan(keep)
                 if reaches(r, w) and not (cold and cps[cid].owner in cold))
        found = []
        fu = self._units_free()
        for tier, seq in ((Tier.NORMAL, normal), (Tier.REUSE, reuse)):
            for demand, cid in seq:
                group = self.claims.group(cid)
                if group and len(group) > fu:
                    found.append((tier, demand, cps[cid], group))
                    if len(found) >= rc.MAX_VICTIM_DEMOTIONS:
                        break
            if len(found) >= rc.MAX_VICTIM_DEMOTIONS:
                break
        for tier, demand, c, group in found:
            self.facts.hot(c, frozenset())  # the reference ranks it (and reads its tier) before quoting
            self._unquoted[c.cid] = (tier, demand, c, group)
        if cold:
            for cid in list(self._unquoted):
                self._pending(cid)

    def _pending(self, cid):
        """The demotion of `cid` with its Host victims, its Host quote asked on first use (RCL-5);
        None when it is not among the few or no admissible Host selection makes room."""
        got = self._unquoted.pop(cid, None)
        if got is None:
            return self.pending.get(cid)
        tier, demand, c, group = got
        state, cache, facts = self.state, self.cache, self.facts
        self.pending[cid] = None
        holders = frozenset(h for oid in group for h in state.objects[oid].holders)
        need, wb = rc.demotion_writeback(state.pool(self.pool).spec, c, group, tier, self.ap, facts)
        q = _host_quote(state, cache, self.vi, Gap(HOST, need.size, (need,)), wb, self.protect | set(group),
                        frozenset(), facts)
        if not q.admitted:
            return None
        victims = tuple(v._replace(objects=rc._all_freed(state, cache, v)) for v in q.chosen)
        cids, waiters = rc._removes(victims)
        if rc._freed(state, cache, group, cids, waiters):
            return None  # RCL-5/RCL-7: the victims together would free the very pages being demoted
        a = self.pending[cid] = Action("demote", (cid,), tuple(group), len(group), (), q.loss, tier, demand,
                                       holders, (), DEVICE, victims)
        return a

    def _src_p(self):
        """The few demotions needing Host victims, by a lower bound of their rank: the Host
        victims' loss is at least 0 (normal tier); a reuse-tier key does not read it (RCL-4)."""
        heads = []
        for cid, (tier, demand, _, _) in self._unquoted.items():
            if self._listed_demotion(cid):
                heads.append(((0, 0, 0, 0.0, demand, True, (cid,)) if tier == Tier.NORMAL
                              else (0, 0, 1, demand, 0, True, (cid,)), cid))
        for cid, a in self.pending.items():
            if a is not None and self._listed_demotion(cid):
                heads.append((rc._rank_key(a, self.g), cid))
        heads.sort()
        for lb, cid in heads:
            yield lb, "p", cid

    # -- exact lists (few) --
    def _cold_actions(self) -> list:
        """Content of owners beyond the soft target (HEAT-4): ranked as normal content."""
        out = []
        if not self.cold:
            return out
        vi, pool, cache = self.vi, self.pool, self.cache
        seen_g, seen_d = set(), set()
        for owner in self.cold:
            _, _, points = vx.owner_status(cache, owner)
            for p in points:
                for hs in vi.gidx.get((pool, p), ()):
                    if hs in seen_g:
                        continue
                    seen_g.add(hs)
                    g = vi.groups[(pool, hs)]
                    if g.special or not g.hot or not g.hot <= self.cold or not g.items:
                        continue
                    a = self._group_action(vx._cids(hs))
                    if a is not None:
                        out.append((a, 0))
                if self.demote and p not in seen_d:
                    seen_d.add(p)
                    d = vi.dem.get((pool, p))
                    if d is not None and d[1] is not None and d[1][0] == "dr":
                        a = self._demote_action(p)
                        if a is not None:
                            out.append((a, 1))
        return out

    def _special_actions(self) -> list:
        """Groups with waiters, pause snapshots or waiters' own points (WAIT-2, PAUSE-4): the
        reference's grouping, on their members only."""
        vi, pool = self.vi, self.pool
        sp = vi.special.get(pool)
        if not sp:
            return []
        state, cache, ap, facts = self.state, self.cache, self.ap, self.facts
        objects = state.objects
        groups: dict = {}
        for hs in sp:
            for oid in vi.groups[(pool, hs)].members:
                o = objects.get(oid)
                if _classify(o, pool, self.protect, self.keep) != "group":
                    continue
                got = rc._holders_ok(o, cache, ap)
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
                for sub in self._subgroups(hs):
                    for o in self._valid_members(sub):
                        freed[o.object_id] = o
            tier, demand = facts.tier(cids)
            holders, ids = rc.freed_holders(freed)
            revokes = rc.deletion_revokes(cache, cids, waiters) if waiters or snapshots else ()
            out.append((Action("delete", tuple(sorted(cids)), ids, len(freed), (), facts.loss(cids), tier, demand,
                               holders, waiters, DEVICE, (), revokes), 0))
        return out

    # -- the merge --
    def __iter__(self):
        g = self.g
        ap = self.ap
        rank, admissible = rc._rank_key, rc._admissible
        ready: list = []  # (key, tie, seq, action)
        seq = 0

        def offer(a, tie):
            nonlocal seq
            if a is not None and admissible(a, ap):
                heapq.heappush(ready, (rank(a, g), tie, seq, a))
                seq += 1
        self._prepare_pending()
        for a, tie in self._special_actions() + self._cold_actions():
            offer(a, tie)
        sources = [self._src_x()] + [self._src_n(b, o) for b, o in self.po.n.items()]
        if self._reuse_ok():
            sources.append(self._src_r())
        if self.demote and self._units_free() == 0:
            # No demotion places as it is (HOST-1): only the few quoted with Host victims exist
            # (RCL-5), so the candidates are not walked.
            sources.append(self._src_p())
        elif self.demote:
            sources.append(self._src_dn())
            if self._reuse_ok():
                sources.append(self._src_dr())
        heads: list = []
        for i, src in enumerate(sources):
            for lb, kind, payload in src:
                heads.append(((lb, -1), i, kind, payload))
                break
        heapq.heapify(heads)
        while True:
            while heads and (not ready or (ready[0][0], ready[0][1]) >= heads[0][0]):
                _, i, kind, payload = heapq.heappop(heads)
                if kind == "x":
                    offer(self._x_action(payload), 0)
                elif kind == "g":
                    offer(self._group_action(payload), 0)
                elif kind == "p":
                    offer(self._pending(payload), 1)
                else:
                    offer(self._demote_action(payload), 1)
                for lb, kind2, payload2 in sources[i]:
                    heapq.heappush(heads, ((lb, -1), i, kind2, payload2))
                    break
            if not ready:
                return
            yield heapq.heappop(ready)[3]

    def took(self, loss: int) -> None:
        if self.budgeted:
            self.brem = self.ap.budget - loss


class _Claims:
    """Which of a checkpoint's Device-only objects its demotion group takes (RCL-6): its own in
    demotion order, up to the gap, skipping what a checkpoint earlier in `walk_key` order took.
    An object joins at most one group; `claimer` remembers whose, `upto` how far along its
    holders (in walk order) that is settled."""

    def __init__(self, sel: _Select):
        self.sel = sel
        self.memo: dict = {}
        self.elig: dict = {}
        self.claimer: dict = {}  # oid -> the checkpoint whose group took it
        self.upto: dict = {}  # oid -> how many of its holders are known not to take it
        self.depth = 0
        self.mover = sel.ap._replace(fresh=False)  # WAIT-2: moving a pause snapshot to Host revokes nothing

    def _eligible(self, oid) -> bool:
        """May this object move to Host in a demotion (RCL-1, RCL-6, WAIT-2)?"""
        got = self.elig.get(oid)
        if got is not None:
            return got
        sel = self.sel
        if oid in sel.protect:  # RCL-8, asked before the object is read: a session's points share
            self.elig[oid] = False  # the protected prefix of the request being admitted
            return False
        o = sel.state.objects[oid]
        ok = not (o.pool != sel.pool or o.device is None or o.host is not None or o.leases or o.pins)
        if ok:
            hs = sel.vi.oh.get(oid)
            holders = o.holders
            if hs is not None and holders is not hs and holders != hs:
                ok = False  # an active writer or a holder the cache does not know limits movement
            else:
                g = sel.vi.groups.get((sel.pool, hs)) if hs is not None else None
                if g is None or g.special:  # waiters, snapshots, waiters' points: by the rules
                    cache, mover = sel.cache, self.mover
                    ok = all(rc._may_migrate(h, cache, mover) for h in holders)
        self.elig[oid] = ok
        return ok

    def _walk(self, oid) -> tuple:
        """(walk key, cid, objects ahead) of the points listing a shared oid (kept by the index)."""
        return self.sel.vi.walk[oid]

    def group(self, cid) -> list:
        memo = self.memo
        if cid in memo:
            return memo[cid]
        stack = [cid]
        while stack:
            top = stack[-1]
            if top in memo:
                stack.pop()
                continue
            need = self._try(top)
            if need is not None:
                stack.append(need)
            else:
                stack.pop()
        return memo[cid]

    def _taken_before(self, oid, cid, me):
        """True/False whether a checkpoint before `cid` (walk key `me`) took `oid`; or the
        checkpoint whose group must be known first."""
        c = self.claimer.get(oid)
        if c is not None:
            return c[0] < me
        hs = self._walk(oid)
        i = self.upto.get(oid, 0)
        memo = self.memo
        n = len(hs)
        sel = self.sel
        while i < n:
            k, p, ahead = hs[i]
            if k >= me:
                return False
            g = memo.get(p)
            if g is None:
                # p reaches oid with room whatever it took before (fewer objects ahead of it in
                # p's demotion order than the gap): no earlier point took it, so p does
                if ahead < sel.g:
                    self.claimer[oid] = (k, p)
                    return True
                if self.depth >= 48:
                    return p  # a long chain: the caller's stack computes it first
                self.depth += 1
                try:
                    g = self.group(p)
                finally:
                    self.depth -= 1
            i += 1
            self.upto[oid] = i
            if oid in g:
                self.claimer[oid] = (k, p)
                return True
        return False

    def _try(self, cid):
        sel = self.sel
        c = sel.cache.checkpoints[cid]
        out = []
        want = sel.g
        me = rc.walk_key(cid)
        walk, elig = sel.vi.walk, self.elig
        skip = vx.lead(sel.vi, c, sel.pool) if sel.kind == KV_PAGES else 0  # moved to Host before
        for oid in vx.pages_of(c, sel.pool, sel.kind, skip):
            ok = elig.get(oid)
            if ok is False:
                continue  # known not to move (the cheaper test first: points share their prefix)
            w = walk.get(oid)
            if w is not None and w[0][1] != cid and w[0][2] < want:
                continue  # its first point in walk order takes it with room to spare (or nobody may)
            if ok is None and not self._eligible(oid):
                continue
            if w is not None:  # shared: did a checkpoint earlier in walk order take it?
                got = self._taken_before(oid, cid, me)
                if got is True:
                    continue
                if got is not False:
                    return got  # compute that checkpoint's group first
            out.append(oid)
            if len(out) >= want:
                break
        self.memo[cid] = out
        claimer = self.claimer
        for oid in out:
            if oid not in claimer:
                claimer[oid] = (me, cid)
        return None


def _device_quote(state, cache, vi, gap, applicant, protect, keep, facts, cold) -> Quote:
    ranking = rc.LazyRanking(state, cache, gap, applicant, protect, keep)
    po = vi.orders[gap.pool]
    if po.held < gap.amount:  # fewer listed Device objects than the gap: nothing closes it
        return Quote(gap, applicant, ranking, (), 0, 0, False, state, cache)
    sel = _Select(state, cache, vi, gap, applicant, protect, keep, facts, cold)
    chosen = rc.select_device(state, cache, gap, applicant, sel, on_take=sel.took)
    if chosen is None:
        return Quote(gap, applicant, ranking, (), 0, 0, False, state, cache)
    freed = len({o for a in chosen for o in a.objects})
    return Quote(gap, applicant, ranking, tuple(chosen), freed, sum(a.loss for a in chosen), True, state, cache)


def _reference_reads_cold(state, cache, vi, gap, applicant, protect, keep, facts, cold) -> bool:
    """Would the full enumeration have ranked content of a reuse-tier owner (and so read the
    HEAT-4 segment that `Quote.cold` records)? Any candidate action with such an owner's point,
    or a Host victim quoted for a demotion (the reference quotes those before ranking)."""
    pool = gap.pool
    sel = _Select(state, cache, vi, gap, applicant, protect, keep, facts, cold)
    if sel.demote:
        sel._prepare_pending()
        if facts._cold is not None:
            return True
    wide = vi.big.get(pool, ())
    for owner in vi.heat.owners.keys():
        _, _, points = vx.owner_status(cache, owner)
        for p in points:
            h = ("ckpt", p)
            for hs in list(vi.gidx.get((pool, p), ())) + [w for w in wide if h in w]:
                g = vi.groups[(pool, hs)]
                if not g.special:
                    if sel._valid_members(hs):
                        return True
                    continue
                for oid in g.members:
                    o = state.objects.get(oid)
                    if _classify(o, pool, protect, keep) != "group":
                        continue
                    got = rc._holders_ok(o, cache, applicant)
                    if got is not None and got[0]:
                        return True
            if sel.demote and sel.claims.group(p):
                return True
    return False
