"""The persistent victim order (ledger/reclamation/index*.py) and quotes taken through it (RCL-1..12, RD-8, HEAT-4).

Every scenario checks the kept order against the one ranked from first principles
(`order_matches_scratch`) and the quotes against `quote_reference` (`quotes_agree`); the
random operation sequences of test_cache_properties.py do the same after every step. Here:
the persistent structures themselves, wide sharing (a system prompt's pages held by more than
`index.BIG` points), owners beyond the reuse segment's soft target, lazy validation (leases,
pins, active writers: the order is not touched, the quote skips them), what a new point re-keys,
that `check_cache` notices a corrupted order, shared quote facts, and Host gaps.
"""
from __future__ import annotations

import immutables
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cache_helpers import L, SavePoint, make, toks
from ledger import ptrie
from ledger.psorted import CHUNK, PSorted
from ledger.reclamation import (demotion_claims, index_batch, index_build, index_sync, pricing, ranked_device,
                                ranked_host)
from ledger.reclamation import index as V
from ledger.reclamation.index import walk_key
from victim_checks import order_matches_scratch, quotes_agree


# -- the persistent structures ----------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 600)), max_size=900))
def test_psorted_is_a_persistent_sorted_set(ops):
    model: set = set()
    s = PSorted(lambda c: min(x[0] % 7 for x in c))
    versions = [(s, frozenset())]
    for add, k in ops:
        if add:
            s = s.add((k,))
            model.add((k,))
        elif (k,) in model:
            s = s.remove((k,))
            model.discard((k,))
        versions.append((s, frozenset(model)))
    for v, m in versions[:: max(1, len(versions) // 20)]:  # old versions stay valid
        assert list(v) == sorted(m) and len(v) == len(m)
    assert all(1 <= len(c) <= 2 * CHUNK for c in s.chunks)
    assert all(agg == min(x[0] % 7 for x in c) for agg, c in s.chunk_view())
    # a chunk filter skips whole chunks, never an item of a kept chunk
    kept = list(s.scan(lambda agg: agg == 0))
    assert all(any(x in c for c in s.chunks if min(y[0] % 7 for y in c) == 0) for x in kept)
    assert list(s.scan(start=(300,))) == [x for x in sorted(model) if x >= (300,)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5000), st.one_of(st.none(), st.integers(0, 3))), max_size=300),
       st.lists(st.tuples(st.integers(0, 70000), st.one_of(st.none(), st.integers(0, 3))), max_size=60))
def test_ptrie_diff_names_exactly_the_changed_keys(first, second):
    def apply(t, m, ops):
        for k, v in ops:
            t = ptrie.set_(t, k, v)
            if v is None:
                m.pop(k, None)
            else:
                m[k] = v
        return t, m

    a, ma = apply(ptrie.EMPTY, {}, first)
    b, mb = apply(a, dict(ma), second)
    assert dict(a.items()) == ma and dict(b.items()) == mb and len(b) == len(mb)
    want = {k: (ma.get(k), mb.get(k)) for k in set(ma) | set(mb) if ma.get(k) != mb.get(k)}
    assert {k: (x, y) for k, x, y in ptrie.diff(a, b)} == want
    assert all(b.get(k) == v for k, v in mb.items())


def test_walk_key_is_creation_order_so_a_cleared_cache_walks_like_a_fresh_one():
    """The demotion walk (RCL-6: a page several points hold joins the first one's group) is the
    points' creation order: the same histories cached after a clear, with later ids, give the
    same demotion groups, in the incremental order and in the reference alike."""
    keys = [1, 2, 31, 32, 33, 64, 1000, 1023, 1024, 99999, 3 << 20, (1 << 31) + 5]
    assert sorted(keys, key=walk_key) == sorted(keys)
    groups = []
    for rounds in (1, 2):
        sim = make(main=256, slots=64, host=1 << 20)
        for r in range(rounds):
            if r:
                sim.apply(L.plan_clear(sim.state, sim.cache))
            _prompt_family(sim, 10)
        shift = min(sim.cache.checkpoints)
        q = L.quote(sim.state, sim.cache, L.Gap(L.MAIN_KV, 3), L.Applicant(L.ApplicantKind.NECESSARY))
        r_ = L.quote_reference(sim.state, sim.cache, L.Gap(L.MAIN_KV, 3), L.Applicant(L.ApplicantKind.NECESSARY))
        assert q.chosen == r_.chosen
        groups.append([(a.kind, tuple(c - shift for c in a.cids), len(a.objects)) for a in q.chosen])
    assert groups[0] == groups[1], groups


# -- scenarios ----------------------------------------------------------------------------------
SYSTEM = toks(128, base=5000)


def _prompt_family(sim, n: int, base: int = 0):
    """n requests over one system prompt (a shared marker at its end, SH-1), each forking its
    pages (BIND-4) and publishing E (and an input point) over its own tail."""
    for i in range(n):
        t = SYSTEM + [(base + i) * 7 % 900 + 1 for _ in range(1)] + toks(40, base=10_000 + 100 * (base + i))
        sim.run(f"f{base}-{i}", t, [SavePoint(128, L.PointKind.SHARED), SavePoint(len(t))], output=(1, 2))


def _check(sim, step: int, n: int = 12):
    order_matches_scratch(sim.state, sim.cache)
    quotes_agree(sim.state, sim.cache, step, n)


def test_wide_sharing_keeps_a_bound_and_quotes_match_reference():
    sim = make(main=256, slots=64, host=1 << 16)
    _prompt_family(sim, 14)
    vi = sim.cache.victims
    wide = [hs for p in vi.wide_groups.values() for hs in p]
    assert wide, "the system prompt's pages are held by more than BIG points"
    g = vi.groups[(L.MAIN_KV, wide[0])]
    item = g.items[0][1]
    assert g.items[0][0] == (V.NORMAL, V.WIDE) and item[3] == V.INF
    assert item[0] == sum(vi.point_loss[c] for c in item[2]) > 0  # the bound: its points' own losses
    for step in range(8):
        _check(sim, step)
    used = sim.state.pool(L.MAIN_KV).spec.capacity - len(sim.state.pools[L.MAIN_KV].free)
    deep = 0
    for amount in (10, used // 2, used):  # deep enough to reach (and evaluate) the wide groups
        for ap in (L.Applicant(L.ApplicantKind.NECESSARY), L.Applicant(L.ApplicantKind.NECESSARY, demote=False)):
            q = L.quote(sim.state, sim.cache, L.Gap(L.MAIN_KV, amount), ap)
            r = L.quote_reference(sim.state, sim.cache, L.Gap(L.MAIN_KV, amount), ap)
            assert (q.chosen, q.admitted, q.freed, q.loss) == (r.chosen, r.admitted, r.freed, r.loss)
            deep += any(len(a.cids) > V.BIG for a in r.chosen)
    assert deep, "a wide group was chosen, through its bound"
    # under pressure the order keeps agreeing while points come and go
    tight = make(main=40, slots=10, host=1 << 14)
    for i in range(6):
        _prompt_family(tight, 3, base=10 * i)
        _check(tight, i)


def _adopted_owners(sim, n: int, length: int = 100):
    """n histories, each adopted once by a follow-up request (HEAT-1: reuse tier, demand now)."""
    for i in range(n):
        t = toks(length, base=1000 * (i + 1))
        sim.run(f"a{i}", t, [SavePoint(length)], output=(1, 2, 3))
        sim.run(f"b{i}", t + [1, 2, 9, 9], [SavePoint(length + 4)], output=(4,))


def test_owners_beyond_the_soft_target_rank_as_normal_and_are_recorded():
    sim = make(main=40, slots=40, host=0)
    _adopted_owners(sim, 8, 190)  # 8 owners of 4 pages each: past 3/4 of 40 pages
    reuse = [r for r in sim.cache.records.values() if r.tier == L.Tier.REUSE]
    assert len(reuse) >= 4
    cold = pricing.beyond_target_reference(sim.state, sim.cache)
    assert cold, "the reuse segment's footprint passed 3/4 of Main KV (HEAT-4)"
    assert index_build.beyond_target(sim.cache.victims, sim.state)[0] == cold
    ap = L.Applicant(L.ApplicantKind.NECESSARY)
    q = L.quote(sim.state, sim.cache, L.Gap(L.MAIN_KV, 3), ap)
    ref = L.quote_reference(sim.state, sim.cache, L.Gap(L.MAIN_KV, 3), ap)
    assert q.chosen == ref.chosen and q.cold == ref.cold == cold
    sim.apply(L.plan_reclaim(sim.state, sim.cache, q))  # RD-4: the tier demotions are recorded
    for owner in cold:
        kind, key = owner
        ent = sim.cache.records.get(key) if kind == "rec" else sim.cache.shared.get(key)
        assert ent is None or ent.tier == L.Tier.NORMAL
    assert not (set(sim.cache.victims.segment.owners.keys()) & cold)  # left the kept segment
    sim.drive_transaction()
    for step in range(6):
        _check(sim, step)


def test_leases_pins_and_writers_are_checked_when_taken_not_rekeyed():
    sim = make(main=64, slots=12, host=0)
    for i in range(6):
        sim.run(f"r{i}", toks(150, base=1000 * (i + 1)), [SavePoint(100)], output=(1, 2))
    gap, ap = L.Gap(L.STATE_POOL, 1), L.Applicant(L.ApplicantKind.NECESSARY, demote=False)
    first = L.quote(sim.state, sim.cache, gap, ap)
    (victim,) = first.chosen[0].objects
    before = sim.cache.victims
    sim.apply(L.plan_pin(sim.state, [victim], "pinner"))
    assert sim.cache.victims is before  # a pin is the ledger's: the order is not touched
    q = L.quote(sim.state, sim.cache, gap, ap)
    assert victim not in {o for a in q.chosen for o in a.objects}  # skipped when taken
    assert q.chosen == L.quote_reference(sim.state, sim.cache, gap, ap).chosen
    sim.apply(L.plan_unpin(sim.state, [victim], "pinner"))
    lease = L.plan_lease(sim.state, [victim], L.DEVICE, "reader")
    sim.apply(lease)
    assert L.quote(sim.state, sim.cache, gap, ap).chosen == L.quote_reference(sim.state, sim.cache, gap, ap).chosen
    assert victim not in {o for a in L.quote(sim.state, sim.cache, gap, ap).chosen for o in a.objects}
    sim.apply(L.plan_release_leases(sim.state, [lease.proof.leases[0]], "reader"))
    assert L.quote(sim.state, sim.cache, gap, ap).chosen == first.chosen
    kv = L.Gap(L.MAIN_KV, 1)
    page = L.quote(sim.state, sim.cache, kv, ap).chosen[0].objects[0]
    sim.apply(L.plan_add_holders(sim.state, [page], L.seq_holder("writer")))  # an active writer shares it
    assert sim.cache.victims is before
    q = L.quote(sim.state, sim.cache, kv, ap)
    assert page not in {o for a in q.chosen for o in a.objects}
    assert q.chosen == L.quote_reference(sim.state, sim.cache, kv, ap).chosen
    sim.apply(L.plan_drop_holders(sim.state, [page], L.seq_holder("writer")))
    assert page in L.quote(sim.state, sim.cache, kv, ap).chosen[0].objects


def test_a_new_point_rekeys_only_the_points_whose_fallback_moves():
    from ninfer_jax.bench import ledger_bench as B
    from ledger.reclamation.edit import Edit

    s, c, tokens = B._scale_state(600, 0)
    before = c.victims
    # a new point between a record's input point (160) and its E (192): E now falls back on it
    e_cid = next(r.end for r in c.records.values() if r.input_point is not None)
    e_pt = c.checkpoints[e_cid]
    e = Edit(s, c)
    cid = e.new_id()
    st = e.add(L.plan_allocate(e.state, L.STATE_POOL, 1, L.ckpt_holder(cid))).proof.allocated[0][0]
    pages = e_pt.kv[0][1]
    e.add(L.plan_add_holders(e.state, pages, L.ckpt_holder(cid)))
    rid = e_pt.owner[1]
    e.put_point(L.Checkpoint(cid, ("rec", rid), L.PointKind.ANCHOR, e_pt.identity.prefix(176), st,
                             ((L.MAIN_KV, pages),), 0), hold=False)
    e.put_record(e.cache.records[rid]._replace(anchors=(cid,)))
    res = e.finish("test")
    after = res.cache.victims
    assert res.cache.fallback[e_cid] == cid  # E's surviving fallback moved
    changed = {k for k in set(before.groups.keys()) | set(after.groups.keys())
               if before.groups.get(k) != after.groups.get(k)}
    touched = {cid, e_cid} | set(c.records[rid].points())
    assert changed and all(any(h[1] in touched for h in hs if h[0] == "ckpt") for _, hs in changed)
    assert len(changed) <= 6 < len(after.groups) // 50  # a handful re-keyed out of hundreds
    order_matches_scratch(res.plan.result, res.cache)
    quotes_agree(res.plan.result, res.cache, 0, 12)


def test_check_cache_notices_a_corrupted_order_or_footprint():
    sim = make(main=64, slots=12, host=1 << 15)
    _adopted_owners(sim, 3)
    vi = sim.cache.victims
    L.check_cache(sim.state, sim.cache)
    corrupted = 0
    for pool, po in vi.orders.items():
        for name in ("reuse", "demote_normal", "demote_reuse"):
            order = getattr(po, name)
            if len(order):  # one entry lost from a stored order
                bad = vi._replace(orders=vi.orders.set(pool, po._replace(**{name: order.remove(order.first())})))
                with pytest.raises(L.IntegrityError, match="victim order"):
                    L.check_cache(sim.state, sim.cache._replace(victims=bad))
                corrupted += 1
        for bucket, order in po.normal.items():
            bad = vi._replace(orders=vi.orders.set(pool, po._replace(
                normal=po.normal.set(bucket, order.remove(order.first())))))
            with pytest.raises(L.IntegrityError, match="victim order"):
                L.check_cache(sim.state, sim.cache._replace(victims=bad))
            corrupted += 1
    assert corrupted >= 3
    owner, item = next(iter(vi.segment.owners.items()))
    heat = vi.segment._replace(owners=vi.segment.owners.set(owner, item[:2] + (tuple(x + 1 for x in item[2]),)))
    with pytest.raises(L.IntegrityError, match="reuse segment"):
        L.check_cache(sim.state, sim.cache._replace(victims=vi._replace(segment=heat)))


def test_shared_quote_facts_give_the_same_quotes():
    sim = make(main=48, slots=10, host=1 << 14)
    _adopted_owners(sim, 4)
    f = L.quote_facts(sim.state, sim.cache)
    assert f.valid_for(sim.state, sim.cache)
    for pool in (L.STATE_POOL, L.MAIN_KV):
        for ap in (L.Applicant(L.ApplicantKind.NECESSARY), L.Applicant(L.ApplicantKind.NECESSARY, revoke_waiters=True),
                   L.Applicant(L.ApplicantKind.CAPTURE, budget=50)):
            for amount in (1, 3):
                a = f.quote(L.Gap(pool, amount), ap)
                b = L.quote(sim.state, sim.cache, L.Gap(pool, amount), ap)
                assert (a.chosen, a.admitted, a.loss, a.cold) == (b.chosen, b.admitted, b.loss, b.cold)
    q = f.quote(L.Gap(L.STATE_POOL, 1), L.Applicant(L.ApplicantKind.NECESSARY))
    sim.apply(L.plan_reclaim(sim.state, sim.cache, q))
    assert not f.valid_for(sim.state, sim.cache)


def test_host_gap_with_a_full_arena_matches_reference():
    from ninfer_jax.bench import ledger_bench as B

    s, c, _ = B._scale_state(400, 1)
    slot = s.pool(L.STATE_POOL).spec.unit_bytes
    shared = L.quote_facts(s, c)  # RCL-2: one Host memo for every quote below
    points = sorted(c.checkpoints)
    for extra in (1, 2, 5):
        need = tuple(L.HostAllocation(slot) for _ in range(s.arena.free_bytes // slot + extra))
        for ap in (L.Applicant(L.ApplicantKind.NECESSARY), L.Applicant(L.ApplicantKind.CAPTURE, budget=40),
                   L.Applicant(L.ApplicantKind.CAPTURE, budget=1),
                   L.Applicant(L.ApplicantKind.WRITEBACK, budget=500, demand_time=0)):
            gap = L.Gap(L.HOST, slot * len(need), need)
            for protect in ((), c.checkpoints[points[extra * 7]].object_ids()):
                q, r = L.quote(s, c, gap, ap, protect), L.quote_reference(s, c, gap, ap, protect)
                m = shared.quote(gap, ap, protect)
                assert (q.chosen, q.admitted, q.freed, q.cold) == (r.chosen, r.admitted, r.freed, r.cold)
                assert (m.chosen, m.admitted, m.freed, m.loss, m.cold) == (r.chosen, r.admitted, r.freed, r.loss, r.cold)
    assert shared.host_memo.duplicates and shared.host_memo.fits, "its Host holds duplicates, listed and tested once"
    order_matches_scratch(s, c)
    quotes_agree(s, c, 3, 16)


def test_a_protected_widely_shared_page_makes_no_point_a_demotion_candidate(monkeypatch):
    """RCL-6 at scale: once each history's own pages are on Host, the only Device-only page
    most points list is the system prompt's, which every point shares and a request continuing
    that prompt protects. A quote for that request must not evaluate a demotion group per
    point (each comes out empty): the wide page counts in a separate reach that the quote reads
    only when such a page may move for its applicant. Chosen actions equal the reference."""
    sim = make(main=256, slots=64, host=1 << 20)
    _prompt_family(sim, 14)
    # demote every history's own pages (State first, as RD-8 orders it), keeping the shared point
    shared = next(c for c in sim.cache.checkpoints.values() if c.kind == L.PointKind.SHARED)
    for _ in range(40):
        q = L.quote(sim.state, sim.cache, L.Gap(L.MAIN_KV, 1), L.Applicant(L.ApplicantKind.NECESSARY),
                    shared.object_ids())
        if not q.admitted or not any(a.kind == "demote" for a in q.chosen):
            break
        sim.apply(L.plan_reclaim(sim.state, sim.cache, q))
        sim.drive_transaction()
    _check(sim, 0)
    vi = index_sync.sync(sim.cache.victims, sim.state, sim.cache)
    assert vi.wide_objects, "the system prompt's pages are listed by more than BIG points"
    listers = max(len(vi.listers[o]) for o in vi.wide_objects)
    assert listers > V.BIG
    tries = []
    real = demotion_claims.DemotionClaims.claim
    monkeypatch.setattr(demotion_claims.DemotionClaims, "claim", lambda self, cid: tries.append(cid) or real(self, cid))
    for amount in (1, 2):
        for ap in (L.Applicant(L.ApplicantKind.NECESSARY), L.Applicant(L.ApplicantKind.CAPTURE, budget=1000)):
            tries.clear()
            gap = L.Gap(L.MAIN_KV, amount)
            q = L.quote(sim.state, sim.cache, gap, ap, shared.object_ids())
            evaluated = len(tries)
            r = L.quote_reference(sim.state, sim.cache, gap, ap, shared.object_ids())
            assert (q.chosen, q.admitted, q.freed, q.loss) == (r.chosen, r.admitted, r.freed, r.loss)
            assert evaluated < listers // 2, f"{evaluated} demotion groups evaluated for {listers} listing points"
    # unprotected, the shared page may move again: the fast quote still agrees with the reference
    for amount in (1, 2, 3):
        q = L.quote(sim.state, sim.cache, L.Gap(L.MAIN_KV, amount), L.Applicant(L.ApplicantKind.NECESSARY))
        r = L.quote_reference(sim.state, sim.cache, L.Gap(L.MAIN_KV, amount), L.Applicant(L.ApplicantKind.NECESSARY))
        assert (q.chosen, q.admitted, q.freed, q.loss) == (r.chosen, r.admitted, r.freed, r.loss)


def _families():
    """Wide sharing (a system prompt's pages listed by more than BIG points) and a tight cache
    (Host demotions: duplicates and Host-only pages) with points coming and going."""
    wide = make(main=256, slots=64, host=1 << 16)
    _prompt_family(wide, 14)
    tight = make(main=40, slots=10, host=1 << 14)
    for i in range(5):
        _prompt_family(tight, 3, base=10 * i)
        t = SYSTEM + toks(700, base=20_000 + i)  # a long context: a run of 13 pages
        tight.run(f"long-{i}", t, [SavePoint(128, L.PointKind.SHARED), SavePoint(len(t))], output=(1, 2))
    return wide, tight


def test_a_run_of_one_holder_change_equals_the_changes_one_by_one(monkeypatch):
    # issue 15: `hold_run` moves a context's pages between two holder-set groups at once; the
    # index it keeps must be exactly the one `hold`, page by page, keeps
    runs = []
    real = index_batch.IndexBatch.hold_run

    def counted(self, oids, holder, sign, pools):
        runs.append(len(oids))
        return real(self, oids, holder, sign, pools)

    monkeypatch.setattr(index_batch.IndexBatch, "hold_run", counted)
    batched = _families()
    assert max(runs) > 10 and len(runs) > 50
    monkeypatch.setattr(index_batch.IndexBatch, "hold_run",
                        lambda self, oids, h, s, pools: [self.hold(o, h, s, pools.get(o)) for o in oids])
    single = _families()
    for b, s in zip(batched, single):
        assert b.state.objects == s.state.objects
        got, want = (index_sync.sync(b.cache.victims, b.state, b.cache),
                     index_sync.sync(s.cache.victims, s.state, s.cache))
        assert not index_build.compare(got, want), index_build.compare(got, want)
        assert (got.listers, got.wide_objects, got.holder_sets, got.demotions, got.host_only) == (
            want.listers, want.wide_objects, want.holder_sets, want.demotions, want.host_only)
        assert any(len(w) > V.BIG for w in got.listers.values()) or b is single[1]
        order_matches_scratch(b.state, b.cache)


def test_host_quotes_on_one_state_share_their_evaluations_and_match_reference(monkeypatch):
    """RCL-2, HOST-1/2, RCL-11: the Host quotes asked on one (state, cache) pair — a Device
    quote's pending demotions, a capture's Host gap, the revoking re-quote — evaluate each Host
    entry once (the QuoteFacts' Host memo), whatever the applicant and its protections; a
    budgeted applicant does not evaluate entries whose loss bound reaches its budget. Each
    quote equals the reference's, chosen actions, loss and HEAT-4 reads included."""
    sim = make(main=40, slots=10, host=1 << 15)
    for i in range(8):
        _prompt_family(sim, 3, base=10 * i)
    state, cache = sim.state, sim.cache
    shared = L.quote_facts(state, cache)
    hord = list(shared.index.host_order)
    assert len(hord) >= 4 and state.arena.free_bytes < state.pool(L.STATE_POOL).spec.unit_bytes, \
        "the arena is full and holds Host-only entries"
    evaluated = []
    real = ranked_host.HostRanked.candidates
    monkeypatch.setattr(ranked_host.HostRanked, "candidates",
                        lambda self, sets: evaluated.append(sets) or real(self, sets))
    slot, page = (state.pool(p).spec.unit_bytes for p in (L.STATE_POOL, L.MAIN_KV))
    host_only = [o for o in state.objects.values()
                 if o.host is not None and o.host.complete and not (o.device is not None and o.device.complete)]
    gaps = [L.Gap(L.HOST, slot, (L.HostAllocation(slot),)), L.Gap(L.HOST, 3 * page, (L.HostAllocation(3 * page, 3),)),
            L.Gap(L.HOST, 2 * slot)]
    applicants = [L.Applicant(L.ApplicantKind.NECESSARY), L.Applicant(L.ApplicantKind.WRITEBACK, demand_time=5),
                  L.Applicant(L.ApplicantKind.CAPTURE, budget=hord[0][1] + 1),
                  L.Applicant(L.ApplicantKind.CAPTURE, budget=1), L.Applicant(L.ApplicantKind.SNAPSHOT, ticket=1)]
    protects = [(), (host_only[0].object_id,), sim.cache.checkpoints[hord[-1][3][0]].object_ids()]
    first = None
    for gap in gaps:
        for ap in applicants:
            for protect in protects:
                r = L.quote_reference(state, cache, gap, ap, protect)
                evaluated.clear()
                m = shared.quote(gap, ap, protect)
                assert (m.chosen, m.admitted, m.freed, m.loss, m.cold) == (r.chosen, r.admitted, r.freed, r.loss,
                                                                           r.cold), (gap, ap, protect)
                if ap.budget == 1 and ap.kind == L.ApplicantKind.CAPTURE:
                    # every entry loses at least one token of coverage: none is evaluated
                    assert all(item[1] >= 1 for item in hord) and not evaluated
                if first is None and evaluated:
                    first = (gap, ap, protect, len(evaluated))
    assert first is not None and shared.host_memo.exact, "Host entries were evaluated through the memo"
    gap, ap, protect, n = first
    evaluated.clear()
    again = shared.quote(gap, ap._replace(ticket=9), protect)  # a new applicant: a new quote, the same entries
    assert again.chosen == L.quote_reference(state, cache, gap, ap._replace(ticket=9), protect).chosen
    assert len(evaluated) < n, "the second quote on the same states reads the memo"


def test_rcl5_a_demotion_needing_host_victims_is_quoted_on_the_host_only_when_the_merge_reaches_it(monkeypatch):
    """RCL-5 with a full arena: the reference quotes the oldest few demotions' Host victims
    before ranking. The lazy walk fixes the same few but asks each one's Host quote only when
    the merge reaches its rank's lower bound (the Host victims lose at least nothing), so a
    selection that closes earlier asks fewer. Chosen actions equal the reference's either way."""
    sim = make(main=40, slots=10, host=1 << 15)
    for i in range(2):
        _prompt_family(sim, 3, base=10 * i)
    st = sim.state
    room, copies = st.arena.free_bytes, []
    for o in sorted((o for o in st.objects.values() if o.host is None and o.device is not None and o.holders),
                    key=lambda o: (-o.device.nbytes, o.object_id)):
        if o.device.nbytes <= room:
            copies.append(o.object_id)
            room -= o.device.nbytes
    sim.state = L.commit(sim.state, L.plan_begin_transfer(sim.state, L.TransferRequest(
        L.TxnKind.DEMOTION, "fill", copies, L.HOST_MEDIUM)))  # Device replicas kept: the arena fills
    sim.drive_transaction()
    state, cache = sim.state, sim.cache
    assert state.arena.free_bytes == 0
    asked = []
    real = ranked_host.host_quote
    monkeypatch.setattr(ranked_host, "host_quote", lambda *a: asked.append(a[4]) or real(*a))
    vi = index_sync.sync(cache.victims, state, cache)
    seen_fewer = False
    for amount in (1, 2, 3, 6):
        for ap in (L.Applicant(L.ApplicantKind.NECESSARY), L.Applicant(L.ApplicantKind.CAPTURE, budget=1000)):
            gap = L.Gap(L.MAIN_KV, amount)
            sel = ranked_device.DeviceRanked(state, cache, vi, gap, ap, frozenset(), frozenset(),
                                             pricing.LossPricing(state, cache), frozenset())
            sel.demotions.prepare_pending()
            few = len(sel.demotions.unquoted)
            asked.clear()
            q = L.quote(state, cache, gap, ap)
            r = L.quote_reference(state, cache, gap, ap)
            assert (q.chosen, q.admitted, q.freed, q.loss) == (r.chosen, r.admitted, r.freed, r.loss), (amount, ap)
            assert len(asked) <= few
            if amount == 1 and ap.kind == L.ApplicantKind.NECESSARY:
                assert few >= 4 and any(a.kind == "demote" and a.host_victims for a in q.chosen)
                seen_fewer = len(asked) < few
    assert seen_fewer, "the selection closed before every pending demotion was quoted on the Host"
    order_matches_scratch(state, cache)
