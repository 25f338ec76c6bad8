"""Reclamation quotes, the public entry points (RCL-1..12, HOST-1..3, WAIT-2, RD-8). `quote(state,
cache, gap, applicant)` is read-only (RCL-2): from the real holders of the objects in the scarce
pool (RCL-1) it finds the physical actions — delete a group of checkpoints, drop a duplicate
replica, demote content to Host (RD-4) — each with what it frees, its recovery loss against the
surviving fallback (RCL-5) and its tier (RCL-3), keeps those this applicant may take
(RCL-8/10/11, WAIT-2), ranks them (RCL-4, RD-8; HOST-2 for the arena) and selects a set that
closes the gap, or admits nothing. It reads the cache's victim index (ranked_device.py,
ranked_host.py): the selection `quote_reference` makes by full enumeration, in O(k log n) for k
picks. `quote_facts` shares one decision's facts (`QuoteFacts`) between its quotes (RCL-2).
"""
from __future__ import annotations

from ledger.cache_state import CacheState
from ledger.reclamation import ranked_host
from ledger.reclamation.candidates import holders_ok
from ledger.reclamation.index_build import beyond_target
from ledger.reclamation.index_keys import owner_status
from ledger.reclamation.index_sync import sync
from ledger.reclamation.pricing import LossPricing
from ledger.reclamation.ranked_device import DeviceRanked, classify, device_quote
from ledger.reclamation.reference import LazyRanking, quote_reference
from ledger.reclamation.terms import Applicant, Gap, Quote, check_quote_args
from ledger.state import HOST, LedgerState


class QuoteFacts:
    """RCL-2: the facts one synchronous decision shares between its quotes — the victim order
    brought to the ledger's replicas, the HEAT-4 owners beyond the soft target — computed once
    for one (state, cache) pair and reused by every quote on it: one per scarce pool, the
    revoking re-quote (WAIT-2), a capture's State then Host gaps. Void once either changes
    (`valid_for`); permissions stay per applicant. `host_memo`: the Host evaluations its quotes
    share (`ranked_host.HostMemo`)."""

    __slots__ = ("state", "cache", "index", "_cold", "host_memo")

    def __init__(self, state, cache):
        self.state, self.cache = state, cache
        self.index = sync(cache.victims, state, cache) if cache.victims is not None else None
        self._cold = None
        self.host_memo = ranked_host.HostMemo()

    def valid_for(self, state, cache) -> bool:
        return state is self.state and cache is self.cache

    @property
    def cold(self) -> frozenset:
        """HEAT-4: the reuse-tier owners beyond the soft target, read from the index's segment."""
        if self._cold is None:
            vi = self.index
            self._cold = beyond_target(vi, self.state)[0] if vi is not None and vi.segment.newest_first.size \
                else frozenset()
        return self._cold

    def quote(self, gap: Gap, applicant: Applicant, protect=(), keep_content=()) -> Quote:
        """`ledger.quote(state, cache, gap, applicant, protect, keep_content)` on these facts."""
        check_quote_args(self.state, gap, applicant)
        if self.index is None:
            return quote_reference(self.state, self.cache, gap, applicant, protect, keep_content)
        return quote_through_index(self.state, self.cache, gap, applicant, frozenset(protect), frozenset(keep_content),
                                   self)


def quote(state: LedgerState, cache: CacheState, gap: Gap, applicant: Applicant, protect=(),
          keep_content=()) -> Quote:
    """A read-only reclamation quote for one typed gap (RCL-2): takes no reference or lease.

    `protect`: objects the applicant uses (its own source, RCL-8): never touched. `keep_content`:
    objects whose content must stay but whose duplicate Device (or Host) replica may go — the
    StateImage a Fork will read from Host (BIND-5).

    Taken through the cache's victim index: the same selection as `quote_reference`, in
    O(k log n) for k picks; `Quote.actions` (every admissible action, ranked) is enumerated only
    when read."""
    check_quote_args(state, gap, applicant)
    if cache.victims is None:
        return quote_reference(state, cache, gap, applicant, protect, keep_content)
    return quote_through_index(state, cache, gap, applicant, frozenset(protect), frozenset(keep_content))


def quote_facts(state: LedgerState, cache: CacheState) -> QuoteFacts:
    """Facts shared by several quotes on the same states (RCL-2): `f = quote_facts(state, cache)`,
    then `f.quote(gap, applicant, protect, keep_content)` per scarce pool and for the revoking
    re-quote; `f.valid_for(state, cache)` says whether they still apply. Each quote equals
    `quote(state, cache, ...)`."""
    return QuoteFacts(state, cache)


def gap_order(shortfall_pools) -> list:
    """RCL-4, RD-8: handle State first, then Main KV, then backend KV, then the Host arena."""
    def k(pool):
        return (pool == HOST, not pool.startswith("state"), pool != "main_kv", pool)
    return sorted(shortfall_pools, key=k)


def quote_through_index(state, cache, gap: Gap, applicant: Applicant, protect: frozenset, keep: frozenset,
                        shared: QuoteFacts | None = None) -> Quote:
    """The quote through the victim index, on shared facts (a fresh `QuoteFacts` when none)."""
    if shared is None:
        shared = QuoteFacts(state, cache)
    index, cold = shared.index, shared.cold
    pricing = LossPricing(state, cache, cold_source=cold)
    pricing.host_memo = shared.host_memo
    if gap.pool == HOST:
        q = ranked_host.host_quote(state, cache, index, gap, applicant, protect, keep, pricing)
        # the listing order of `actions` is the full walk's (an arena that fits lists them unranked)
        return q._replace(cold=pricing.cold_read or frozenset(),
                          ranking=LazyRanking(state, cache, gap, applicant, protect, keep))
    q = device_quote(state, cache, index, gap, applicant, protect, keep, pricing, cold)
    if not q.admitted and applicant.demote:
        q2 = device_quote(state, cache, index, gap, applicant._replace(demote=False), protect, keep, pricing, cold)
        if q2.admitted:
            q = q2._replace(applicant=applicant)
    if cold and pricing.cold_read is None and reference_reads_cold(state, cache, index, gap, applicant, protect, keep,
                                                                   pricing, cold):
        # the full enumeration would have met a reuse-tier owner (HEAT-4, recorded on commit)
        pricing.record_cold_read()
    return q._replace(cold=pricing.cold_read or frozenset())


def reference_reads_cold(state, cache, index, gap, applicant, protect, keep, pricing, cold) -> bool:
    """Would the full enumeration have ranked content of a reuse-tier owner (and so read the
    HEAT-4 segment that `Quote.cold` records)? Any candidate action with such an owner's point,
    or a Host victim quoted for a demotion (the reference quotes those before ranking)."""
    pool = gap.pool
    ranked = DeviceRanked(state, cache, index, gap, applicant, protect, keep, pricing, cold)
    if ranked.demote:
        ranked.demotions.prepare_pending()
        if pricing.cold_read is not None:
            return True
    wide = index.wide_groups.get(pool, ())
    for owner in index.segment.owners.keys():
        _, _, points = owner_status(cache, owner)
        for p in points:
            h = ("ckpt", p)
            for hs in list(index.groups_by_point.get((pool, p), ())) + [w for w in wide if h in w]:
                g = index.groups[(pool, hs)]
                if not g.special:
                    if ranked.valid_members(hs):
                        return True
                    continue
                for oid in g.members:
                    o = state.objects.get(oid)
                    if classify(o, pool, protect, keep) != "group":
                        continue
                    got = holders_ok(o, cache, applicant)
                    if got is not None and got[0]:
                        return True
            if ranked.demote and ranked.demotions.claims.group(p):
                return True
    return False
