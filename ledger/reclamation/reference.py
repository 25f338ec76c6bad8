"""The reference quote: reclamation by full enumeration (RCL-1..12, HOST-1..3, WAIT-2, RD-8). Every
candidate object and every action (`candidates.enumerate_actions`, plus the Device->Host demotions
of RCL-5/6 with their Host victims fixed before sorting), the admissible ones (RCL-10) ranked in
one sort (RCL-4, RD-8; HOST-2 for the arena) and selected (selection.py, host_selection.py).
`quote_reference` is what the tests and the benchmark compare the victim index's quote with;
`LazyRanking` gives a quote through the index its full ranked action list when someone reads it.
"""
from __future__ import annotations

from ledger import extents as ex
from ledger.cache_state import CacheState, Tier
from ledger.reclamation.candidates import enumerate_actions, may_migrate
from ledger.reclamation.host_selection import select_host
from ledger.reclamation.index import walk_key
from ledger.reclamation.pricing import LossPricing, admissible, demotion_writeback, rank_key
from ledger.reclamation.selection import all_freed, freed_whole, removed_by, select_device
from ledger.reclamation.terms import (MAX_VICTIM_DEMOTIONS, Action, Applicant, Gap, Quote, Ranking,
                                      check_quote_args, refused)
from ledger.state import DEVICE, HOST, KV_PAGES, LedgerState


def quote_reference(state: LedgerState, cache: CacheState, gap: Gap, applicant: Applicant, protect=(),
                    keep_content=()) -> Quote:
    """`quote` by full enumeration: every candidate object, every action, one sort (RCL-1..12)."""
    check_quote_args(state, gap, applicant)
    pricing = LossPricing(state, cache)
    q = ranked_quote(state, cache, gap, applicant, frozenset(protect), pricing, frozenset(keep_content))
    if not q.admitted and applicant.demote and gap.pool != HOST:
        # The greedy selection can let cheap demotions block the deletion that alone closes
        # the gap (a chosen move excludes deleting a holder of what it moves, RCL-5/RCL-7):
        # before giving up, select again from deletions and duplicate drops only (RCL-1: the
        # action set is finite, and a complete admissible set must not be missed).
        q2 = ranked_quote(state, cache, gap, applicant._replace(demote=False), frozenset(protect), pricing,
                          frozenset(keep_content))
        if q2.admitted:
            q = q2._replace(applicant=applicant)
    return q._replace(cold=pricing.cold_read or frozenset())


def ranked_quote(state, cache, gap, applicant, protect, pricing: LossPricing, keep_content=frozenset()) -> Quote:
    """One selection over every admissible action of this gap, ranked in one sort."""
    actions, excluded = enumerate_actions(state, cache, gap, applicant, frozenset(protect), pricing, keep_content)
    if gap.pool != HOST and applicant.demote and state.transaction is None:
        actions.extend(reference_demotions(state, cache, gap, applicant, frozenset(protect), pricing))
    ok = []
    for a in actions:
        if admissible(a, applicant):
            ok.append(a)
        else:
            excluded += 1
    if gap.pool == HOST:
        return select_host(state, cache, gap, applicant, ok, excluded)
    ok.sort(key=lambda a: rank_key(a, gap.amount))
    chosen = select_device(state, cache, gap, applicant, ok)
    ranking = Ranking(tuple(ok), excluded)
    if chosen is None:
        return refused(gap, applicant, ranking, state, cache)
    freed = len({o for a in chosen for o in a.objects})
    return Quote(gap, applicant, ranking, tuple(chosen), freed, sum(a.loss for a in chosen), True, state, cache)


def reference_demotions(state, cache, gap, applicant, protect, pricing: LossPricing) -> list:
    """RCL-5/6: Device -> Host demotions of content with no Host replica yet. A KV demotion is a
    bounded page group of one checkpoint's pages (the deepest first), never State and KV
    together; its Host victims are fixed before sorting and its loss is theirs."""
    out, pending = [], []
    spec = state.pool(gap.pool).spec
    seen: set = set()
    want = gap.amount
    unit = spec.unit_bytes
    free_units = sum(length // unit for _, length in ex.iter_extents(state.arena.free))  # HOST-1 pre-check, once
    mover = applicant._replace(fresh=False)  # WAIT-2: moving a pause snapshot to Host revokes nothing
    for c in sorted(cache.checkpoints.values(), key=lambda c: walk_key(c.cid)):
        oids = [c.state] if spec.kind != KV_PAGES else [o for p, pages in c.kv if p == gap.pool for o in reversed(pages)]
        group = []
        for oid in oids:
            o = state.objects[oid]
            if oid in seen or oid in protect or o.pool != gap.pool or o.device is None or o.host is not None:
                continue
            if o.leases or o.pins or not all(may_migrate(h, cache, mover) for h in o.holders):
                continue  # active writers and readers limit movement (RCL-1); waiters allow it (WAIT-2)
            group.append(oid)
            if len(group) >= want:
                break
        if not group:
            continue
        seen.update(group)
        hot, demand = pricing.hot(c, frozenset())
        tier = Tier.REUSE if hot else Tier.NORMAL
        holders = frozenset(h for oid in group for h in state.objects[oid].holders)
        if free_units >= len(group):  # each page (or the StateImage block) places first-fit as is
            out.append(Action("demote", (c.cid,), tuple(group), len(group), (), 0, tier, demand, holders, (),
                              DEVICE, ()))
        else:
            pending.append((tier, demand, c, group, holders))
    # Demotions that need Host victims: those are fixed before sorting (RCL-5) by a Host quote
    # with the kept content's own rights (RCL-10 write-back, RCL-12); quoted for the oldest
    # few candidates only, which keeps the action set finite and the quote bounded.
    pending.sort(key=lambda x: (x[0], x[1], x[2].cid))
    for tier, demand, c, group, holders in pending[:MAX_VICTIM_DEMOTIONS]:
        need, wb = demotion_writeback(spec, c, group, tier, applicant, pricing)
        q = ranked_quote(state, cache, Gap(HOST, need.size, (need,)), wb, protect | set(group), pricing)
        if not q.admitted:
            continue
        victims = tuple(v._replace(objects=all_freed(state, cache, v)) for v in q.chosen)
        cids, waiters = removed_by(victims)
        if freed_whole(state, cache, group, cids, waiters):
            continue  # RCL-5/RCL-7: the victims together would free the very pages being demoted
        out.append(Action("demote", (c.cid,), tuple(group), len(group), (), q.loss, tier, demand, holders, (),
                          DEVICE, victims))
    return out


class LazyRanking:
    """The full ranked action list of a quote, enumerated only when someone reads it."""

    __slots__ = ("args", "_got")

    def __init__(self, *args):
        self.args = args
        self._got = None

    def _get(self) -> Ranking:
        if self._got is None:
            state, cache, gap, applicant, protect, keep = self.args
            q = ranked_quote(state, cache, gap, applicant, protect, LossPricing(state, cache), keep)
            self._got = q.ranking
        return self._got

    @property
    def actions(self) -> tuple:
        return self._get().actions

    @property
    def excluded(self) -> int:
        return self._get().excluded
