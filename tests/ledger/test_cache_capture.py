"""Save opportunities and capture (SAVE-1..6)."""
from __future__ import annotations

from cache_helpers import L, SavePoint, capture, compute, make, points, start, toks
from ledger.outcomes import Carried, PrivateSaved, Retired, SharedSkipped

INPUT, SHARED = L.PointKind.INPUT, L.PointKind.SHARED


def test_save1_chunk_ends_are_no_save_opportunities():
    sim = make(chunk=32)
    sim.run("a", toks(300), [SavePoint(200)], output=(1, 2))
    assert sorted(c.kind for c in points(sim)) == ["E", "input"]  # nine chunks, one input point, one E


def test_save2_destination_device_slot_else_host():
    sim = make(slots=2, host=1 << 16)
    t = toks(200)
    _, v = start(sim, "a", t)  # the writer takes one slot
    v = compute(sim, v, t, 100)
    res = capture(sim, v, INPUT)
    first = [c for c in points(sim, INPUT)][0]
    assert sim.state.objects[first.state].device is not None
    v = compute(sim, v, t, 150)
    res = capture(sim, v, L.PointKind.ANCHOR)  # no slot left: a Host block
    anchor = [c for c in points(sim, L.PointKind.ANCHOR)][0]
    o = sim.state.objects[anchor.state]
    assert o.device is None and o.host is not None and any(isinstance(x, L.CopyToHost) for x in res.plan.effects)


def test_save2_a_private_input_point_first_retires_this_records_obsolete_one():
    sim = make(slots=2, host=0)
    t = toks(200)
    _, v = start(sim, "a", t)
    v = compute(sim, v, t, 100)
    capture(sim, v, INPUT)
    v = compute(sim, v, t)
    res = capture(sim, v, INPUT)  # the only spare slot is reused after retiring the old point
    assert res.ok and isinstance(res.outcome[0], Retired)
    assert [c.frontier for c in points(sim, INPUT)] == [200]


def test_save3_private_point_adds_only_state_shared_entry_copies_a_partial_tail():
    sim = make()
    t = toks(100)
    _, v = start(sim, "a", t)
    v = compute(sim, v, t)
    n_pages = len([o for o in sim.state.objects.values() if o.kind == L.KV_PAGE])
    capture(sim, v, INPUT)
    assert len([o for o in sim.state.objects.values() if o.kind == L.KV_PAGE]) == n_pages
    capture(sim, v, None, shared=True)
    assert len([o for o in sim.state.objects.values() if o.kind == L.KV_PAGE]) == n_pages + 1  # 100 % 64: tail copy
    (sh,) = points(sim, SHARED)
    assert dict(sh.kv)[L.MAIN_KV][0] == dict(v.kv)[L.MAIN_KV][0]  # the full page is shared


def test_save4_failing_the_shared_part_keeps_the_private_part():
    sim = make(main=2, slots=4)
    t = toks(100)
    _, v = start(sim, "a", t)
    v = compute(sim, v, t)  # both pages in use: no room for the shared tail copy
    res = capture(sim, v, INPUT, shared=True, allow_reclaim=False)
    kinds = [type(o) for o in res.outcome]
    assert PrivateSaved in kinds and SharedSkipped in kinds
    assert len(points(sim, INPUT)) == 1 and not points(sim, SHARED)


def test_save5_capture_without_room_is_skipped_and_never_preempts_an_active_request():
    sim = make(slots=2, host=0)
    _, va = start(sim, "a", toks(100))
    _, vb = start(sim, "b", toks(100, 5000))
    vb = compute(sim, vb, toks(100, 5000))
    before = (sim.state, sim.cache)
    res = capture(sim, vb, INPUT)
    assert isinstance(res, L.Refusal) and (sim.state, sim.cache) == before
    assert sim.state.objects[va.state].holders == {L.seq_holder("a")}


def test_save6_compatible_point_is_carried_and_recovery_permit_skips_captures():
    sim = make()
    t = toks(100)
    _, v = start(sim, "a", t)
    v = compute(sim, v, t)
    capture(sim, v, INPUT)
    n = len(sim.state.objects)
    res = capture(sim, v, INPUT)
    assert isinstance(res.outcome[0], Carried) and len(sim.state.objects) == n
    sim.apply(L.plan_unit_permit(sim.state, L.UnitDemand("z", L.UnitKind.RECOVERY, {L.MAIN_KV: 1})))
    res = capture(sim, v, L.PointKind.ANCHOR)
    assert isinstance(res, L.Refusal) and res.reason == "recovery_in_force"
