"""Waiting references (WAIT-1..4) and demand evidence / tiers (HEAT-1..4)."""
from __future__ import annotations

import ledger.reclamation.demand as ev
from ledger import prefix_index as px
from cache_helpers import L, capture, compute, end, make, points, served, start, toks

INPUT, END = L.PointKind.INPUT, L.PointKind.END


def _finished(sim, req, t, out=(7, 8), session=None):
    _, v = start(sim, req, t, session)
    v = compute(sim, v, t)
    capture(sim, v, INPUT)
    full = list(t) + list(out)
    v = compute(sim, v, full, len(full) - 1)
    end(sim, v)
    return full


def _wait(sim, req, tokens, ticket, frontier=None, paused=False):
    cands = served(sim, tokens, req=req)
    cand = [c for c in cands if frontier is None and c.cid is not None or c.frontier == frontier][0]
    sim.apply(L.plan_wait(sim.state, sim.cache, req, cand, ticket=ticket, paused=paused))
    return cand


def test_wait1_waiting_allocates_nothing_adds_no_heat_and_outlives_the_directory():
    sim = make()
    full = _finished(sim, "a", toks(150))
    pools = {p: len(x.free) for p, x in sim.state.pools.items()}
    summary, clock = sim.cache.summary, sim.cache.clock
    cand = _wait(sim, "w", toks(150) + [1], ticket=5, frontier=150)
    assert {p: len(x.free) for p, x in sim.state.pools.items()} == pools
    assert sim.cache.summary == summary and sim.cache.clock == clock
    inp = sim.cache.checkpoints[cand.cid]
    _, v = start(sim, "b", toks(150) + [9, 9])  # takes over and retires the points
    v = compute(sim, v, toks(150) + [9, 9])
    capture(sim, v, INPUT)
    assert inp.cid not in sim.cache.records[sim.cache.active["b"].rid].points()  # retired by its owner ...
    assert sim.cache.checkpoints[inp.cid].owner == ("wait", "w")  # ... kept intact for the waiter
    assert all(L.wait_holder("w") in sim.state.objects[o].holders for o in inp.object_ids())
    assert inp.cid not in {c for _, cids in px.entries(sim.cache.index) for c in cids}  # no new public entry
    assert all(c.cid != inp.cid for c in served(sim, toks(150) + [1], req="other"))


def test_wait3_a_waiter_whose_directory_was_replaced_branches_from_its_kept_point():
    sim = make()
    _finished(sim, "a", toks(150))
    cand = _wait(sim, "w", toks(150) + [1], ticket=5, frontier=150)
    _, v = start(sim, "b", toks(150) + [9, 9])  # the owner advanced: the point was retired
    v = compute(sim, v, toks(150) + [9, 9])
    capture(sim, v, INPUT)
    got = [c for c in served(sim, toks(150) + [1], req="w") if c.cid == cand.cid]
    assert got and got[0].rid is None  # an independent branch, never a takeover
    res = L.plan_bind(sim.state, sim.cache, L.BindRequest("w", got[0]))
    sim.apply(res)
    assert cand.cid not in sim.cache.checkpoints and "w" not in sim.cache.waiters
    assert sim.cache.active["w"].rid != sim.cache.active["b"].rid


def test_wait2_optional_writes_never_delete_waiter_points_necessary_work_revokes_younger_first():
    sim = make(slots=8)
    _finished(sim, "a", toks(150))
    _finished(sim, "b", toks(150, 4000))
    _wait(sim, "old", toks(150) + [1], ticket=1, frontier=150)
    _wait(sim, "young", toks(150, 4000) + [1], ticket=9, frontier=150)
    gap = L.Gap(L.STATE_POOL, 8)
    q = L.quote(sim.state, sim.cache, gap, L.Applicant(L.ApplicantKind.CAPTURE, budget=10 ** 6, tier=L.Tier.REUSE))
    assert not any(a.waiters for a in q.actions)
    q = L.quote(sim.state, sim.cache, L.Gap(L.STATE_POOL, 1),
                L.Applicant(L.ApplicantKind.NECESSARY, revoke_waiters=True, fresh=True, ticket=5))
    assert {w for a in q.actions for w in a.waiters} <= {"young"}  # fresh admission: younger only
    q = L.quote(sim.state, sim.cache, L.Gap(L.STATE_POOL, 1),
                L.Applicant(L.ApplicantKind.NECESSARY, revoke_waiters=True, ticket=0))
    revocable = [w.request for w in L.revocable_waiters(sim.cache, ticket=0, fresh=False)]
    assert revocable == ["young", "old"]


def test_wait2_waiting_protection_permits_migration():
    sim = make(main=8, slots=8)
    _finished(sim, "a", toks(300), out=(1,))
    _wait(sim, "w", toks(300) + [5], ticket=3, frontier=300)
    q = L.quote(sim.state, sim.cache, L.Gap(L.MAIN_KV, 2), L.Applicant(L.ApplicantKind.NECESSARY))
    assert q.admitted and all(a.kind == "demote" for a in q.chosen)
    sim.apply(L.plan_reclaim(sim.state, sim.cache, q))
    sim.drive_transaction()
    assert "w" in sim.cache.waiters


def test_wait3_own_waiting_reference_is_handed_over_at_bind_other_waiters_stay():
    sim = make()
    _finished(sim, "a", toks(150))
    cand = _wait(sim, "b", toks(150) + [1], ticket=2, frontier=150)
    _wait(sim, "c", toks(150) + [2], ticket=3, frontier=150)
    res = L.plan_bind(sim.state, sim.cache, L.BindRequest("b", cand))
    assert not set(res.plan.proof.freed) & set(sim.cache.checkpoints[cand.cid].object_ids())
    sim.apply(res)
    assert "b" not in sim.cache.waiters and "c" in sim.cache.waiters


def test_wait4_released_on_reselection_and_cancel():
    sim = make()
    _finished(sim, "a", toks(150))
    cand = _wait(sim, "w", toks(150) + [1], ticket=2, frontier=150)
    sim.apply(L.plan_release_wait(sim.state, sim.cache, "w"))
    assert "w" not in sim.cache.waiters
    assert not any(L.wait_holder("w") in o.holders for o in sim.state.objects.values())


def test_heat1_consume_resets_the_pair_fork_child_takes_it_completion_adds_nothing():
    sim = make()
    full = _finished(sim, "a", toks(150))
    (rec,) = sim.cache.records.values()
    assert rec.tier == L.Tier.NORMAL and rec.demand_time == 0  # completion and plain saves: no evidence
    _, v = start(sim, "b", full + [1])  # consume (takeover) by another request
    r = sim.cache.records[rec.rid]
    assert r.tier == L.Tier.REUSE and r.proven_frontier == len(full) - 1 and r.demand_time > 0
    _, v2 = start(sim, "c", toks(150) + [3])  # fork of the shallower input point while b runs
    child = sim.cache.records[sim.cache.active["c"].rid]
    assert child.proven_frontier == 150 and child.demand_time > r.demand_time
    assert sim.cache.records[rec.rid].proven_frontier == len(full) - 1  # the parent keeps its pair


def test_heat2_compute_demand_once_per_request_and_position_two_requests_make_repeated_demand():
    sim = make()
    t = toks(150)
    sim.run("a", t, [L.simulate.SavePoint(100, L.PointKind.SHARED)], output=())
    key = ev.position_key(L.identity_of(t).prefix(100))
    assert sim.cache.summary[key].demand_time == 0
    c = sim.cache
    c2 = ev.observe_prefill(c, "a", L.identity_of(t), 0, 150, [100])
    assert c2.summary[key].demand_time == 0 and c2.summary[key].requests == {"a"}  # the same request: no demand
    c3 = ev.observe_prefill(c, "b", L.identity_of(t), 0, 150, [100])
    assert c3.summary[key].demand_time > 0


def test_heat2_demand_summary_keeps_at_most_256_items_least_recent_dropped():
    c = L.empty_cache()
    ident = L.identity_of(toks(400))
    for i in range(300):
        c = ev.observe_prefill(c, i, ident, 0, 400, [i + 1])
    assert len(c.summary) == 256
    assert min(item.frontier for item in c.summary.values()) == 45


def test_heat3_queries_waits_and_own_snapshot_recovery_produce_no_observation():
    sim = make()
    _finished(sim, "a", toks(150))
    summary = sim.cache.summary
    served(sim, toks(150) + [1])
    _wait(sim, "w", toks(150) + [1], ticket=1, frontier=150)
    sim.apply(L.plan_release_wait(sim.state, sim.cache, "w"))
    _, v = start(sim, "b", toks(100, 8000))
    v = compute(sim, v, toks(100, 8000))
    sim.apply(L.plan_pause(sim.state, sim.cache, v, snapshot=True))
    snap = sim.cache.active["b"].snapshot
    (cand,) = L.query_sources(sim.state, sim.cache, L.SourceQuery("b", L.identity_of(toks(100, 8000)), snapshot=snap))
    sim.apply(L.plan_bind(sim.state, sim.cache, L.BindRequest("b", cand, resume=True)))
    assert sim.cache.summary == summary


def test_heat3_repeated_demand_promotes_the_owner_through_its_input_point():
    sim = make()
    t = toks(150)
    sim.cache = ev.observe_prefill(sim.cache, "x", L.identity_of(t), 0, 150, [150])
    sim.cache = ev.observe_prefill(sim.cache, "y", L.identity_of(t), 0, 150, [150])
    _, v = start(sim, "a", t)
    v = compute(sim, v, t)
    capture(sim, v, INPUT)
    r = sim.cache.records[sim.cache.active["a"].rid]
    assert r.tier == L.Tier.REUSE and r.proven_frontier == 150


def test_heat4_reuse_segment_keeps_three_quarters_of_a_pool_older_owners_demoted():
    sim = make(main=64, slots=8)
    for i in range(4):  # four reuse-tier owners of 2 state slots' worth each... 1 slot each
        t = toks(100, 1000 * (i + 1))
        full = _finished(sim, f"a{i}", t, out=(1,))
        _, v = start(sim, f"b{i}", full + [2])  # real adoption: reuse tier
        v = compute(sim, v, full + [2])
        end(sim, v)
    c = L.rebalance_tiers(sim.state, sim.cache)
    tiers = sorted((r.demand_time, r.tier) for r in c.records.values())
    # 8 slots -> soft target 6; each owner bills E + input (2 slots): the 4th-newest is demoted.
    assert [t for _, t in tiers] == [L.Tier.NORMAL, L.Tier.REUSE, L.Tier.REUSE, L.Tier.REUSE]
    assert L.rebalance_tiers(sim.state, c) == c
    q = L.quote(sim.state, sim.cache, L.Gap(L.STATE_POOL, 1), L.Applicant(L.ApplicantKind.NECESSARY, demote=False))
    oldest = min(sim.cache.records.values(), key=lambda r: r.demand_time)
    assert q.cold == {("rec", oldest.rid)}  # a quote treats it as normal content ...
    assert q.chosen[0].tier == L.Tier.NORMAL
    sim.apply(L.plan_reclaim(sim.state, sim.cache, q))
    if oldest.rid in sim.cache.records:  # ... and its commit records the tier demotion (RD-4)
        assert sim.cache.records[oldest.rid].tier == L.Tier.NORMAL


def test_wait2_revocation_comes_after_ordinary_reclamation_and_takes_the_youngest_waiter_first():
    sim = make(slots=8)
    _finished(sim, "a", toks(150), out=(1,))
    _finished(sim, "b", toks(150, 4000), out=(1,))
    _finished(sim, "c", toks(150, 8000), out=(1,))  # no waiter: ordinary content
    _wait(sim, "old", toks(150) + [1], ticket=1, frontier=150)
    _wait(sim, "young", toks(150, 4000) + [1], ticket=9, frontier=150)
    ap = L.Applicant(L.ApplicantKind.NECESSARY, revoke_waiters=True, demote=False)
    q = L.quote(sim.state, sim.cache, L.Gap(L.STATE_POOL, 1), ap)
    assert not q.chosen[0].waiters  # ordinary reclamation first
    q = L.quote(sim.state, sim.cache, L.Gap(L.STATE_POOL, 2), ap)
    assert [a.waiters for a in q.chosen] == [(), ("young",)]
    sim.apply(L.plan_reclaim(sim.state, sim.cache, q))
    assert "young" not in sim.cache.waiters and "old" in sim.cache.waiters  # the revoked one reselects


def test_wait3_two_waiters_on_a_replaced_point_each_branch_from_it():
    sim = make()
    _finished(sim, "a", toks(150))
    c1 = _wait(sim, "w1", toks(150) + [1], ticket=5, frontier=150)
    _wait(sim, "w2", toks(150) + [2], ticket=6, frontier=150)
    _, v = start(sim, "b", toks(150) + [9, 9])  # the owner moves on: the point is kept for the waiters
    v = compute(sim, v, toks(150) + [9, 9])
    capture(sim, v, INPUT)
    for req, kind in (("w2", L.Takeover.FORK), ("w1", L.Takeover.MOVE)):
        got = [c for c in served(sim, toks(150) + [3], req=req) if c.cid == c1.cid]
        assert got and got[0].takeover == kind  # Fork while the other waiter holds it, then Move
        sim.apply(L.plan_bind(sim.state, sim.cache, L.BindRequest(req, got[0])))
        if req == "w2":
            assert c1.cid in sim.cache.checkpoints  # still kept for w1
    assert c1.cid not in sim.cache.checkpoints and not sim.cache.waiters


# -- WAIT-2: fresh admission revokes only younger, unpaused waiters, never a pause snapshot ----
def _snapshot(sim, req, base):
    t = toks(80, base)
    _, v = start(sim, req, t)
    v = compute(sim, v, t)
    sim.apply(L.plan_pause(sim.state, sim.cache, v, snapshot=True))
    return sim.cache.active[req].snapshot


def test_wait2_fresh_admission_never_revokes_a_pause_snapshot():
    sim = make(slots=2)
    snap = _snapshot(sim, "p", 6000)
    _, v = start(sim, "q", toks(40, 9000))  # the last slot: the snapshot is the only victim
    fresh = L.Applicant(L.ApplicantKind.NECESSARY, revoke_waiters=True, fresh=True, ticket=0, demote=False)
    q = L.quote(sim.state, sim.cache, L.Gap(L.STATE_POOL, 1), fresh)
    assert not q.admitted and not any(snap in a.cids for a in q.actions)
    q = L.quote(sim.state, sim.cache, L.Gap(L.MAIN_KV, 1), fresh._replace(demote=True))
    assert {a.kind for a in q.actions if snap in a.cids} == {"demote"}  # moving it revokes nothing
    # necessary progress of an admitted request may revoke it (SCH-4; PAUSE-4: it turns to Replay)
    q = L.quote(sim.state, sim.cache, L.Gap(L.STATE_POOL, 1), fresh._replace(fresh=False))
    assert q.admitted and q.chosen[0].cids == (snap,)
    sim.apply(L.plan_reclaim(sim.state, sim.cache, q))
    assert sim.cache.active["p"].snapshot is None


def test_wait2_fresh_admission_revokes_only_younger_unpaused_waiters():
    sim = make(slots=8)
    for i, base in enumerate((0, 3000, 6000)):
        _finished(sim, f"a{i}", toks(150, base))
    _wait(sim, "old", toks(150) + [1], ticket=1, frontier=150)
    _wait(sim, "young", toks(150, 3000) + [1], ticket=9, frontier=150)
    _wait(sim, "young_paused", toks(150, 6000) + [1], ticket=8, frontier=150, paused=True)
    gap = L.Gap(L.STATE_POOL, 8)
    fresh = L.Applicant(L.ApplicantKind.NECESSARY, revoke_waiters=True, fresh=True, ticket=5, demote=False)
    revoked = {w for a in L.quote(sim.state, sim.cache, gap, fresh).actions for w in a.waiters}
    assert revoked == {"young"}
    assert [w.request for w in L.revocable_waiters(sim.cache, ticket=5, fresh=True)] == ["young"]
    revoked = {w for a in L.quote(sim.state, sim.cache, gap, fresh._replace(fresh=False)).actions for w in a.waiters}
    assert revoked == {"old", "young", "young_paused"}
    no_ticket = fresh._replace(ticket=None)  # a fresh applicant without a ticket revokes no waiter
    assert not any(a.waiters for a in L.quote(sim.state, sim.cache, gap, no_ticket).actions)
