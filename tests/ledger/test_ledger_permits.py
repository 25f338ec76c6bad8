"""Reservations and unit permits (RES-1..5, SCH-7)."""
from __future__ import annotations

import pytest

import ledger as L
from ledger_helpers import fresh, run

D = L.UnitKind.DECODE


def _demand(owner, main=0, slots=0, backend=0, kind=D):
    amounts = {L.MAIN_KV: main, L.STATE_POOL: slots}
    if backend:
        amounts["backend_kv:mtp"] = backend
    return L.UnitDemand(owner, kind, amounts)


def test_res2_joint_request_all_or_nothing_with_exact_shortfall():
    s = fresh(main=4, slots=2, backend=3)
    s = run(s, L.plan_unit_permit(s, _demand("a", main=3, slots=1, backend=1)))
    r = L.plan_unit_permit(s, _demand("b", main=2, slots=2, backend=3))
    assert isinstance(r, L.Refusal) and r.reason == "shortfall" and not r.ok
    assert dict(r.shortfall.pools) == {L.MAIN_KV: 1, L.STATE_POOL: 1, "backend_kv:mtp": 1}
    # nothing was reserved by the refused request
    assert s.pool(L.MAIN_KV).reserved == 3 and s.pool("backend_kv:mtp").reserved == 1
    assert s.pool(L.STATE_POOL).reserved == 1


def test_res2_a_demand_beyond_a_pools_capacity_can_never_be_granted():
    s = fresh(main=4, slots=2)
    with pytest.raises(L.ExceedsCapacity):
        L.plan_unit_permit(s, _demand("b", main=5))


def test_res2_one_short_pool_reserves_no_other_pool():
    s = fresh(main=4, slots=2)
    s = run(s, L.plan_unit_permit(s, _demand("x", slots=1)))
    r = L.plan_unit_permit(s, _demand("a", main=4, slots=2))
    assert dict(r.shortfall.pools) == {L.STATE_POOL: 1}
    assert L.check_integrity(s).pools[L.MAIN_KV]["reserved"] == 0


def test_res3_cycle_grants_the_runnable_subset_in_order():
    s = fresh(main=5)
    p = L.plan_cycle_permits(s, [_demand(i, main=2) for i in range(4)])
    rows = p.proof.rows
    assert isinstance(rows[0], int) and isinstance(rows[1], int)
    assert isinstance(rows[2], L.Refusal) and dict(rows[2].shortfall.pools) == {L.MAIN_KV: 1}
    assert isinstance(rows[3], L.Refusal)
    s = run(s, p)
    assert s.pool(L.MAIN_KV).available == 1


def test_res3_fresh_admission_spends_only_surplus():
    s = fresh(main=4)
    s = run(s, L.plan_unit_permit(s, _demand("old", main=3)))
    r = L.plan_unit_permit(s, _demand("fresh", main=2))
    assert isinstance(r, L.Refusal) and dict(r.shortfall.pools) == {L.MAIN_KV: 1}
    # and allocation outside permits cannot dip into the reservation either
    r = L.plan_allocate(s, L.MAIN_KV, 2, "fresh")
    assert isinstance(r, L.Refusal) and dict(r.shortfall.pools) == {L.MAIN_KV: 1}


def test_res3_settle_returns_the_unused_reservation():
    s = fresh(main=8)
    p = L.plan_unit_permit(s, _demand("a", main=3))
    s = run(s, p)
    pid = p.proof.permits[0]
    s = run(s, L.plan_allocate(s, L.MAIN_KV, 1, "rec-a", permit_id=pid, owner="a"))
    assert s.pool(L.MAIN_KV).reserved == 2 and s.pool(L.MAIN_KV).available == 5
    st = L.plan_settle(s, pid, "a")
    assert st.proof.released == ((L.MAIN_KV, 2),)
    s = run(s, st)
    assert s.pool(L.MAIN_KV).reserved == 0 and s.pool(L.MAIN_KV).available == 7
    assert not s.permits


def test_res3_allocation_beyond_the_permit_is_an_overdraw():
    s = fresh(main=8)
    p = L.plan_unit_permit(s, _demand("a", main=1))
    s = run(s, p)
    with pytest.raises(L.PermitOverdraw):
        L.plan_allocate(s, L.MAIN_KV, 2, "rec", permit_id=p.proof.permits[0], owner="a")
    with pytest.raises(L.PermitOverdraw):
        L.plan_allocate(s, L.STATE_POOL, 1, "rec", permit_id=p.proof.permits[0], owner="a")


def test_res5_sch7_one_recovery_permit_at_a_time():
    s = fresh(main=8, slots=4)
    p = L.plan_unit_permit(s, _demand("paused-1", main=3, slots=1, kind=L.UnitKind.RECOVERY))
    s = run(s, p)
    pid = p.proof.permits[0]
    assert isinstance(s.permits[pid], L.RecoveryPermit) and s.recovery_permit == pid
    r = L.plan_unit_permit(s, _demand("paused-2", main=1, kind=L.UnitKind.RECOVERY))
    assert isinstance(r, L.Refusal) and r.reason == "recovery_permit_held"
    # held across Replay chunks: allocations draw from it, it stays until settled
    s = run(s, L.plan_allocate(s, L.MAIN_KV, 2, "rec", permit_id=pid, owner="paused-1"))
    s = run(s, L.plan_allocate(s, L.MAIN_KV, 1, "rec2", permit_id=pid, owner="paused-1"))
    assert s.recovery_permit == pid
    s = run(s, L.plan_settle(s, pid, "paused-1"))
    assert s.recovery_permit is None
    assert isinstance(L.plan_unit_permit(s, _demand("paused-2", main=1, kind=L.UnitKind.RECOVERY)), L.Plan)


def test_res3_double_settle_and_foreign_settle_are_typed_errors():
    s = fresh()
    p = L.plan_unit_permit(s, _demand("a", main=1))
    s = run(s, p)
    pid = p.proof.permits[0]
    with pytest.raises(L.NotAHolder):
        L.plan_settle(s, pid, "b")
    s2 = run(s, L.plan_settle(s, pid, "a"))
    with pytest.raises(L.UnknownPermit):
        L.plan_settle(s2, pid, "a")
    with pytest.raises(L.InvalidRequest):
        L.plan_settle_all(s, [(pid, "a"), (pid, "a")])


def test_res1_zero_demand_is_a_permit_with_nothing_reserved():
    s = fresh()
    p = L.plan_unit_permit(s, _demand("ctl", kind=L.UnitKind.CONTROL))
    s = run(s, p)
    assert s.pool(L.MAIN_KV).reserved == 0 and len(s.permits) == 1
