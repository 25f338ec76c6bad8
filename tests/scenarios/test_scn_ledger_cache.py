"""Ledger-level parts of the cache scenarios SCN-2, 3, 4, 6, 7, 9 (docs/rules.md)."""
from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "ledger"))

from cache_helpers import L, SavePoint, capture, compute, end, make, points, served, start, toks  # noqa: E402
from ledger.outcomes import View  # noqa: E402

INPUT, SHARED, END = L.PointKind.INPUT, L.PointKind.SHARED, L.PointKind.END


def test_scn2_private_point_and_shared_marker_at_one_position_one_state_two_uses():
    sim = make()
    t = toks(150)
    _, v = start(sim, "a", t)
    v = compute(sim, v, t)
    capture(sim, v, INPUT, shared=True)
    (priv,), (sh,) = points(sim, INPUT), points(sim, SHARED)
    assert priv.state == sh.state  # one state, two uses
    full = t + [5, 6]
    v = compute(sim, v, full, len(full) - 1)
    end(sim, v)
    nxt = full + [9] * 30
    _, v = start(sim, "b", nxt)  # the private record moves forward
    v = compute(sim, v, nxt)
    capture(sim, v, INPUT)
    assert priv.cid not in sim.cache.checkpoints  # its old input point retired ...
    assert sh.cid in sim.cache.checkpoints  # ... the shared entry lives on by its own refs
    assert sh.holder in sim.state.objects[sh.state].holders
    _, v2 = start(sim, "c", t + [77])  # and its own heat
    assert sim.cache.shared[sh.owner[1]].tier == L.Tier.REUSE


def test_scn3_explicit_markers_alpha_and_alpha_beta_then_alpha_gamma_reuses_alpha():
    sim = make()
    alpha, beta, gamma = toks(100), toks(60, 5000), toks(40, 9000)
    o = sim.run("a", alpha + beta, [SavePoint(100, SHARED), SavePoint(160, SHARED)], output=(1,))
    assert o.captures == 2  # both got their save opportunity
    best = served(sim, alpha + gamma)[0]
    assert best.frontier == 100 and sim.cache.checkpoints[best.cid].kind == SHARED
    o = sim.run("b", alpha + gamma, [], output=(1,))
    assert o.reused == 100


def test_scn4_hot_predecessor_many_one_off_branches_each_with_its_own_adoption_time():
    sim = make(main=256, slots=8)
    parent = toks(128)
    sim.run("p", parent, [SavePoint(128, SHARED)], output=(1,))
    times = []
    for i in range(6):
        o = sim.run(f"b{i}", parent + toks(20, 1000 * (i + 1)), [SavePoint(148)], output=(1, 2))
        assert o.reused == 128
        rec = max(sim.cache.records.values(), key=lambda r: r.publication_order)
        times.append(rec.demand_time)
    assert times == sorted(times) and len(set(times)) == len(times)  # each branch: its real adoption time
    before = {r.rid: (r.tier, r.demand_time) for r in sim.cache.records.values()}
    tiers = [r.tier for r in sorted(sim.cache.records.values(), key=lambda r: r.demand_time)]
    assert tiers[0] == L.Tier.NORMAL and tiers[-1] == L.Tier.REUSE  # over the 3/4 target: older demoted
    # completion adds no heat: finishing another unrelated request changes no pair
    sim.run("z", toks(50, 70000), [], output=(1,))
    after = {r.rid: r.demand_time for r in sim.cache.records.values() if r.rid in before}
    assert after == {k: v[1] for k, v in before.items()}


def test_scn6_a_few_missing_main_kv_pages_move_only_that_page_group():
    sim = make(main=16, slots=8, host=1 << 16, backend=32)
    for i in range(3):
        sim.run(f"a{i}", toks(300, 1000 * i), [SavePoint(300)], output=(1,))
    backend = "backend_kv:mtp"
    assert all(len(dict(c.kv)[backend]) == 10 for c in points(sim))  # typed coverage: ceil(300 / 32)
    states_before = {c.state: sim.state.objects[c.state].device for c in points(sim)}
    backend_before = {o: x.device for o, x in sim.state.objects.items() if x.pool == backend}
    short = 2
    q = L.quote(sim.state, sim.cache, L.Gap(L.MAIN_KV, short), L.Applicant(L.ApplicantKind.NECESSARY))
    assert q.admitted and sum(len(a.objects) for a in q.chosen) == short
    assert all(sim.state.objects[o].kind == L.KV_PAGE for a in q.chosen for o in a.objects)
    sim.apply(L.plan_reclaim(sim.state, sim.cache, q))
    sim.drive_transaction()
    assert {s: sim.state.objects[s].device for s in states_before} == states_before  # State not moved
    assert {o: sim.state.objects[o].device for o in backend_before} == backend_before  # nor backend KV
    assert sim.state.pool(L.MAIN_KV).available >= short


def test_scn7_no_host_few_slots_optional_saves_fail_necessary_work_goes_on_replay_under_recovery():
    sim = make(main=32, slots=2, host=0)
    skipped = 0
    for i in range(6):
        o = sim.run(f"r{i}", toks(150, 1000 * i), [SavePoint(64, SHARED), SavePoint(150)], output=(1, 2))
        skipped += o.skipped
    assert skipped > 0  # optional saves failed, every request still ran
    t = toks(200, 50000)
    _, v = sim.bind("p", L.identity_of(t))  # admission reclaims what it needs (RCL-8)
    v = compute(sim, v, t, 128)
    sim.apply(L.plan_pause(sim.state, sim.cache, v, snapshot=False))  # Replay route
    permit = L.plan_unit_permit(sim.state, L.UnitDemand("p", L.UnitKind.RECOVERY, {L.MAIN_KV: 2}))
    sim.apply(permit)
    (cand,) = [c for c in served(sim, t[:128], req="p") if c.takeover == "root"]
    res = sim._retry(lambda: L.plan_bind(sim.state, sim.cache, L.BindRequest("p", cand, resume=True)))
    sim.apply(res)  # necessary work: a reclamation made room for the State (RCL-8)
    v = L.SequenceView("p", L.identity_of(t).prefix(0), [o for o in res.outcome if isinstance(o, View)][0].state_object, ())
    v = compute(sim, v, t, 128)  # Replay back to the paused frontier
    assert capture(sim, v, INPUT).reason == "recovery_in_force"  # optional captures skipped (RD-1)
    sim.apply(L.plan_settle(sim.state, permit.proof.permits[0], "p"))
    v = compute(sim, v, t)
    end(sim, v)


def test_scn9_repeated_computation_becomes_demand_evidence_hits_count_only_real_reuse():
    sim = make(main=64, slots=2, host=0)
    prefix = toks(100)
    marker = [SavePoint(100, SHARED)]
    sim.run("filler", toks(200, 7000), [], output=(1,))  # its E holds the spare slot
    o0 = sim.run("c0", prefix + toks(30, 1000), marker, output=(1,))
    assert o0.skipped == 1 and not points(sim, SHARED)  # unkept: no benefit enough to replace E
    o1 = sim.run("c1", prefix + toks(30, 2000), marker, output=(1,))  # computes 0..100 again
    (sh,) = points(sim, SHARED)  # its own repeated demand now admits the save (RCL-10)
    assert sh.frontier == 100 and sh.demand_time > 0
    assert sim.cache.shared[sh.owner[1]].tier == L.Tier.REUSE  # it enters the reuse segment
    assert o0.reused == 0 and o1.reused == 0  # evidence is no hit: nothing was reused
    o2 = sim.run("c2", prefix + toks(5, 3000), [], output=(1,))
    assert o2.reused == 100  # a real hit
