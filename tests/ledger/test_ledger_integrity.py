"""check_integrity recounts from first principles and catches every kind of drift."""
from __future__ import annotations

import pytest

import ledger as L
from ledger import arena as A
from ledger import extents as ex
from ledger_helpers import alloc, fresh, run, transfer


@pytest.fixture
def busy():
    s = fresh(main=8, slots=2)
    s, kv = alloc(s, 3)
    s = transfer(s, kv[:2], L.HOST_MEDIUM)
    s = run(s, L.plan_lease(s, kv[2:], L.DEVICE, "reader"))
    s = run(s, L.plan_unit_permit(s, L.UnitDemand("a", L.UnitKind.DECODE, {L.MAIN_KV: 2})))
    return s, kv


def test_integrity_holds_on_a_busy_state(busy):
    s, _ = busy
    rc = L.check_integrity(s)
    assert rc.pools[L.MAIN_KV] == {"capacity": 8, "used": 3, "free": 5, "reserved": 2}
    assert rc.host_used_bytes == 2 * 1024 and rc.leases == 1 and rc.permits == 1


def _obj(s, oid, **ch):
    return s._replace(objects=s.objects.set(oid, s.objects[oid]._replace(**ch)))


def _corruptions(s, kv):
    pool = s.pool(L.MAIN_KV)
    o = s.objects[kv[0]]
    yield "is free and used", s._replace(pools=s.pools.set(L.MAIN_KV, pool._replace(free=pool.free.set(o.device.location, None))))
    yield "reserved", s._replace(pools=s.pools.set(L.MAIN_KV, pool._replace(reserved=1)))
    yield "arena allocations", s._replace(arena=A.take(s.arena, 60000, 10))
    yield "lease", _obj(s, kv[0], leases=frozenset({777}))
    yield "no holder", _obj(s, kv[0], holders=frozenset())
    yield "used by objects", _obj(s, kv[1], device=s.objects[kv[0]].device)
    yield "no transaction", _obj(s, kv[0], host=o.host._replace(complete=False))
    yield "next_id", s._replace(next_id=2)
    yield "bytes, unit is", _obj(s, kv[0], device=o.device._replace(nbytes=5))
    yield "recovery_permit", s._replace(recovery_permit=99)
    split = ex.insert(ex.replace_at(s.arena.free, 0, 0, s.arena.free.offs[0][0], 100),
                      s.arena.free.offs[0][0] + 100, s.arena.free.lens[0][0] - 100)
    yield "not coalesced", s._replace(arena=s.arena._replace(free=split))
    yield "used_bytes", s._replace(arena=s.arena._replace(used_bytes=1))


def test_integrity_detects_every_corruption(busy):
    s, kv = busy
    for expect, bad in _corruptions(s, kv):
        with pytest.raises(L.IntegrityError, match=expect):
            L.check_integrity(bad)


def test_integrity_checks_the_transaction(busy):
    s, kv = busy
    p = L.plan_begin_transfer(s, L.TransferRequest(L.TxnKind.PAUSE, "t", kv[2:], L.HOST_MEDIUM))
    s = run(s, p)
    t = s.transaction
    with pytest.raises(L.IntegrityError, match="does not protect"):
        L.check_integrity(s._replace(transaction=t._replace(owner="intruder")))
    with pytest.raises(L.IntegrityError, match="pending replicas"):
        L.check_integrity(s._replace(transaction=t._replace(jobs=())))
