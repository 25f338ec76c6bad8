"""The price of a reclamation action: the recovery a deletion loses, per unit it frees (RCL-3..5,
RCL-10/11, RD-8, HEAT-4). `LossPricing` holds the facts one quote's candidates share (RCL-2):
each point's surviving fallback and so the tokens a deletion loses (RCL-5, nested points of one
history counted once), and whether a point is hot content of a reuse-tier owner (RCL-3), with the
owners beyond the reuse segment's soft target priced as normal content (HEAT-4, read once and
recorded, `cold_read`). `rank_key` orders actions by that loss over the useful freed amount (the
gap caps it, RD-8), `admissible` is the admission table (RCL-10) and `demotion_writeback` the
rights a demotion's Host victims are chosen with (RCL-12). The victim index keys its stored order
with the same pricing (`stored_tier_pricing`); the quotes read it live.
"""
from __future__ import annotations

from ledger import arena as host
from ledger import prefix_index as px
from ledger.cache_state import SOFT_TARGET, CacheState, Checkpoint, Tier, indexed
from ledger.reclamation.prefixes import aliases
from ledger.reclamation.terms import Action, Applicant, ApplicantKind
from ledger.state import HOST, KV_PAGES, LedgerState


class LossPricing:
    """Facts shared by every candidate of one quote (RCL-2): fallbacks, protections.

    `cold_source`: the HEAT-4 owners beyond the soft target when the caller knows them (the victim
    order's segment), else None (recounted from first principles on first use). `cold_read`: those
    owners once a candidate read them (None: no reuse-tier owner was met), which a quote records
    (`Quote.cold`). `host_memo`: the Host evaluations the quotes on these states share
    (`ranked_host.HostMemo`), when a shared `QuoteFacts` provides one."""

    __slots__ = ("state", "cache", "cold_read", "cold_source", "host_memo")

    def __init__(self, state: LedgerState | None, cache: CacheState, cold_source=None):
        self.state, self.cache = state, cache
        self.cold_read = None
        self.cold_source = cold_source
        self.host_memo = None

    @property
    def cold(self) -> frozenset:
        """HEAT-4: reuse-tier owners beyond the soft target: normal for this quote (computed once,
        only when a reuse-tier owner is met; `Quote.cold` records whether it was)."""
        if self.cold_read is None:
            if self.cold_source is not None:
                self.cold_read = self.cold_source
            else:
                self.cold_read = beyond_target_reference(self.state, self.cache)
        return self.cold_read

    def record_cold_read(self) -> None:
        """Record the HEAT-4 read as a candidate of a reuse-tier owner would (`Quote.cold`): a quote
        through the victim index that did not meet one such candidate still records what the full
        enumeration would have read."""
        self.cold  # noqa: B018  (the property records the read)

    def fallback(self, c: Checkpoint, gone: frozenset) -> int:
        """RCL-5: the deepest surviving point that is an exact prefix of c (aliases deleted
        together are not each other's fallback)."""
        cache = self.cache
        fb, cps = cache.fallback, cache.checkpoints
        if indexed(c) and len(px.same(cache.index, c.identity)) > 1 \
                and any(a != c.cid and a not in gone for a in aliases(cache, c)):
            return c.frontier  # a surviving alias at the same position: nothing is lost
        f = fb.get(c.cid, 0)
        while f:  # the next deepest prefix: a surviving alias of f, else f's own fallback
            if f not in gone or any(a not in gone for a in aliases(cache, cps[f])):
                return cps[f].frontier
            f = fb.get(f, 0)
        return 0

    def tier(self, cids) -> tuple[int, int]:
        """RCL-3: a deletion touching hot content is REUSE tier; its demand time is the latest."""
        tier, demand = Tier.NORMAL, 0
        cps = self.cache.checkpoints
        for c in cids:
            h, t = self.hot(cps[c], cids)
            if h:
                tier = Tier.REUSE
            if t > demand:
                demand = t
        return tier, demand

    def loss(self, cids: frozenset) -> int:
        """RCL-5: lost coverage of a deleted group, nested points of one history counted once."""
        if len(cids) == 1:  # the common case, inline: a lone point with no alias
            (cid,) = cids
            cache = self.cache
            c = cache.checkpoints[cid]
            n = len(c.identity.tokens)
            if len(px.same(cache.index, c.identity)) > 1 or c.owner[0] not in ("rec", "shared"):
                return n - self.fallback(c, cids)
            f = cache.fallback.get(cid, 0)
            return n - (len(cache.checkpoints[f].identity.tokens) if f else 0)
        pts = sorted((self.cache.checkpoints[c] for c in cids), key=lambda c: -c.frontier)
        tops: list = []  # (top, intervals)
        for c in pts:
            iv = (self.fallback(c, cids), c.frontier)
            for t in tops:
                if c.identity.is_prefix_of(t[0].identity):
                    t[1].append(iv)
                    break
            else:
                tops.append((c, [iv]))
        total = 0
        for _, ivs in tops:
            ivs.sort()
            lo, hi = ivs[0]
            for a, b in ivs[1:]:
                if a > hi:
                    total += hi - lo
                    lo, hi = a, b
                else:
                    hi = max(hi, b)
            total += hi - lo
        return total

    def hot(self, c: Checkpoint, gone: frozenset) -> tuple[bool, int]:
        """RCL-3: is c hot content, and its owner's demand time."""
        kind, key = c.owner
        if kind == "shared":
            e = self.cache.shared.get(key)
            if e is None or e.tier != Tier.REUSE or c.owner in self.cold:
                return False, (e.demand_time if e else 0)
            return True, e.demand_time
        if kind != "rec":
            return False, 0
        r = self.cache.records.get(key)
        if r is None:
            return False, 0
        if r.tier != Tier.REUSE or c.owner in self.cold:
            return False, r.demand_time
        if c.frontier < r.proven_frontier:
            return False, r.demand_time  # too shallow to be the proven position
        for pid in r.points():  # a surviving earlier point of the owner still covering it
            if pid in gone or pid == c.cid:
                continue
            p = self.cache.checkpoints[pid]
            if r.proven_frontier <= p.frontier <= c.frontier and p.identity.is_prefix_of(c.identity):
                return False, r.demand_time
        return True, r.demand_time


def stored_tier_pricing(cache: CacheState) -> LossPricing:
    """The pricing the victim index keys its order with: the stored tier, no owner beyond the
    soft target (HEAT-4 is each quote's own)."""
    return LossPricing(None, cache, cold_source=frozenset())


def rank_key(a: Action, gap_amount: int):
    """RCL-4, RD-8: normal before reuse; normal by loss / useful freed amount (capped at the
    gap), ties older demand first; reuse by demand time, oldest first."""
    useful = min(a.frees, gap_amount) or 1
    # WAIT-2 / SCH-4: ordinary reclamation first; revocations last, the youngest first.
    if a.revokes:
        r0, r1 = 1, -min(a.revokes)
    else:
        r0 = r1 = 0
    if a.tier == Tier.NORMAL:
        return (r0, r1, 0, a.loss / useful, a.demand_time, a.kind != "drop_replica", a.cids, a.objects)
    return (r0, r1, 1, a.demand_time, 0, True, a.cids, a.objects)


def admissible(a: Action, ap: Applicant) -> bool:
    """RCL-10: the admission table (the cumulative budget is checked during selection)."""
    if a.kind == "drop_replica":
        return True  # HOST-1 / RCL-6: a safe duplicate, nothing recoverable is lost
    if ap.kind == ApplicantKind.NECESSARY or ap.kind == ApplicantKind.SNAPSHOT:
        return True  # RCL-8 / pause Snapshot: optional cache in order
    if ap.demand_time:  # own repeated demand: normal content, or reuse content older than it
        return a.tier == Tier.NORMAL or a.demand_time < ap.demand_time
    return a.tier <= ap.tier  # the owner's tier bounds what a cold capture may replace


def may_take_reuse(applicant: Applicant) -> bool:
    """RCL-10: may this applicant take reuse-tier content at all (necessary execution and pause
    snapshots in order; a write with its own demand, older content only; else by its tier)?"""
    if applicant.kind in (ApplicantKind.NECESSARY, ApplicantKind.SNAPSHOT) or applicant.demand_time:
        return True
    return Tier.REUSE <= applicant.tier


def reuse_demand_limit(applicant: Applicant):
    """RCL-10: a capture's or write-back's own demand time: only reuse content older than it may
    go (None: no such limit)."""
    if applicant.kind in (ApplicantKind.CAPTURE, ApplicantKind.WRITEBACK) and applicant.demand_time:
        return applicant.demand_time
    return None


def demotion_writeback(spec, c: Checkpoint, group, tier: int, applicant: Applicant, pricing: LossPricing) -> tuple:
    """The Host allocation a demotion of `group` needs, and the write-back applicant that quotes
    Host victims for it with the kept content's own rights (RCL-10, RCL-12)."""
    unit = spec.unit_bytes
    need = host.HostAllocation(unit * len(group), len(group)) if spec.kind == KV_PAGES else host.HostAllocation(unit)
    wb = Applicant(ApplicantKind.WRITEBACK, budget=pricing.loss(frozenset((c.cid,))),
                   demand_time=c.demand_time, tier=tier, demote=False)
    if applicant.kind in (ApplicantKind.CAPTURE, ApplicantKind.WRITEBACK):
        # RCL-12: Host victims must satisfy both the migration source's and the outer optional
        # write's rights, and the outer write's remaining budget.
        both = min(wb.demand_time, applicant.demand_time) if wb.demand_time and applicant.demand_time else 0
        budget = wb.budget if applicant.demand_time else min(wb.budget, applicant.budget)
        wb = wb._replace(budget=budget, demand_time=both, tier=min(wb.tier, applicant.tier))
    return need, wb


# -- HEAT-4 from first principles ----------------------------------------------------------------
def owner_footprint(state: LedgerState, cache: CacheState, owner: tuple) -> set:
    """The objects of a record's or shared entry's points."""
    kind, key = owner
    if kind == "rec":
        r = cache.records.get(key)
        cids = r.points() if r is not None else ()
    else:
        e = cache.shared.get(key)
        cids = (e.point,) if e is not None else ()
    out = set()
    for cid in cids:
        out.update(cache.checkpoints[cid].object_ids())
    return out


def beyond_target_reference(state: LedgerState, cache: CacheState) -> frozenset:
    """HEAT-4, RD-5 from first principles: the reuse-tier owners that fall outside the reuse
    segment. Owners are walked newest real demand first, each one's unique physical footprint
    billed per pool (an object shared with newer owners is billed once); the first owner that
    would push a pool past 3/4 of its capacity and every older one are beyond. The single newest
    owner may exceed the target. (`index_build.beyond_target` reads the same from the victim
    index's incrementally billed segment.)"""
    owners = [(r.demand_time, ("rec", r.rid)) for r in cache.records.values() if r.tier == Tier.REUSE]
    owners += [(e.demand_time, ("shared", e.sid)) for e in cache.shared.values() if e.tier == Tier.REUSE]
    if not owners:
        return frozenset()
    owners.sort(key=lambda x: (-x[0], x[1]))
    num, den = SOFT_TARGET
    targets = {pid: p.spec.capacity * num // den for pid, p in state.pools.items()}
    targets[HOST] = state.arena.capacity * num // den
    used = dict.fromkeys(targets, 0)
    billed: set = set()
    objects = state.objects
    for i, (_, owner) in enumerate(owners):
        add = dict.fromkeys(targets, 0)
        mine = owner_footprint(state, cache, owner)
        for oid in mine - billed:  # unique footprint, counted once
            o = objects.get(oid)
            if o is None:
                continue
            if o.device is not None:
                add[o.pool] += 1
            if o.host is not None:
                add[HOST] += o.host.nbytes
        if i > 0 and any(add[k] and used[k] + add[k] > targets[k] for k in targets):
            return frozenset(o for _, o in owners[i:])  # from here on, older owners leave the segment
        for k, n in add.items():
            used[k] += n
        billed |= mine
    return frozenset()
