"""Source selection and bind (SRC-1..5, BIND-1..7)."""
from __future__ import annotations

from cache_helpers import L, capture, compute, end, make, points, served, start, toks
from ledger.outcomes import SessionKeptByNewer, TailCopied, View

INPUT, END, SHARED = L.PointKind.INPUT, L.PointKind.END, L.PointKind.SHARED


def _finished(sim, req, t, out=(7, 8), session=None, shared_at=None, input_point=True):
    _, v = start(sim, req, t, session)
    if shared_at:
        v = compute(sim, v, t, shared_at)
        capture(sim, v, None, shared=True)
    v = compute(sim, v, t)
    if input_point:
        capture(sim, v, INPUT)
    full = list(t) + list(out)
    v = compute(sim, v, full, len(full) - 1)
    end(sim, v)
    return full


def test_src1_query_lists_private_and_shared_points_on_the_hit_path_and_root():
    sim = make()
    full = _finished(sim, "a", toks(150), shared_at=64)
    _finished(sim, "b", toks(100, 7000))  # another history: not on the hit path
    got = served(sim, full + [1])
    kinds = sorted((c.frontier, c.takeover) for c in got)
    assert kinds == [(0, "root"), (64, "fork"), (150, "takeover_fork"), (len(full) - 1, "move")]


def test_src2_rank_by_cost_then_tie_order_and_duplicates_merge():
    sim = make()
    t = toks(150)
    _, v = start(sim, "a", t)  # stays active: its points can only be forked
    v = compute(sim, v, t, 128)
    capture(sim, v, INPUT, shared=True)  # private + shared, one state, same position
    got = served(sim, toks(128) + [1, 2])
    assert [c.frontier for c in got] == [128, 0]  # SRC-2: the duplicate fork of one handle merged
    assert got[0].private  # the private use wins the tie
    assert got == tuple(sorted(got, key=L.SourceCandidate.rank))


def test_src3_cost_calibration_changes_order_never_recoverability():
    sim = make(main=64, slots=8)
    full = _finished(sim, "a", toks(300), out=(1, 2, 3, 4, 5))
    (e,) = points(sim, END)
    for oid in e.object_ids()[:1]:  # E's StateImage lies on Host only
        sim.state = L.commit(sim.state, L.plan_begin_transfer(sim.state, L.TransferRequest(
            L.TxnKind.DEMOTION, "t", [oid], L.HOST_MEDIUM, drop_source=True)))
        sim.drive_transaction()
    q = L.identity_of(full + [2])
    cheap = L.query_sources(sim.state, sim.cache, L.SourceQuery("x", q), L.CostModel(1.0, 1e-6, 0))
    dear = L.query_sources(sim.state, sim.cache, L.SourceQuery("x", q), L.CostModel(1.0, 1.0, 0))
    assert cheap[0].frontier == len(full) - 1 and cheap[0].missing
    assert dear[0].frontier == 300  # the Device-resident input point now ranks first
    assert {c.cid for c in cheap} == {c.cid for c in dear}


def test_src4_query_is_read_only_and_a_failed_bind_retires_nothing():
    sim = make(main=12, slots=8)
    _finished(sim, "a", toks(300), out=(1, 2, 3))
    before = (sim.state, sim.cache)
    cands = served(sim, toks(300) + [9, 9])
    assert (sim.state, sim.cache) == before
    best = cands[0]
    assert best.retired  # the E would retire
    big = L.UnitDemand("b", L.UnitKind.PREFILL, {L.MAIN_KV: 12})
    res = L.plan_bind(sim.state, sim.cache, L.BindRequest("b", best, first_unit=big))
    assert isinstance(res, L.Refusal) and res.reason == "shortfall"
    assert (sim.state, sim.cache) == before and all(r in sim.cache.checkpoints for r in best.retired)


def test_src5_own_snapshot_is_redeemed_first_and_a_blocked_source_is_flagged():
    sim = make()
    _finished(sim, "a", toks(200), out=(1,))
    t = toks(200) + [5] * 40
    _, v = start(sim, "b", t)
    v = compute(sim, v, t)
    sim.apply(L.plan_pause(sim.state, sim.cache, v, snapshot=True))
    snap = sim.cache.active["b"].snapshot
    got = L.query_sources(sim.state, sim.cache, L.SourceQuery("b", L.identity_of(t), snapshot=snap))
    assert len(got) == 1 and got[0].takeover == L.Takeover.SNAPSHOT
    res = L.plan_bind(sim.state, sim.cache, L.BindRequest("b", got[0], resume=True))
    sim.apply(res)
    assert snap not in sim.cache.checkpoints
    (inp,) = [c for c in points(sim, INPUT)]
    oids = inp.object_ids()[1:2]
    sim.apply(L.plan_begin_transfer(sim.state, L.TransferRequest(L.TxnKind.DEMOTION, "t", oids, L.HOST_MEDIUM)))
    assert any(c.blocked for c in served(sim, toks(200) + [3]))


def test_bind1_inactive_record_is_taken_over_active_one_is_branched():
    sim = make()
    full = _finished(sim, "a", toks(100))
    (rec,) = sim.cache.records.values()
    _, v = start(sim, "b", full + [1, 2])
    assert sim.cache.records[rec.rid].active == "b"  # takeover: the relation moves forward
    c = served(sim, full + [1, 2, 3], req="c")
    assert all(x.takeover in ("fork", "root") for x in c)  # b is running: branch
    _, v2 = start(sim, "c", full + [1, 2, 3])
    assert sim.cache.active["c"].rid != rec.rid


def test_bind2_crossing_a_named_entry_branches_and_shared_aliases_fork():
    sim = make()
    full = _finished(sim, "a", toks(100), session="s1", shared_at=64)
    got = {c.frontier: c.takeover for c in served(sim, full + [1], session="s2")}
    assert got[len(full) - 1] == "fork" and got[64] == "fork"
    got = {c.frontier: c.takeover for c in served(sim, full + [1], session="s1")}
    assert got[len(full) - 1] == "move"


def test_bind4_recompute_from_an_earlier_point_retires_deeper_ones_and_branches_copy_the_tail():
    sim = make()
    _finished(sim, "a", toks(150), out=tuple(range(60)))
    (e,) = points(sim, END)
    used = len(sim.state.objects)
    _, v = start(sim, "b", toks(150) + [999])  # the input point at 150 (partial page), E retires
    assert e.cid not in sim.cache.checkpoints
    assert len(sim.state.objects) < used  # trimmed to the remaining protected range
    sim2 = make()
    _finished(sim2, "a", toks(150), shared_at=100)
    cand = [c for c in served(sim2, toks(100) + [5]) if c.frontier == 100][0]
    res = L.plan_bind(sim2.state, sim2.cache, L.BindRequest("c", cand))
    assert any(isinstance(o, TailCopied) for o in res.outcome)  # 100 % 64 != 0: a private tail copy
    assert any(isinstance(x, L.CopyUnit) for x in res.plan.effects)


def test_bind5_exclusive_end_is_moved_kept_source_is_forked_host_replica_fills_the_slot():
    sim = make()
    full = _finished(sim, "a", toks(100))
    (e,) = points(sim, END)
    _, v = start(sim, "b", full + [1])
    assert v.state == e.state  # Move: the very StateImage object, no copy
    sim2 = make()
    full = _finished(sim2, "a", toks(128), out=(), input_point=True)
    (inp,) = points(sim2, INPUT)
    sim2.state = L.commit(sim2.state, L.plan_begin_transfer(sim2.state, L.TransferRequest(
        L.TxnKind.DEMOTION, "t", [inp.state], L.HOST_MEDIUM)))
    sim2.drive_transaction()  # a Host replica too
    cand = [c for c in served(sim2, toks(128) + [3], req="c") if c.cid == inp.cid][0]
    res = L.plan_bind(sim2.state, sim2.cache, L.BindRequest("c", cand))
    assert cand.takeover != "move" and any(isinstance(x, (L.CopyUnit, L.CopyToDevice)) for x in res.plan.effects)


def test_bind6_normal_finish_freezes_the_live_state_as_end_cancel_does_not():
    sim = make()
    t = toks(100)
    _, v = start(sim, "a", t)
    v = compute(sim, v, t)
    res = end(sim, v)
    (e,) = points(sim, END)
    assert e.state == v.state and not res.plan.effects  # a handover, no copy
    _, v = start(sim, "b", toks(80, 3000))
    v = compute(sim, v, toks(80, 3000))
    end(sim, v, cancel=True)
    assert len(points(sim, END)) == 1 and "b" not in sim.cache.active


def test_bind7_an_older_finish_never_overwrites_a_newer_publication():
    sim = make()
    t = toks(100)
    _, va = start(sim, "a", t, session="s")
    _, vb = start(sim, "b", toks(90, 5000), session="s")  # admitted later: newer publication order
    vb = compute(sim, vb, toks(90, 5000))
    end(sim, vb)
    va = compute(sim, va, t)
    res = end(sim, va)  # the older request finishes late
    assert any(isinstance(o, SessionKeptByNewer) for o in res.outcome)
    assert sim.cache.records[sim.cache.sessions["s"]].publication_order == 2
    assert served(sim, t + [1])[0].frontier == 100  # the unnamed history is reusable by content


def test_bind5_tight_slots_keep_the_old_identity_on_host_and_hand_the_slot_to_the_writer():
    sim = make(slots=2, host=1 << 16)
    _finished(sim, "a", toks(128), out=(1, 2), session="s1")  # input point and E: both slots
    (inp,) = points(sim, INPUT)
    sim.state = L.commit(sim.state, L.plan_begin_transfer(sim.state, L.TransferRequest(
        L.TxnKind.DEMOTION, "t", [inp.state], L.HOST_MEDIUM)))  # a Host replica exists too
    sim.drive_transaction()
    cand = [c for c in served(sim, toks(128) + [5], req="b", session="s2") if c.cid == inp.cid][0]
    assert cand.takeover == "fork"  # another named entry: an independent branch, nothing retires
    res = L.plan_bind(sim.state, sim.cache, L.BindRequest("b", cand, "s2"))
    assert isinstance(res, L.Refusal) and res.reason == "shortfall"
    q = L.quote(sim.state, sim.cache, L.Gap(L.STATE_POOL, 1), L.Applicant(L.ApplicantKind.NECESSARY),
                protect=inp.object_ids()[1:], keep_content=(inp.state,))
    assert q.chosen[0].kind == "drop_replica" and q.chosen[0].objects == (inp.state,)
    sim.apply(L.plan_reclaim(sim.state, sim.cache, q))
    cand = [c for c in served(sim, toks(128) + [5], req="b", session="s2") if c.cid == inp.cid][0]
    assert not cand.missing  # the forked state is read from Host by the bind itself
    res = L.plan_bind(sim.state, sim.cache, L.BindRequest("b", cand, "s2"))
    assert any(isinstance(x, L.CopyToDevice) for x in res.plan.effects)
    sim.apply(res)
    assert inp.cid in sim.cache.checkpoints and sim.state.objects[inp.state].host is not None


def test_src5_a_source_in_flight_is_not_bound_the_request_waits():
    sim = make()
    _finished(sim, "a", toks(200), out=(1,))
    (inp,) = points(sim, INPUT)
    sim.apply(L.plan_begin_transfer(sim.state, L.TransferRequest(
        L.TxnKind.DEMOTION, "t", [dict(inp.kv)[L.MAIN_KV][0]], L.HOST_MEDIUM, drop_source=True)))
    cand = [c for c in served(sim, toks(200) + [4], req="b") if c.cid == inp.cid][0]
    assert cand.blocked
    res = L.plan_bind(sim.state, sim.cache, L.BindRequest("b", cand))
    assert isinstance(res, L.Refusal) and res.reason == "source_busy"
    sim.apply(L.plan_wait(sim.state, sim.cache, "b", cand, ticket=3))  # keeps it and waits (WAIT-1)
    sim.drive_transaction()
    cand = [c for c in served(sim, toks(200) + [4], req="b") if c.cid == inp.cid][0]
    assert not cand.blocked and cand.missing  # now on Host: a bind transaction first


# -- a writer's StateImage is never shared (BIND-5, doctrine 2) -------------------------------
def _paused_behind_a_finished_record(sim):
    """p is admitted from root and paused (Replay); then a finishes: a's E is an exact prefix of
    p's target and a's record is inactive."""
    t = toks(150)
    full = t + list(range(700, 720))
    p_toks = full + [5] * 30
    _, vp = start(sim, "p", p_toks)  # nothing cached yet: root
    vp = compute(sim, vp, p_toks, 100)
    sim.apply(L.plan_pause(sim.state, sim.cache, vp, snapshot=False))
    _, va = start(sim, "a", t)
    va = compute(sim, va, t)
    va = compute(sim, va, full, len(full) - 1)
    end(sim, va)
    (e,) = points(sim, END)
    return p_toks, e


def _resume(sim, req, cand):
    res = L.plan_bind(sim.state, sim.cache, L.BindRequest(req, cand, resume=True))
    assert isinstance(res, L.CacheResult), res
    sim.apply(res)  # check_cache: the writer's StateImage is its own
    return [o for o in res.outcome if isinstance(o, View)][0].state_object


def test_bind5_check_cache_rejects_a_writer_state_shared_with_a_checkpoint():
    sim = make()
    _finished(sim, "a", toks(100))
    (e,) = points(sim, END)
    shared = L.commit(sim.state, L.plan_add_holders(sim.state, [e.state], L.seq_holder("w")))
    try:
        L.check_cache(shared, sim.cache)
        raise AssertionError("check_cache accepted a StateImage held by a writer and a checkpoint")
    except L.IntegrityError as err:
        assert "StateImage" in str(err)
    page = e.kv[0][1][0]  # KV pages may be shared with a writer
    L.check_cache(L.commit(sim.state, L.plan_add_holders(sim.state, [page], L.seq_holder("w"))), sim.cache)


def test_bind5_a_resumed_request_forks_from_another_records_end_never_shares_its_state():
    sim = make()
    p_toks, e = _paused_behind_a_finished_record(sim)
    rid = e.owner[1]
    cand = [c for c in served(sim, p_toks, req="p") if c.cid == e.cid][0]
    # PAUSE-1: p keeps its own record; it neither takes over a's record nor Moves a's E
    assert cand.takeover == L.Takeover.FORK and cand.rid is None and not cand.retired
    state = _resume(sim, "p", cand)
    assert state != e.state and sim.state.objects[e.state].holders == {("ckpt", e.cid)}
    assert sim.cache.records[rid].end == e.cid and sim.cache.records[rid].active is None


def test_bind5_a_stale_move_candidate_on_resume_is_bound_as_a_fork():
    sim = make()
    p_toks, e = _paused_behind_a_finished_record(sim)
    rid = e.owner[1]
    cand = [c for c in served(sim, p_toks, req="p") if c.cid == e.cid][0]
    move = cand._replace(takeover=L.Takeover.MOVE, rid=rid)  # what query_sources used to return
    state = _resume(sim, "p", move)
    assert state != e.state and e.cid in sim.cache.checkpoints
    assert sim.cache.records[rid].end == e.cid and sim.cache.records[rid].active is None


def test_bind5_a_move_candidate_gone_stale_by_a_new_waiter_keeps_the_state_for_it():
    sim = make()
    full = _finished(sim, "a", toks(100), input_point=False)
    (e,) = points(sim, END)
    cand = [c for c in served(sim, full + [1], req="b") if c.cid == e.cid][0]
    assert cand.takeover == L.Takeover.MOVE
    w = [c for c in served(sim, full + [2], req="w") if c.cid == e.cid][0]
    sim.apply(L.plan_wait(sim.state, sim.cache, "w", w, ticket=7))  # after b's query
    res = L.plan_bind(sim.state, sim.cache, L.BindRequest("b", cand))
    sim.apply(res)  # check_cache: a Move would leave E kept for w, sharing b's StateImage
    view = [o for o in res.outcome if isinstance(o, View)][0]
    assert view.state_object != e.state and L.wait_holder("w") in sim.state.objects[e.state].holders


def test_wait3_a_paused_waiters_orphaned_point_is_moved_and_retired():
    sim = make()
    p_toks, e = _paused_behind_a_finished_record(sim)
    w = [c for c in served(sim, p_toks, req="p") if c.cid == e.cid][0]
    sim.apply(L.plan_wait(sim.state, sim.cache, "p", w, ticket=1, paused=True))
    _, vb = start(sim, "b", [c for c in p_toks[:170]] + [9, 9])  # a's owner moves on ...
    vb = compute(sim, vb, p_toks[:170] + [9, 9])
    end(sim, vb)  # ... and retires E: kept for the waiter p only (WAIT-1)
    assert sim.cache.checkpoints[e.cid].owner == ("wait", "p")
    cand = [c for c in served(sim, p_toks, req="p") if c.cid == e.cid][0]
    assert cand.takeover == L.Takeover.MOVE and cand.rid is None  # WAIT-3: its exclusive old point
    state = _resume(sim, "p", cand)
    assert state == e.state and e.cid not in sim.cache.checkpoints  # Moved, and the point retired
    assert sim.state.objects[state].holders == {L.seq_holder("p")}
