"""Plans and commit: evaluation is pure; a stale plan is refused whole (RCL-2)."""
from __future__ import annotations

import pytest

import ledger as L
from ledger_helpers import alloc, fresh, run


def _snapshot(s):
    return (L.usage(s), dict(s.objects.items()), dict(s.permits.items()), dict(s.leases.items()),
            s.transaction, s.next_id, s.version)


def test_evaluating_plans_changes_nothing():
    s = fresh(main=8)
    s, oids = alloc(s, 3)
    before = _snapshot(s)
    L.plan_allocate(s, L.MAIN_KV, 2, "x")
    L.plan_cycle_permits(s, [L.UnitDemand(i, L.UnitKind.DECODE, {L.MAIN_KV: 1}) for i in range(3)])
    L.plan_drop_holders(s, oids, "rec")
    L.plan_lease(s, oids, L.DEVICE, "r")
    L.plan_begin_transfer(s, L.TransferRequest(L.TxnKind.PAUSE, "t", oids, L.HOST_MEDIUM))
    assert _snapshot(s) == before


def test_commit_on_the_base_state_is_the_planned_result():
    s = fresh()
    p = L.plan_allocate(s, L.MAIN_KV, 1, "x")
    assert L.commit(s, p) is p.result
    assert p.result.version == s.version + 1


def test_plan_lists_its_preconditions():
    s = fresh(main=8)
    s, oids = alloc(s, 2)
    p = L.plan_drop_holders(s, oids, "rec")
    kinds = {(c.kind, c.subject) for c in p.preconditions}
    assert ("object_version", oids[0]) in kinds and ("object_version", oids[1]) in kinds
    assert ("units_used", L.MAIN_KV) in kinds
    q = L.plan_unit_permit(s, L.UnitDemand("a", L.UnitKind.DECODE, {L.MAIN_KV: 2}))
    assert L.Precondition("available", L.MAIN_KV, 2) in q.preconditions


def test_stale_plan_is_refused_whole_and_nothing_changes():
    s = fresh(main=8)
    s, oids = alloc(s, 2)
    drop = L.plan_drop_holders(s, oids, "rec")  # planned on s ...
    s2 = run(s, L.plan_add_holders(s, oids[1:], "other"))  # ... but object 2 changed since
    with pytest.raises(L.StalePlan):
        L.commit(s2, drop)
    assert s2.objects[oids[0]].holders == {"rec"}  # the first object's drop did not half-apply
    L.check_integrity(s2)


def test_independent_plans_replay_on_a_newer_state():
    s = fresh(main=8)
    p1 = L.plan_unit_permit(s, L.UnitDemand("a", L.UnitKind.DECODE, {L.MAIN_KV: 2}))
    s = run(s, p1)
    p2 = L.plan_unit_permit(s, L.UnitDemand("b", L.UnitKind.DECODE, {L.MAIN_KV: 3}))
    s = run(s, p2)
    settle_a = L.plan_settle(s, p1.proof.permits[0], "a")
    settle_b = L.plan_settle(s, p2.proof.permits[0], "b")
    s = run(s, settle_a)
    s = run(s, settle_b)  # replayed: its preconditions still hold
    assert s.pool(L.MAIN_KV).reserved == 0 and not s.permits


def test_stale_capacity_plan_is_refused():
    s = fresh(main=4)
    a = L.plan_unit_permit(s, L.UnitDemand("a", L.UnitKind.DECODE, {L.MAIN_KV: 3}))
    b = L.plan_unit_permit(s, L.UnitDemand("b", L.UnitKind.DECODE, {L.MAIN_KV: 3}))
    s1 = run(s, a)
    with pytest.raises(L.StalePlan):
        L.commit(s1, b)
    assert s1.pool(L.MAIN_KV).reserved == 3


def test_ids_are_never_reused_by_a_replayed_plan():
    s = fresh(main=8)
    a = L.plan_unit_permit(s, L.UnitDemand("a", L.UnitKind.DECODE, {L.MAIN_KV: 1}))
    b = L.plan_unit_permit(s, L.UnitDemand("b", L.UnitKind.DECODE, {L.MAIN_KV: 1}))
    assert a.proof.permits == b.proof.permits  # both planned the same fresh id
    s1 = run(s, a)
    s1 = run(s1, L.plan_settle(s1, a.proof.permits[0], "a"))  # the id is free again, yet
    with pytest.raises(L.StalePlan):  # TXN-2: a settled handle must never name a new permit
        L.commit(s1, b)


def test_double_commit_of_one_plan_is_stale():
    s = fresh(main=8)
    s, oids = alloc(s, 1)
    p = L.plan_drop_holders(s, oids, "rec")
    s1 = run(s, p)
    with pytest.raises(L.StalePlan):
        L.commit(s1, p)


def test_commit_rejects_a_refusal_and_a_foreign_config():
    s = fresh(main=1)
    r = L.plan_allocate(s, L.MAIN_KV, 1, "x")
    s = run(s, r)
    refusal = L.plan_allocate(s, L.MAIN_KV, 1, "y")
    with pytest.raises(L.InvalidRequest, match="shortfall"):
        L.commit(s, refusal)
    other = fresh(main=2)
    with pytest.raises(L.StalePlan):
        L.commit(other, L.plan_allocate(fresh(main=3), L.MAIN_KV, 1, "x"))
