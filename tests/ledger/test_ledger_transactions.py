"""Context transactions (TXN-1, TXN-2), destinations charged from reservation (CFG-5), HOST-1/3."""
from __future__ import annotations

import pytest

import ledger as L
from ledger_helpers import PAGE, SLOT, alloc, fresh, run, transfer


def _begin(s, oids, to=L.HOST_MEDIUM, owner="txn", **kw):
    kw.setdefault("kind", L.TxnKind.DEMOTION)
    kind = kw.pop("kind")
    p = L.plan_begin_transfer(s, L.TransferRequest(kind, owner, oids, to, **kw))
    assert isinstance(p, L.Plan), p
    return run(s, p), p.proof.generation, p


def test_txn1_steps_lease_reserve_submit_complete_publish_release():
    s = fresh(main=8)
    s, oids = alloc(s, 3)
    s, g, p = _begin(s, oids, drop_source=True)
    assert len(p.proof.leases) == 3 and len(p.proof.host_placed) == 3
    # CFG-5: the destination is charged from reservation on
    assert s.arena.used_bytes == 3 * PAGE
    assert all(not s.objects[o].host.complete for o in oids)
    sub = L.plan_submit(s, g)
    assert [type(e) for e in sub.effects] == [L.CopyToHost] * 3
    s = run(s, sub)
    s = run(s, L.plan_complete(s, g))
    assert s.arena.used_bytes == 3 * PAGE  # completion does not change occupancy
    s = run(s, L.plan_publish(s, g))
    assert s.arena.used_bytes == 3 * PAGE  # neither does publishing (CFG-5)
    assert all(s.objects[o].host.complete and s.objects[o].device is None for o in oids)
    assert s.transaction is None and not s.leases and s.pool(L.MAIN_KV).available == 8


def test_txn1_at_most_one_context_transaction():
    s = fresh(main=8)
    s, oids = alloc(s, 2)
    s, g, _ = _begin(s, oids[:1])
    r = L.plan_begin_transfer(s, L.TransferRequest(L.TxnKind.CAPTURE, "other", oids[1:], L.HOST_MEDIUM))
    assert isinstance(r, L.Refusal) and r.reason == "transaction_busy"


def test_txn2_cancel_before_submit_reverts_the_reservation():
    s0 = fresh(main=8)
    s0, oids = alloc(s0, 2)
    s, g, _ = _begin(s0, oids, to=L.HOST_MEDIUM,
                     permit=L.UnitDemand("seq", L.UnitKind.DECODE, {L.MAIN_KV: 2}))
    assert s.pool(L.MAIN_KV).reserved == 2 and s.arena.used_bytes == 2 * PAGE
    s = run(s, L.plan_cancel(s, g))
    assert s.arena.used_bytes == 0 and s.pool(L.MAIN_KV).reserved == 0 and not s.leases and not s.permits
    assert s.transaction is None
    assert L.check_integrity(s) == L.check_integrity(s0)
    with pytest.raises(L.StaleGeneration):
        L.plan_submit(s, g)


def test_txn2_cancel_after_submit_waits_for_the_real_reader():
    s = fresh(main=8)
    s, oids = alloc(s, 2)
    s, g, _ = _begin(s, oids)
    s = run(s, L.plan_submit(s, g))
    s = run(s, L.plan_cancel(s, g))
    assert s.transaction.phase == L.TxnPhase.CANCELLING
    assert s.arena.used_bytes == 2 * PAGE and len(s.leases) == 2  # still being copied
    with pytest.raises(L.TransactionStateError):
        L.plan_publish(s, g)
    s = run(s, L.plan_complete(s, g))  # the reader finished: now revert
    assert s.transaction is None and s.arena.used_bytes == 0 and not s.leases
    assert all(s.objects[o].host is None for o in oids)


def test_txn2_late_completion_from_an_older_generation_is_harmless():
    s = fresh(main=8)
    s, oids = alloc(s, 2)
    s, g1, _ = _begin(s, oids[:1])
    s = run(s, L.plan_cancel(s, g1))
    s, g2, _ = _begin(s, oids[1:])  # the descriptor is reused by a newer transaction
    s = run(s, L.plan_submit(s, g2))
    before = s
    with pytest.raises(L.StaleGeneration):
        L.plan_complete(s, g1)
    with pytest.raises(L.StaleGeneration):
        L.plan_publish(s, g1)
    assert s is before and s.transaction.generation == g2 and s.transaction.phase == L.TxnPhase.SUBMITTED


def test_txn2_incomplete_replica_is_never_a_source():
    s = fresh(main=8)
    s, oids = alloc(s, 1)
    s, g, _ = _begin(s, oids)
    with pytest.raises(L.ReplicaError):
        L.plan_lease(s, oids, L.HOST_MEDIUM, "reader")
    with pytest.raises(L.ReplicaError):
        L.plan_drop_replica(s, oids[0], L.DEVICE)  # the Host copy is not complete yet


def test_txn2_first_bind_takes_the_unit_permit_jointly():
    s = fresh(main=4, slots=2)
    s, oids = alloc(s, 2)
    s = transfer(s, oids, L.HOST_MEDIUM, drop=True)  # now Host only
    assert s.pool(L.MAIN_KV).available == 4
    req = L.TransferRequest(L.TxnKind.BIND, "seq", oids, L.DEVICE,
                            permit=L.UnitDemand("seq", L.UnitKind.PREFILL, {L.MAIN_KV: 3}))
    r = L.plan_begin_transfer(s, req)  # 2 destinations + 3 permit pages > 4: short by exactly 1
    assert isinstance(r, L.Refusal) and dict(r.shortfall.pools) == {L.MAIN_KV: 1}
    req = req._replace(permit=L.UnitDemand("seq", L.UnitKind.PREFILL, {L.MAIN_KV: 2}))
    s, g, p = _begin(s, oids, to=L.DEVICE, kind=L.TxnKind.BIND, permit=req.permit)
    assert s.pool(L.MAIN_KV).available == 0 and len(p.proof.allocated) == 2 and len(p.proof.permits) == 1
    sub = L.plan_submit(s, g)
    assert [type(e) for e in sub.effects] == [L.CopyToDevice] * 2
    for step in (L.plan_submit, L.plan_complete, L.plan_publish):
        s = run(s, step(s, g))
    assert all(s.objects[o].device.complete for o in oids)
    assert s.permits[p.proof.permits[0]].owner == "seq"  # the permit stays with the bound request


def test_txn2_paused_recovery_bind_takes_the_recovery_permit():
    s = fresh(main=8, slots=2)
    s, oids = alloc(s, 1, pool=L.STATE_POOL)
    s = transfer(s, oids, L.HOST_MEDIUM, drop=True)
    rec = L.UnitDemand("paused", L.UnitKind.RECOVERY, {L.MAIN_KV: 4})
    s, g, p = _begin(s, oids, to=L.DEVICE, kind=L.TxnKind.BIND, owner="paused", permit=rec)
    assert s.recovery_permit == p.proof.permits[0]
    s = run(s, L.plan_cancel(s, g))  # reverting the bind reverts the recovery permit too
    assert s.recovery_permit is None and s.pool(L.MAIN_KV).reserved == 0


def test_host1_transfer_needs_contiguous_room_not_just_bytes():
    s = fresh(main=8, slots=2, host=4 * PAGE + SLOT - 1)
    s, st = alloc(s, 1, pool=L.STATE_POOL)
    s, kv = alloc(s, 4)
    r = L.plan_begin_transfer(s, L.TransferRequest(L.TxnKind.CAPTURE, "t", st + kv, L.HOST_MEDIUM))
    assert isinstance(r, L.Refusal)
    assert r.shortfall.pools[L.HOST] == 1 and r.shortfall.host.bytes_missing == 1
    # fragmentation: enough free bytes in total, but no extent a StateImage fits in
    s = fresh(main=8, slots=2, host=8 * PAGE)  # a slot is 4 pages
    s, kv = alloc(s, 8)
    s = transfer(s, kv, L.HOST_MEDIUM, drop=True)
    s = run(s, L.plan_drop_holders(s, kv[0::2], "rec"))  # every other Host page free
    s, st = alloc(s, 1, pool=L.STATE_POOL)
    assert s.arena.free_bytes == SLOT
    free_before = s.arena.free_bytes
    r = L.plan_begin_transfer(s, L.TransferRequest(L.TxnKind.CAPTURE, "t", st, L.HOST_MEDIUM))
    assert isinstance(r, L.Refusal) and r.shortfall.host.unplaced == (SLOT,)
    assert r.shortfall.host.bytes_missing == 0 and L.HOST not in r.shortfall.pools
    assert r.shortfall.host.largest_free_extent == PAGE and free_before == s.arena.free_bytes


def test_host3_kv_destinations_in_page_groups_halved_when_needed():
    s = fresh(main=8, host=8 * PAGE)
    s, kv = alloc(s, 8)
    s = transfer(s, kv, L.HOST_MEDIUM, drop=True)
    # free host pages 1, 2, 5, 6 (two holes of 2 pages each)
    s = run(s, L.plan_drop_holders(s, [kv[1], kv[2], kv[5], kv[6]], "rec"))
    s, new = alloc(s, 4)
    s, g, p = _begin(s, new, page_group=4)  # a 4-page group fits nowhere; halves of 2 fit the holes
    offs = [off for _, off in p.proof.host_placed]
    assert offs == [1 * PAGE, 2 * PAGE, 5 * PAGE, 6 * PAGE]


def test_txn_last_holder_leaving_during_copy_frees_on_publish():
    s = fresh(main=4)
    s, oids = alloc(s, 1)
    s, g, _ = _begin(s, oids)
    s = run(s, L.plan_drop_holders(s, oids, "rec"))
    assert oids[0] in s.objects
    with pytest.raises(L.NotAHolder):  # the transaction's lease ends only with the transaction
        L.plan_release_leases(s, s.transaction.leases, "txn")
    for step in (L.plan_submit, L.plan_complete, L.plan_publish):
        s = run(s, step(s, g))
    assert not s.objects and s.arena.used_bytes == 0 and s.pool(L.MAIN_KV).available == 4


def test_demotion_keeps_a_source_replica_still_read_by_another_lease():
    s = fresh(main=4)
    s, oids = alloc(s, 1)
    s = run(s, L.plan_lease(s, oids, L.DEVICE, "step"))
    s, g, _ = _begin(s, oids, drop_source=True)
    for step in (L.plan_submit, L.plan_complete):
        s = run(s, step(s, g))
    p = L.plan_publish(s, g)
    assert p.proof.kept == tuple(oids)
    s = run(s, p)
    assert s.objects[oids[0]].device is not None and s.objects[oids[0]].host.complete


def test_transfer_bad_requests_are_typed():
    s = fresh(main=4)
    s, oids = alloc(s, 1)
    with pytest.raises(L.ReplicaError):  # no Host replica to bind from
        L.plan_begin_transfer(s, L.TransferRequest(L.TxnKind.BIND, "t", oids, L.DEVICE))
    with pytest.raises(L.InvalidRequest):
        L.plan_begin_transfer(s, L.TransferRequest("teleport", "t", oids, L.HOST_MEDIUM))
    with pytest.raises(L.InvalidRequest):
        L.plan_begin_transfer(s, L.TransferRequest(L.TxnKind.PAUSE, "t", oids, "disk"))
    with pytest.raises(L.InvalidRequest):
        L.plan_begin_transfer(s, L.TransferRequest(L.TxnKind.PAUSE, "t", oids + oids, L.HOST_MEDIUM))
    with pytest.raises(L.UnknownObject):
        L.plan_begin_transfer(s, L.TransferRequest(L.TxnKind.PAUSE, "t", [999], L.HOST_MEDIUM))
    s2 = transfer(s, oids, L.HOST_MEDIUM)
    with pytest.raises(L.ReplicaError):  # already on Host
        L.plan_begin_transfer(s2, L.TransferRequest(L.TxnKind.PAUSE, "t", oids, L.HOST_MEDIUM))
    with pytest.raises(L.StaleGeneration):
        L.plan_complete(s, 12345)
    with pytest.raises(L.InvalidRequest):
        L.plan_complete(s, "12345")


def test_txn2_owner_check_on_the_pending_handle():
    s = fresh(main=4)
    s, oids = alloc(s, 1)
    s, g, _ = _begin(s, oids, owner="seq-7")
    with pytest.raises(L.NotAHolder):
        L.plan_submit(s, g, owner="seq-8")
    s = run(s, L.plan_submit(s, g, owner="seq-7"))
    assert s.transaction.phase == L.TxnPhase.SUBMITTED
