"""Bad input gets a typed error and leaves the ledger unchanged (doctrine 3, docs/rules.md)."""
from __future__ import annotations

import pytest

import ledger as L
from ledger_helpers import alloc, config, fresh, run

D = L.UnitKind.DECODE


@pytest.fixture(scope="module")
def world():
    s = fresh(main=8, slots=2)
    s, kv = alloc(s, 2, "rec")
    p = L.plan_unit_permit(s, L.UnitDemand("a", D, {L.MAIN_KV: 1}))
    s = run(s, p)
    lp = L.plan_lease(s, kv[:1], L.DEVICE, "reader")
    s = run(s, lp)
    settled = L.plan_unit_permit(s, L.UnitDemand("z", D, {L.MAIN_KV: 1}))
    s = run(s, settled)
    s = run(s, L.plan_settle(s, settled.proof.permits[0], "z"))
    return s, kv, p.proof.permits[0], lp.proof.leases[0], settled.proof.permits[0]


CASES = [
    # (name, error, call(state, kv, permit, lease, settled))
    ("alloc negative", L.InvalidRequest, lambda s, kv, p, l, x: L.plan_allocate(s, L.MAIN_KV, -1, "h")),
    ("alloc zero", L.InvalidRequest, lambda s, kv, p, l, x: L.plan_allocate(s, L.MAIN_KV, 0, "h")),
    ("alloc absurd", L.ExceedsCapacity, lambda s, kv, p, l, x: L.plan_allocate(s, L.MAIN_KV, 1 << 40, "h")),
    ("alloc float", L.InvalidRequest, lambda s, kv, p, l, x: L.plan_allocate(s, L.MAIN_KV, 1.0, "h")),
    ("alloc bool", L.InvalidRequest, lambda s, kv, p, l, x: L.plan_allocate(s, L.MAIN_KV, True, "h")),
    ("alloc unknown pool", L.InvalidRequest, lambda s, kv, p, l, x: L.plan_allocate(s, "nope", 1, "h")),
    ("alloc unhashable holder", L.InvalidRequest, lambda s, kv, p, l, x: L.plan_allocate(s, L.MAIN_KV, 1, ["h"])),
    ("alloc contents mismatch", L.InvalidRequest, lambda s, kv, p, l, x: L.plan_allocate(s, L.MAIN_KV, 2, "h", contents=[1])),
    ("alloc from settled permit", L.UnknownPermit, lambda s, kv, p, l, x: L.plan_allocate(s, L.MAIN_KV, 1, "z", permit_id=x)),
    ("alloc from foreign permit", L.NotAHolder, lambda s, kv, p, l, x: L.plan_allocate(s, L.MAIN_KV, 1, "b", permit_id=p)),
    ("demand negative", L.InvalidRequest, lambda s, kv, p, l, x: L.plan_unit_permit(s, L.UnitDemand("a", D, {L.MAIN_KV: -2}))),
    ("demand absurd", L.ExceedsCapacity, lambda s, kv, p, l, x: L.plan_unit_permit(s, L.UnitDemand("a", D, {L.MAIN_KV: 10 ** 12}))),
    ("demand float", L.InvalidRequest, lambda s, kv, p, l, x: L.plan_unit_permit(s, L.UnitDemand("a", D, {L.MAIN_KV: 0.5}))),
    ("demand unknown pool", L.InvalidRequest, lambda s, kv, p, l, x: L.plan_unit_permit(s, L.UnitDemand("a", D, {"x": 1}))),
    ("demand kind", L.InvalidRequest, lambda s, kv, p, l, x: L.plan_unit_permit(s, L.UnitDemand("a", "warp", {}))),
    ("demand not mapping", L.InvalidRequest, lambda s, kv, p, l, x: L.plan_unit_permit(s, L.UnitDemand("a", D, [1]))),
    ("demand wrong type", L.InvalidRequest, lambda s, kv, p, l, x: L.plan_unit_permit(s, {"main_kv": 1})),
    ("batch with one bad row", L.InvalidRequest, lambda s, kv, p, l, x: L.plan_cycle_permits(
        s, [L.UnitDemand("a", D, {L.MAIN_KV: 1}), L.UnitDemand("b", D, {L.MAIN_KV: -1})])),
    ("drop by non-holder", L.NotAHolder, lambda s, kv, p, l, x: L.plan_drop_holders(s, kv, "stranger")),
    ("drop repeated id", L.InvalidRequest, lambda s, kv, p, l, x: L.plan_drop_holders(s, [kv[0], kv[0]], "rec")),
    ("drop unknown object", L.UnknownObject, lambda s, kv, p, l, x: L.plan_drop_holders(s, [999], "rec")),
    ("drop empty", L.InvalidRequest, lambda s, kv, p, l, x: L.plan_drop_holders(s, [], "rec")),
    ("drop string ids", L.InvalidRequest, lambda s, kv, p, l, x: L.plan_drop_holders(s, "12", "rec")),
    ("add holder twice", L.AlreadyHolder, lambda s, kv, p, l, x: L.plan_add_holders(s, kv, "rec")),
    ("lease bad medium", L.InvalidRequest, lambda s, kv, p, l, x: L.plan_lease(s, kv, "tape", "r")),
    ("lease missing replica", L.ReplicaError, lambda s, kv, p, l, x: L.plan_lease(s, kv, L.HOST_MEDIUM, "r")),
    ("release lease non-holder", L.NotAHolder, lambda s, kv, p, l, x: L.plan_release_leases(s, [l], "other")),
    ("release unknown lease", L.UnknownLease, lambda s, kv, p, l, x: L.plan_release_leases(s, [l + 1000], "reader")),
    ("settle twice", L.UnknownPermit, lambda s, kv, p, l, x: L.plan_settle(s, x, "z")),
    ("settle by non-owner", L.NotAHolder, lambda s, kv, p, l, x: L.plan_settle(s, p, "b")),
    ("settle bad id", L.UnknownPermit, lambda s, kv, p, l, x: L.plan_settle(s, "p", "a")),
    ("unpin not pinned", L.NotAHolder, lambda s, kv, p, l, x: L.plan_unpin(s, kv, "w")),
    ("complete older generation", L.StaleGeneration, lambda s, kv, p, l, x: L.plan_complete(s, 1)),
    ("cancel without transaction", L.StaleGeneration, lambda s, kv, p, l, x: L.plan_cancel(s, 3)),
    ("drop only replica", L.ReplicaError, lambda s, kv, p, l, x: L.plan_drop_replica(s, kv[1], L.DEVICE)),
    ("cow unknown", L.UnknownObject, lambda s, kv, p, l, x: L.plan_copy_on_write(s, 4242, "b")),
]


@pytest.mark.parametrize("name,error,call", CASES, ids=[c[0] for c in CASES])
def test_bad_input_raises_typed_error_and_leaves_ledger_unchanged(world, name, error, call):
    s, kv, permit, lease, settled = world
    before = (L.usage(s), dict(s.objects.items()), dict(s.permits.items()), dict(s.leases.items()), s.version)
    with pytest.raises(error):
        call(s, kv, permit, lease, settled)
    assert (L.usage(s), dict(s.objects.items()), dict(s.permits.items()), dict(s.leases.items()), s.version) == before
    L.check_integrity(s)


@pytest.mark.parametrize("bad", [
    lambda: L.LedgerConfig((L.PoolSpec("main_kv", L.KV_PAGES, -1, 10, 64),), 0),
    lambda: L.LedgerConfig((L.PoolSpec("main_kv", L.KV_PAGES, 1 << 40, 10, 64),), 0),
    lambda: L.LedgerConfig((L.PoolSpec("main_kv", L.KV_PAGES, 4, 0, 64),), 0),
    lambda: L.LedgerConfig((L.PoolSpec("main_kv", L.KV_PAGES, 4, 10, 0),), 0),
    lambda: L.LedgerConfig((L.PoolSpec("main_kv", "disk", 4, 10, 64),), 0),
    lambda: L.LedgerConfig((L.PoolSpec("a", L.STATE_SLOTS, 4, 10),) * 2, 0),
    lambda: L.LedgerConfig((L.PoolSpec(L.HOST, L.STATE_SLOTS, 4, 10),), 0),
    lambda: config()._replace(host_capacity_bytes=-5),
    lambda: config()._replace(host_capacity_bytes=1 << 60),
])
def test_bad_config_is_rejected(bad):
    with pytest.raises(L.InvalidRequest):
        L.initial_state(bad())
