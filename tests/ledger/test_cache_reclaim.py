"""Reclamation and admission (RCL-1..12) and Host placement (HOST-1..3)."""
from __future__ import annotations

from cache_helpers import L, capture, compute, end, make, points, start, toks
from ledger.reclamation.edit import Edit
from ledger.outcomes import DemotionStale, DropStale

INPUT, END, SHARED, ANCHOR = L.PointKind.INPUT, L.PointKind.END, L.PointKind.SHARED, L.PointKind.ANCHOR
NEC = L.Applicant(L.ApplicantKind.NECESSARY)
NEC_NO_DEMOTE = L.Applicant(L.ApplicantKind.NECESSARY, demote=False)


def _finished(sim, req, t, out=(7, 8), session=None, shared=False):
    _, v = start(sim, req, t, session)
    v = compute(sim, v, t)
    capture(sim, v, INPUT, shared=shared)
    full = list(t) + list(out)
    v = compute(sim, v, full, len(full) - 1)
    end(sim, v)
    return full


def _adopt(sim, req, tokens):
    """A real cross-request adoption that then finishes (makes its owner reuse tier)."""
    _, v = start(sim, req, tokens)
    v = compute(sim, v, tokens)
    end(sim, v)


def _drop(sim, cid):
    e = Edit(sim.state, sim.cache)
    e.drop_point(cid)
    sim.apply(e.finish("test_drop"))


def test_rcl1_actions_come_from_real_holders_aliases_go_together():
    sim = make()
    _finished(sim, "a", toks(128), shared=True)
    q = L.quote(sim.state, sim.cache, L.Gap(L.STATE_POOL, 1), NEC_NO_DEMOTE)
    priv, = points(sim, INPUT)
    sh, = points(sim, SHARED)
    groups = [set(a.cids) for a in q.actions]
    assert {priv.cid, sh.cid} in groups and {priv.cid} not in groups  # alone it frees no State
    for a in q.actions:
        for oid in a.objects:
            assert sim.state.objects[oid].holders <= a.holders


def test_rcl1_content_an_active_writer_holds_is_no_victim_and_no_action_frees_nothing():
    sim = make()
    full = _finished(sim, "a", toks(200))
    _, v = start(sim, "b", full + [1])  # b holds the history's pages now
    q = L.quote(sim.state, sim.cache, L.Gap(L.MAIN_KV, 1), NEC)
    held = {o for _, pages in v.kv for o in pages} | {v.state}
    assert not any(set(a.objects) & held for a in q.actions)
    assert all(a.frees > 0 for a in q.actions)


def test_rcl2_a_quote_takes_nothing_and_is_void_once_resources_change():
    sim = make()
    _finished(sim, "a", toks(128))
    before = (sim.state, sim.cache)
    q = L.quote(sim.state, sim.cache, L.Gap(L.STATE_POOL, 1), NEC)
    assert (sim.state, sim.cache) == before and not sim.state.leases
    _finished(sim, "b", toks(100, 5000))
    res = L.plan_reclaim(sim.state, sim.cache, q)
    assert isinstance(res, L.Refusal) and res.reason == "stale_quote"


def test_rcl3_hot_protection_covers_the_proven_position_deeper_suffix_is_ordinary():
    sim = make()
    full = _finished(sim, "a", toks(150))  # input 150, E 151
    nxt = full + [1] * 20
    _, v = start(sim, "b", nxt)  # consumes E: proven position 151
    v = compute(sim, v, nxt)
    capture(sim, v, INPUT)  # a new input point at 171 retires the one at 150
    more = nxt + [2] * 30
    v = compute(sim, v, more, len(more) - 1)
    end(sim, v)
    (rec,) = sim.cache.records.values()
    assert rec.tier == L.Tier.REUSE and rec.proven_frontier == len(full) - 1
    q = L.quote(sim.state, sim.cache, L.Gap(L.STATE_POOL, 1), NEC_NO_DEMOTE)
    tier = {a.cids: a.tier for a in q.actions}
    assert tier[(rec.end,)] == L.Tier.NORMAL  # the surviving input point still covers 151
    assert tier[(rec.input_point,)] == L.Tier.REUSE


def test_rcl4_normal_before_reuse_normal_by_loss_per_freed_unit():
    sim = make(slots=12)
    _finished(sim, "a", toks(300))
    full_b = _finished(sim, "b", toks(100, 3000))
    _adopt(sim, "c", full_b + [5])  # b's owner becomes reuse tier
    q = L.quote(sim.state, sim.cache, L.Gap(L.STATE_POOL, 1), NEC_NO_DEMOTE)
    tiers = [a.tier for a in q.actions]
    assert tiers == sorted(tiers)
    normal = [a for a in q.actions if a.tier == L.Tier.NORMAL]
    ratios = [a.loss / min(a.frees, 1) for a in normal]
    assert ratios == sorted(ratios)


def test_rcl5_loss_is_counted_against_the_surviving_fallback_nested_points_once():
    sim = make()
    _finished(sim, "a", toks(150), out=tuple(range(60)))  # input 150 (3 pages), E 209 (4 pages)
    inp, = points(sim, INPUT)
    e, = points(sim, END)
    q = L.quote(sim.state, sim.cache, L.Gap(L.MAIN_KV, 1), NEC_NO_DEMOTE)
    loss = {a.cids: a.loss for a in q.actions}
    assert loss[(e.cid,)] == 209 - 150
    assert loss[tuple(sorted((inp.cid, e.cid)))] == 209  # not 150 + 209
    q = L.quote(sim.state, sim.cache, L.Gap(L.MAIN_KV, 1), NEC)
    assert all(a.loss == 0 for a in q.actions if a.kind == "demote")  # Host fits: nothing lost


def test_rcl6_a_few_missing_pages_move_a_bounded_page_group_not_the_state():
    sim = make()
    _finished(sim, "a", toks(600))
    q = L.quote(sim.state, sim.cache, L.Gap(L.MAIN_KV, 2), NEC)
    assert q.admitted and [a.kind for a in q.chosen] == ["demote"]
    (a,) = q.chosen
    assert len(a.objects) == 2 and all(sim.state.objects[o].kind == L.KV_PAGE for o in a.objects)
    sim.apply(L.plan_reclaim(sim.state, sim.cache, q))
    sim.drive_transaction()
    q = L.quote(sim.state, sim.cache, L.Gap(L.MAIN_KV, 1), NEC)
    assert q.actions[0].kind == "demote" or q.actions[0].kind == "drop_replica"


def test_rcl6_with_a_complete_host_replica_the_device_replica_is_freed_directly():
    sim = make()
    _finished(sim, "a", toks(128))
    inp, = points(sim, INPUT)
    sim.state = L.commit(sim.state, L.plan_begin_transfer(sim.state, L.TransferRequest(
        L.TxnKind.DEMOTION, "t", [inp.state], L.HOST_MEDIUM)))  # keeps the Device replica
    sim.drive_transaction()
    q = L.quote(sim.state, sim.cache, L.Gap(L.STATE_POOL, 1), NEC)
    assert q.chosen[0].kind == "drop_replica" and q.chosen[0].loss == 0


def test_rcl7_migrations_of_one_pool_share_one_transaction():
    sim = make(host=1 << 16)
    _finished(sim, "a", toks(256), out=())
    _finished(sim, "b", toks(256, 5000), out=())
    q = L.quote(sim.state, sim.cache, L.Gap(L.MAIN_KV, 6), NEC)
    assert q.admitted and [a.kind for a in q.chosen] == ["demote", "demote"]
    res = L.plan_reclaim(sim.state, sim.cache, q)
    sim.apply(res)
    assert len(sim.state.transaction.jobs) == sum(len(a.objects) for a in q.chosen)


def test_rcl8_necessary_execution_keeps_its_own_source_and_in_flight_readers():
    sim = make()
    _finished(sim, "a", toks(128))
    _finished(sim, "b", toks(128, 4000))
    ia, ib = sorted(points(sim, INPUT), key=lambda c: c.cid)
    sim.apply(L.plan_lease(sim.state, [ib.state], L.DEVICE, "reader"))
    q = L.quote(sim.state, sim.cache, L.Gap(L.STATE_POOL, 1), NEC_NO_DEMOTE, protect=ia.object_ids())
    touched = {o for a in q.actions for o in a.objects}
    assert ia.state not in touched and ib.state not in touched


def test_rcl9_a_capture_replaces_reuse_content_only_older_than_its_own_demand():
    sim = make(slots=12)
    fa = _finished(sim, "a", toks(100))
    _adopt(sim, "a2", fa + [1])
    fb = _finished(sim, "b", toks(100, 3000))
    _adopt(sim, "b2", fb + [1])
    reuse = sorted((r.demand_time, r.rid) for r in sim.cache.records.values() if r.tier == L.Tier.REUSE)
    (t_old, rid_old), (t_new, rid_new) = reuse
    ap = L.Applicant(L.ApplicantKind.CAPTURE, demand_time=(t_old + t_new) // 2 + 1, tier=L.Tier.NORMAL)
    q = L.quote(sim.state, sim.cache, L.Gap(L.STATE_POOL, 1), ap)
    owners = {sim.cache.checkpoints[c].owner for a in q.actions if a.tier == L.Tier.REUSE for c in a.cids}
    assert ("rec", rid_new) not in owners


def test_rcl10_admission_table_cold_capture_bounded_by_owner_tier_snapshot_by_ticket():
    sim = make(slots=12)
    fb = _finished(sim, "b", toks(100, 3000))
    _adopt(sim, "b2", fb + [1])
    cold = L.Applicant(L.ApplicantKind.CAPTURE, budget=10 ** 6, tier=L.Tier.NORMAL)
    q = L.quote(sim.state, sim.cache, L.Gap(L.STATE_POOL, 1), cold)
    assert all(a.tier == L.Tier.NORMAL for a in q.actions)
    # pause snapshots: a Snapshot applicant replaces later tickets' snapshots only
    for req, base in (("p1", 6000), ("p2", 7000)):
        _, v = start(sim, req, toks(80, base))
        v = compute(sim, v, toks(80, base))
        sim.apply(L.plan_pause(sim.state, sim.cache, v, snapshot=True))
    s1, s2 = sim.cache.active["p1"].snapshot, sim.cache.active["p2"].snapshot
    ap = L.Applicant(L.ApplicantKind.SNAPSHOT, ticket=sim.cache.active["p1"].publication_order)
    q = L.quote(sim.state, sim.cache, L.Gap(L.STATE_POOL, 1), ap)
    cids = {c for a in q.actions if a.kind == "delete" for c in a.cids}
    assert s2 in cids and s1 not in cids
    wb = L.Applicant(L.ApplicantKind.WRITEBACK, budget=1)
    q = L.quote(sim.state, sim.cache, L.Gap(L.STATE_POOL, 1), wb)
    assert not q.admitted or q.loss < 1


def test_rcl11_cold_capture_budget_is_fixed_and_cumulative():
    sim = make(slots=12)
    _finished(sim, "a", toks(30), out=(1,))  # E and input point at 30 share one state (REC-9)
    _finished(sim, "b", toks(30, 3000), out=(1,))
    for budget, ok in ((50, False), (61, True)):
        ap = L.Applicant(L.ApplicantKind.CAPTURE, budget=budget, tier=L.Tier.NORMAL, demote=False)
        q = L.quote(sim.state, sim.cache, L.Gap(L.STATE_POOL, 2), ap)
        assert q.admitted == ok and (not ok or q.loss < budget)


def test_rcl12_a_cold_save_does_not_borrow_necessary_rights_and_never_blocks_execution():
    sim = make(slots=2, host=0)
    _finished(sim, "a", toks(200), out=(1,))  # E and input point at 200 share one state (REC-9)
    t = toks(100, 9000)
    _, v = start(sim, "b", t)  # the last free slot
    v = compute(sim, v, t)
    res = capture(sim, v, INPUT)  # budget 100 < loss 200: skipped
    assert isinstance(res, L.Refusal)
    q = L.quote(sim.state, sim.cache, L.Gap(L.STATE_POOL, 1), NEC)
    assert q.admitted  # necessary execution may still reclaim it
    sim.apply(L.plan_reclaim(sim.state, sim.cache, q))


def test_host1_first_fit_pre_check_contiguity_not_total_bytes():
    sim = make(slots=1, host=4 * 4096)
    t = toks(200)
    _, v = start(sim, "a", t)
    for f in (10, 20, 30, 40):
        v = compute(sim, v, t, f)
        capture(sim, v, ANCHOR)  # slot taken by the writer: each anchor is a Host block
    rid = sim.cache.active["a"].rid
    a10, a20, a30, a40 = sim.cache.records[rid].anchors
    _drop(sim, a20)  # a hole of one block at offset 4096
    need = L.arena.HostAllocation(2 * 4096)
    q = L.quote(sim.state, sim.cache, L.Gap(L.HOST, 8192, (need,)), NEC)
    assert q.admitted and len(q.chosen) == 1 and q.chosen[0].cids[0] in (a10, a30)


def test_host1_safe_duplicate_replicas_are_freed_first():
    sim = make(slots=4, host=1 << 16)
    _finished(sim, "a", toks(128))
    inp, = points(sim, INPUT)
    sim.state = L.commit(sim.state, L.plan_begin_transfer(sim.state, L.TransferRequest(
        L.TxnKind.DEMOTION, "t", [inp.state], L.HOST_MEDIUM)))
    sim.drive_transaction()
    full = (1 << 16)
    q = L.quote(sim.state, sim.cache, L.Gap(L.HOST, full), NEC)
    assert q.actions[0].kind == "drop_replica"


def test_host2_no_admissible_combination_deletes_nothing():
    sim = make(slots=1, host=2 * 4096)
    t = toks(200)
    _, v = start(sim, "a", t)
    for f in (100, 150):
        v = compute(sim, v, t, f)
        capture(sim, v, ANCHOR)
    ap = L.Applicant(L.ApplicantKind.CAPTURE, budget=5)
    q = L.quote(sim.state, sim.cache, L.Gap(L.HOST, 4096), ap)
    assert not q.admitted and q.chosen == ()
    res = L.plan_reclaim(sim.state, sim.cache, q)
    assert isinstance(res, L.Refusal) and res.reason == "not_admitted"


def test_host3_demoted_page_groups_split_to_fit_fragmented_host_space():
    sim = make(host=5 * 1024)
    st = sim.state
    p = L.plan_allocate(st, L.MAIN_KV, 5, "filler")
    st = L.commit(st, p)
    ids = [x[0] for x in p.proof.allocated]
    st = L.commit(st, L.plan_begin_transfer(st, L.TransferRequest(L.TxnKind.DEMOTION, "f", ids, L.HOST_MEDIUM,
                                                                  drop_source=True)))
    sim.state = st
    sim.drive_transaction()
    sim.state = L.commit(sim.state, L.plan_drop_holders(sim.state, ids[:2] + ids[3:], "filler"))  # holes: 2 + 2 pages
    _finished(sim, "a", toks(256), out=())
    q = L.quote(sim.state, sim.cache, L.Gap(L.MAIN_KV, 4), NEC)
    assert q.admitted and q.chosen[0].kind == "demote"
    sim.apply(L.plan_reclaim(sim.state, sim.cache, q))
    offsets = sorted(j.dst.location for j in sim.state.transaction.jobs)
    assert offsets == [0, 1024, 3072, 4096]  # one group of four, halved into the two holes


def test_host2_shared_references_on_host_are_counted_once():
    sim = make(host=1 << 16)
    _finished(sim, "a", toks(150), out=tuple(range(60)))  # input 150 and E 209 share 3 pages
    ids = sorted({o for c in points(sim) for o in c.object_ids()})
    sim.state = L.commit(sim.state, L.plan_begin_transfer(sim.state, L.TransferRequest(
        L.TxnKind.DEMOTION, "t", ids, L.HOST_MEDIUM, drop_source=True)))
    sim.drive_transaction()  # everything on Host only
    used = sim.state.arena.used_bytes
    q = L.quote(sim.state, sim.cache, L.Gap(L.HOST, (1 << 16) - 1024), L.Applicant(L.ApplicantKind.NECESSARY))
    assert q.admitted and q.freed == used  # nested groups chosen together, each byte once
    sim.apply(L.plan_reclaim(sim.state, sim.cache, q))
    assert sim.state.arena.used_bytes == 0


def test_rcl1_a_page_an_active_request_computes_on_keeps_its_device_replica():
    sim = make()
    full = _finished(sim, "a", toks(200), out=(1,))
    e, = points(sim, END)
    sim.state = L.commit(sim.state, L.plan_begin_transfer(sim.state, L.TransferRequest(
        L.TxnKind.DEMOTION, "t", list(e.object_ids()[1:]), L.HOST_MEDIUM)))  # Host duplicates of E's pages
    sim.drive_transaction()
    _, v = start(sim, "b", full + [3])  # b now writes on those pages (Move)
    q = L.quote(sim.state, sim.cache, L.Gap(L.MAIN_KV, 1), NEC)
    held = {o for _, pages in v.kv for o in pages}
    assert not any(a.kind == "drop_replica" and set(a.objects) & held for a in q.actions)


def test_rcl12_host_victims_of_a_demotion_also_answer_to_the_outer_capture_budget():
    sim = make(slots=2, host=4096)
    t = toks(200)
    _, v = start(sim, "a", t)
    v = compute(sim, v, t, 30)
    capture(sim, v, INPUT)  # the second slot
    v = compute(sim, v, t, 60)
    capture(sim, v, ANCHOR)  # no slot left: the whole Host arena
    v = compute(sim, v, t)
    end(sim, v)  # E at 200 keeps the writer's slot
    for budget, ok in ((20, False), (35, True)):
        ap = L.Applicant(L.ApplicantKind.CAPTURE, budget=budget, tier=L.Tier.NORMAL)
        q = L.quote(sim.state, sim.cache, L.Gap(L.STATE_POOL, 1), ap)
        assert q.admitted == ok
        for a in q.chosen:
            assert a.loss + sum(v.loss for v in a.host_victims) < budget


# -- a plan never frees what it then moves (RCL-5, RCL-7) ------------------------------------
def _two_points_on_host(sim):
    """One history: input point I at 300 and E at 310 hold the same five Main KV pages (BIND-3);
    both StateImages lie on Host only and fill the arena, so the only Host victims are I and E."""
    t = toks(300)
    _, v = start(sim, "a", t)
    v = compute(sim, v, t)
    capture(sim, v, INPUT)
    v = compute(sim, v, t + list(range(11)), 310)
    end(sim, v)
    inp, = points(sim, INPUT)
    e, = points(sim, END)
    assert inp.kv == e.kv and len(inp.kv[0][1]) == 5
    sim.apply(L.plan_begin_transfer(sim.state, L.TransferRequest(
        L.TxnKind.DEMOTION, "t", [inp.state, e.state], L.HOST_MEDIUM, drop_source=True)))
    sim.drive_transaction()
    assert sim.state.arena.free_bytes == 0
    for req in ("x", "y"):  # RCL-9: repeated demand at I: its write-back is not budget-bound
        sim.cache = L.observe_prefill(sim.cache, req, L.identity_of(t), 0, 300, [300])
    assert sim.cache.checkpoints[inp.cid].demand_time
    return inp, e


def test_rcl5_rcl7_a_demotion_never_takes_host_victims_that_together_free_its_pages():
    sim = make(main=8, slots=4, host=2 * 4096)
    inp, e = _two_points_on_host(sim)
    pages = set(inp.kv[0][1])
    # Demoting the five pages needs 5 KiB of Host: both StateImage blocks. Deleting I or E alone
    # frees no page, deleting both frees all five: that demotion must not be offered.
    q = L.quote(sim.state, sim.cache, L.Gap(L.MAIN_KV, 5), NEC)
    assert not any(a.kind == "demote" and set(a.objects) & pages for a in q.actions)
    assert q.admitted
    L.check_quote(sim.state, sim.cache, q)
    free = len(sim.state.pool(L.MAIN_KV).free)
    res = L.plan_reclaim(sim.state, sim.cache, q)  # used to raise UnknownObject
    sim.apply(res)
    sim.drive_transaction()
    assert len(sim.state.pool(L.MAIN_KV).free) >= free + 5
    assert not set(sim.state.objects) & pages


def test_rcl7_apply_quote_drops_from_the_transfer_what_the_same_plan_deleted():
    sim = make(main=8, slots=4, host=1 << 16)
    t = toks(200)
    _, v = start(sim, "a", t)
    v = compute(sim, v, t)
    end(sim, v)
    e, = points(sim, END)
    q = L.quote(sim.state, sim.cache, L.Gap(L.MAIN_KV, 4), NEC)
    demote = next(a for a in q.actions if a.kind == "demote")
    delete = next(a for a in q.actions if a.kind == "delete" and a.cids == (e.cid,))
    stale = q._replace(chosen=(delete, demote))  # a move of what the same plan deletes
    try:
        L.check_quote(sim.state, sim.cache, stale)
        raise AssertionError("check_quote accepted a quote that moves what it deletes")
    except L.IntegrityError:
        pass
    res = L.plan_reclaim(sim.state, sim.cache, stale)  # never raises
    assert DemotionStale(demote.objects) in res.outcome
    sim.apply(res)
    assert sim.state.transaction is None and not sim.state.objects


def _page_with_host_duplicate(sim, host_state=False):
    """E at 200 (four pages); page 0 also lies on Host (a complete duplicate). With
    `host_state`, the pages lie on Host only and the StateImage on both media instead."""
    t = toks(200)
    _, v = start(sim, "a", t)
    v = compute(sim, v, t)
    end(sim, v)
    e, = points(sim, END)
    pages = list(e.kv[0][1])
    if host_state:
        sim.apply(L.plan_begin_transfer(sim.state, L.TransferRequest(
            L.TxnKind.DEMOTION, "t", pages, L.HOST_MEDIUM, drop_source=True)))
        sim.drive_transaction()
        ids = [e.state]
    else:
        ids = pages[:1]
    sim.apply(L.plan_begin_transfer(sim.state, L.TransferRequest(L.TxnKind.DEMOTION, "t", ids, L.HOST_MEDIUM)))
    sim.drive_transaction()
    return e


def test_rcl7_a_deletion_takes_over_the_replica_drop_of_content_it_frees():
    sim = make(main=8, slots=4, host=1 << 16)
    e = _page_with_host_duplicate(sim)
    dup = e.kv[0][1][0]
    q = L.quote(sim.state, sim.cache, L.Gap(L.MAIN_KV, 4), NEC_NO_DEMOTE)
    assert q.admitted
    # not "drop page 0's Device replica" and then "delete E", which frees page 0 whole
    assert [a.kind for a in q.chosen] == ["delete"] and dup in q.chosen[0].objects
    L.check_quote(sim.state, sim.cache, q)
    assert q.freed == 4
    free = len(sim.state.pool(L.MAIN_KV).free)
    sim.apply(L.plan_reclaim(sim.state, sim.cache, q))
    assert len(sim.state.pool(L.MAIN_KV).free) == free + 4 and dup not in sim.state.objects


def test_rcl7_host_quote_never_drops_a_replica_its_deletion_frees():
    sim = make(main=8, slots=4, host=4 * 1024 + 4096)
    e = _page_with_host_duplicate(sim, host_state=True)  # the arena is full: 4 pages + the state copy
    assert sim.state.arena.free_bytes == 0
    q = L.quote(sim.state, sim.cache, L.Gap(L.HOST, 8192, (L.arena.HostAllocation(8192),)), NEC)
    assert q.admitted and [a.kind for a in q.chosen] == ["delete"]
    L.check_quote(sim.state, sim.cache, q)
    assert q.freed == 8192
    sim.apply(L.plan_reclaim(sim.state, sim.cache, q))
    assert sim.state.arena.used_bytes == 0 and e.state not in sim.state.objects


def test_rcl7_a_stale_replica_drop_is_skipped_never_raised():
    sim = make(main=8, slots=4, host=1 << 16)
    e = _page_with_host_duplicate(sim)
    dup = e.kv[0][1][0]
    q = L.quote(sim.state, sim.cache, L.Gap(L.MAIN_KV, 4), NEC_NO_DEMOTE)
    drop = next(a for a in q.actions if a.kind == "drop_replica")
    delete = next(a for a in q.actions if a.kind == "delete")
    res = L.plan_reclaim(sim.state, sim.cache, q._replace(chosen=(delete, drop)))
    assert DropStale(dup) in res.outcome
    sim.apply(res)
    assert dup not in sim.state.objects
