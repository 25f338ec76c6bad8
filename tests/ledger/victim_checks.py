"""Checks of the incremental victim order (ledger/reclamation/index*.py) used by the cache property machines.

`order_matches_scratch`: the kept order and reuse footprint equal the ones ranked from first
principles. `quotes_agree`: quotes taken through the order equal `quote_reference` (the full
enumeration), each alone and every other one through one shared `quote_facts` (whose Host
memo then serves several applicants and protections in turn) — chosen actions, freed amount, loss, admission and the HEAT-4 owners recorded —
for a rotating set of gaps and applicants (state, Main KV, backend KV and Host gaps; necessary,
revoking, fresh, capture with and without own demand and budget, write-back, pause snapshot;
with and without the applicant's own source protected).
"""
from __future__ import annotations

import ledger as L
from ledger.reclamation import index_build, index_keys, index_sync, pricing

_APPLICANTS = [
    L.Applicant(L.ApplicantKind.NECESSARY),
    L.Applicant(L.ApplicantKind.NECESSARY, demote=False),
    L.Applicant(L.ApplicantKind.NECESSARY, revoke_waiters=True),
    L.Applicant(L.ApplicantKind.NECESSARY, revoke_waiters=True, fresh=True, ticket=20),
    L.Applicant(L.ApplicantKind.CAPTURE, budget=100),
    L.Applicant(L.ApplicantKind.CAPTURE, budget=1000, tier=L.Tier.REUSE),
    L.Applicant(L.ApplicantKind.CAPTURE, demand_time=3),
    L.Applicant(L.ApplicantKind.WRITEBACK, budget=300, demand_time=0, demote=False),
    L.Applicant(L.ApplicantKind.SNAPSHOT, ticket=2),
]
_AMOUNTS = (1, 2, 3, 6)
STATS = {"quotes": 0, "admitted": 0, "chosen": 0, "actions_compared": 0}


def order_matches_scratch(state, cache) -> None:
    vi = cache.victims
    if vi is None:  # a cache no Edit has touched yet (the first Edit builds the order)
        assert not cache.checkpoints and not cache.waiters, "an edited cache keeps its victim order"
        return
    kept = index_sync.sync(vi, state, cache)
    errs = index_build.compare(kept, index_build.build(state, cache))
    assert not errs, errs
    leads_match_scratch(kept, state, cache)
    assert index_build.beyond_target(kept, state)[0] == pricing.beyond_target_reference(state, cache)


def leads_match_scratch(vi, state, cache) -> None:
    """RCL-6: each demotion candidate's `lead` (kept across versions, carried as a lower bound
    through demotions) is the number of its pages, in walk order, before its first Device-only
    one, counted here from the objects themselves."""
    for (pool, cid) in vi.demotions.keys():
        c = cache.checkpoints[cid]
        if state.pool(pool).spec.kind != L.KV_PAGES:
            continue
        want = 0
        for oid in index_keys.pages_of(c, pool, L.KV_PAGES):
            o = state.objects[oid]
            if o.device is not None and o.host is None:
                break
            want += 1
        assert index_keys.lead(vi, c, pool) == want, \
            f"point {cid} in {pool}: lead {index_keys.lead(vi, c, pool)} != {want}"


def _cases(state, cache, n: int, start: int):
    pools = [p for p in (L.STATE_POOL, L.MAIN_KV, "backend_kv:mtp") if p in state.pools] + [L.HOST]
    cps = sorted(cache.checkpoints)
    for i in range(start, start + n):
        pool = pools[i % len(pools)]
        ap = _APPLICANTS[(i // len(pools)) % len(_APPLICANTS)]
        amount = _AMOUNTS[(i // 7) % len(_AMOUNTS)]
        if pool == L.HOST:
            amount *= 1024
        protect = ()
        if cps and (i // 3) % 2:
            protect = cache.checkpoints[cps[(i // 5) % len(cps)]].object_ids()
        yield L.Gap(pool, amount), ap, protect, i


def quotes_agree(state, cache, step: int, n: int = 6) -> None:
    """`step` (the machine's own step count) picks the cases, so a replayed run repeats them."""
    shared = L.quote_facts(state, cache)  # RCL-2: its Host memo serves every case below in turn
    for gap, ap, protect, i in _cases(state, cache, n, step * n):
        ref = L.quote_reference(state, cache, gap, ap, protect)
        what = f"gap {gap}, {ap}, protect {tuple(protect)[:4]}"
        if i % 2:
            again = shared.quote(gap, ap, protect)
            assert (again.chosen, again.admitted, again.freed, again.loss, again.cold) == \
                (ref.chosen, ref.admitted, ref.freed, ref.loss, ref.cold), f"{what}, shared facts"
        fast = L.quote(state, cache, gap, ap, protect)
        assert fast.chosen == ref.chosen, f"{what}: chosen {fast.chosen} != reference {ref.chosen}"
        assert (fast.admitted, fast.freed, fast.loss) == (ref.admitted, ref.freed, ref.loss), what
        assert fast.cold == ref.cold, f"{what}: cold {fast.cold} != reference {ref.cold}"
        if i % 5 == 0:  # the lazy full ranking is the reference's
            assert fast.actions == ref.actions, f"{what}: actions {fast.actions} != {ref.actions}"
            assert fast.excluded == ref.excluded, f"{what}: excluded {fast.excluded} != {ref.excluded}"
            STATS["actions_compared"] += 1
        STATS["quotes"] += 1
        STATS["admitted"] += ref.admitted
        STATS["chosen"] += len(ref.chosen)
