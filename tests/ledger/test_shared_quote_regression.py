"""Regression: a Host quote through the victim index records the HEAT-4 read (`Quote.cold`) exactly
when the full enumeration would, also when the arena already fits and the lazy walk never starts.

The operation sequence below was found by `test_cache_random_operation_sequences`: a waiter
(ticket 21) alone holds a Host-only StateImage of a reuse-tier record's point, and some owner is
beyond the soft target. A fresh necessary applicant with ticket 20 may revoke that waiter
(WAIT-2), so `quote_reference` prices that applicant-dependent group and reads the owners beyond
the target; the quote through the index (shared or fresh `quote_facts`, and `quote`) must record
the same read (`ranked_host.HostRanked.record_cold`), since committing a quote demotes the tiers
it records (RD-4).
"""
from __future__ import annotations

import ledger as L
from test_cache_properties import CacheMachine

STEPS = [("whole_turn", dict(extra=1, p=0, shared=False)), ("whole_turn", dict(extra=1, p=1, shared=False)),
         ("wait", dict(extra=0, p=0, ticket=0))] + [("demand", dict(i=0))] * 5 + [
    ("whole_turn", dict(extra=1, p=1, shared=False)), ("whole_turn", dict(extra=1, p=0, shared=False)),
    ("begin_transfer", dict(i=0, n=1, to_host=False)), ("begin_transfer", dict(i=0, n=1, to_host=False)),
    ("wait", dict(extra=0, p=1, ticket=21))]

FRESH_REVOKER = L.Applicant(L.ApplicantKind.NECESSARY, revoke_waiters=True, fresh=True, ticket=20)


def _replayed():
    m = CacheMachine()
    m.configure(cfg=(16, 4, 2 * 1024 + 4096, 24))
    for name, kw in STEPS:
        getattr(m, name)(**kw)
        m.consistent()
    return m.sim.state, m.sim.cache


def _facts(q):
    return q.chosen, q.admitted, q.freed, q.loss, q.cold


def test_host_quote_records_cold_read_of_revocable_waiter_group():
    state, cache = _replayed()
    assert cache.victims is not None
    # the scenario is still the one found: a younger waiter, owners beyond the soft target
    assert any(w.ticket > FRESH_REVOKER.ticket and not w.paused for w in cache.waiters.values())
    assert L.quote_facts(state, cache).cold
    gap = L.Gap(L.HOST, 1024)
    protects = [()] + [cache.checkpoints[c].object_ids() for c in sorted(cache.checkpoints)]
    shared = L.quote_facts(state, cache)  # RCL-2: one Host memo serving every case in turn
    seen_cold = False
    for protect in protects:
        for ap in (FRESH_REVOKER, L.Applicant(L.ApplicantKind.NECESSARY),
                   L.Applicant(L.ApplicantKind.NECESSARY, revoke_waiters=True)):
            ref = L.quote_reference(state, cache, gap, ap, protect)
            seen_cold |= bool(ref.cold)
            what = f"{ap}, protect {tuple(protect)}"
            assert _facts(shared.quote(gap, ap, protect)) == _facts(ref), f"{what}, shared facts"
            assert _facts(L.quote_facts(state, cache).quote(gap, ap, protect)) == _facts(ref), f"{what}, fresh facts"
            assert _facts(L.quote(state, cache, gap, ap, protect)) == _facts(ref), f"{what}, quote"
    assert seen_cold, "the reference reads the owners beyond the soft target in this scenario"
