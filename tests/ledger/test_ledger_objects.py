"""Physical objects, holders, leases, pins, replicas (G-3, TXN-1, RCL-6, BIND-4)."""
from __future__ import annotations

import pytest

import ledger as L
from ledger_helpers import alloc, fresh, run, transfer


def test_g3_shared_object_is_billed_once():
    s = fresh(main=8)
    s, oids = alloc(s, 3, "rec-a")
    s = run(s, L.plan_add_holders(s, oids, "shared-entry"))
    s = run(s, L.plan_add_holders(s, oids[:1], "rec-b"))
    assert L.usage(s)["pools"][L.MAIN_KV]["used"] == 3
    assert s.objects[oids[0]].holders == {"rec-a", "shared-entry", "rec-b"}
    assert L.check_integrity(s).holders == 3 + 3 + 1


def test_g3_dropping_a_reference_may_free_nothing():
    s = fresh(main=8)
    s, oids = alloc(s, 2, "rec-a")
    s = run(s, L.plan_add_holders(s, oids[:1], "shared"))
    p = L.plan_drop_holders(s, oids, "rec-a")
    assert p.proof.freed == (oids[1],) and p.proof.kept == (oids[0],)
    s = run(s, p)
    assert s.pool(L.MAIN_KV).available == 7
    p = L.plan_drop_holders(s, oids[:1], "shared")
    assert p.proof.freed == (oids[0],)
    s = run(s, p)
    assert s.pool(L.MAIN_KV).available == 8 and not s.objects


def test_txn1_reader_lease_defers_the_release_of_the_last_holder():
    s = fresh(main=4)
    s, oids = alloc(s, 1, "rec")
    lp = L.plan_lease(s, oids, L.DEVICE, "step-7")
    s = run(s, lp)
    p = L.plan_drop_holders(s, oids, "rec")
    assert p.proof.freed == () and p.proof.kept == tuple(oids)
    s = run(s, p)
    assert s.pool(L.MAIN_KV).available == 3  # still read: not freed
    with pytest.raises(L.NotAHolder):
        L.plan_add_holders(s, oids, "late")  # being released: cannot be adopted
    rp = L.plan_release_leases(s, lp.proof.leases, "step-7")
    assert rp.proof.freed == tuple(oids)
    s = run(s, rp)
    assert s.pool(L.MAIN_KV).available == 4 and not s.leases


def test_txn1_lease_release_by_a_non_holder_and_twice_are_typed():
    s = fresh()
    s, oids = alloc(s, 1)
    lp = L.plan_lease(s, oids, L.DEVICE, "reader")
    s = run(s, lp)
    with pytest.raises(L.NotAHolder):
        L.plan_release_leases(s, lp.proof.leases, "someone-else")
    s2 = run(s, L.plan_release_leases(s, lp.proof.leases, "reader"))
    with pytest.raises(L.UnknownLease):
        L.plan_release_leases(s2, lp.proof.leases, "reader")


def test_pin_keeps_the_device_replica_and_defers_release():
    s = fresh(main=4)
    s, oids = alloc(s, 1, "rec")
    s = transfer(s, oids, L.HOST_MEDIUM)  # now on Device and Host
    s = run(s, L.plan_pin(s, oids, "writer"))
    r = L.plan_drop_replica(s, oids[0], L.DEVICE)
    assert isinstance(r, L.Refusal) and r.reason == "protected"
    with pytest.raises(L.AlreadyHolder):
        L.plan_pin(s, oids, "writer")
    s = run(s, L.plan_drop_holders(s, oids, "rec"))
    assert oids[0] in s.objects
    with pytest.raises(L.NotAHolder):
        L.plan_unpin(s, oids, "other")
    p = L.plan_unpin(s, oids, "writer")
    assert p.proof.freed == tuple(oids)
    s = run(s, p)
    assert s.arena.used_bytes == 0 and s.pool(L.MAIN_KV).available == 4


def test_rcl6_drop_device_replica_when_host_copy_is_complete():
    s = fresh(main=4)
    s, oids = alloc(s, 2, "rec")
    s = transfer(s, oids, L.HOST_MEDIUM)
    s = run(s, L.plan_drop_replica(s, oids[0], L.DEVICE))
    assert s.objects[oids[0]].device is None and s.pool(L.MAIN_KV).available == 3
    with pytest.raises(L.ReplicaError):  # the Host copy is now its only one: deletion, not a drop
        L.plan_drop_replica(s, oids[0], L.HOST_MEDIUM)
    with pytest.raises(L.ReplicaError):
        L.plan_drop_replica(s, oids[0], L.DEVICE)
    s = run(s, L.plan_drop_replica(s, oids[1], L.HOST_MEDIUM))
    assert s.objects[oids[1]].host is None


def test_lease_on_a_host_replica_protects_only_that_replica():
    s = fresh(main=4)
    s, oids = alloc(s, 1, "rec")
    s = transfer(s, oids, L.HOST_MEDIUM)
    s = run(s, L.plan_lease(s, oids, L.HOST_MEDIUM, "reader"))
    assert isinstance(L.plan_drop_replica(s, oids[0], L.HOST_MEDIUM), L.Refusal)
    s = run(s, L.plan_drop_replica(s, oids[0], L.DEVICE))


def test_bind4_copy_on_write_makes_a_private_tail_page():
    s = fresh(main=4)
    s, oids = alloc(s, 1, "shared")
    p = L.plan_copy_on_write(s, oids[0], "branch", content="tail-v2")
    s = run(s, p)
    (new_id, pool, unit), = p.proof.allocated
    assert p.effects == (L.CopyUnit(L.MAIN_KV, s.objects[oids[0]].device.location, unit),)
    assert s.objects[new_id].holders == {"branch"} and s.objects[new_id].content == "tail-v2"
    s = run(s, L.plan_drop_holders(s, [oids[0]], "shared"))
    s = run(s, L.plan_drop_holders(s, [new_id], "branch"))
    assert s.pool(L.MAIN_KV).available == 4


def test_allocate_state_image_slot_and_content_identity():
    s = fresh(slots=2)
    p = L.plan_allocate(s, L.STATE_POOL, 2, "rec", contents=["ckp-1", "ckp-2"])
    s = run(s, p)
    objs = [s.objects[a[0]] for a in p.proof.allocated]
    assert [o.kind for o in objs] == [L.STATE_IMAGE] * 2 and [o.content for o in objs] == ["ckp-1", "ckp-2"]
    r = L.plan_allocate(s, L.STATE_POOL, 1, "rec")
    assert isinstance(r, L.Refusal) and dict(r.shortfall.pools) == {L.STATE_POOL: 1}


def test_pages_with_the_same_holders_share_one_new_holder_set():
    # issue 15: a context's pages change holders together; each change makes one new set per
    # distinct old set, not one per page, and every page still gets its own version bump
    s = fresh(main=16)
    s, a = alloc(s, 6, "rec-a")
    s = run(s, L.plan_add_holders(s, a[:3], "shared"))
    before = {o: s.objects[o] for o in a}
    p = L.plan_add_holders(s, a, "ckpt-1")
    s = run(s, p)
    sets = {id(s.objects[o].holders) for o in a}
    assert len(sets) == 2  # {rec-a, shared, ckpt-1} and {rec-a, ckpt-1}
    assert all(s.objects[o].holders == before[o].holders | {"ckpt-1"} for o in a)
    assert all(s.objects[o].version == before[o].version + 1 for o in a)
    assert all(s.objects[o]._replace(version=0, holders=None) == before[o]._replace(version=0, holders=None)
               for o in a)
    p = L.plan_drop_holders(s, a, "rec-a")
    s = run(s, p)
    assert len({id(s.objects[o].holders) for o in a}) == 2
    assert all(s.objects[o].holders == before[o].holders - {"rec-a"} | {"ckpt-1"} for o in a)
    L.check_integrity(s)


def test_a_holder_plan_replays_on_a_newer_state_and_refuses_a_changed_page():
    s = fresh(main=16)
    s, a = alloc(s, 4, "rec-a")
    p = L.plan_add_holders(s, a, "ckpt-1")
    newer = run(s, L.plan_lease(s, a[3:], L.DEVICE, "reader"))  # another change, to another object...
    newer = run(newer, L.plan_release_leases(newer, newer.objects[a[3]].leases, "reader"))
    with pytest.raises(L.StalePlan):  # ...whose version moved: the whole plan is refused
        L.commit(newer, p)
    other = run(s, L.plan_add_holders(s, [a[0]], "rec-b"))
    p = L.plan_add_holders(s, a[1:], "ckpt-1")
    got = L.commit(other, p)  # the pages it names are unchanged: it replays
    assert all("ckpt-1" in got.objects[o].holders for o in a[1:]) and "rec-b" in got.objects[a[0]].holders
    L.check_integrity(got)
