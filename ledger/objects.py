"""Physical objects: allocation, holders (logical references), reader leases, pins, replicas.

G-3: a physical object is billed once however many holders point at it; dropping a holder
frees bytes only when it was the last holder and no lease or pin protects the object. A
reader lease protects one replica while it is read (TXN-1); a pin keeps the Device replica
where it is (an active writer). Both defer the release of an object whose last holder left.
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Hashable, Iterable, Sequence

from ledger import validate as v
from ledger.effects import CopyUnit
from ledger.errors import AlreadyHolder, NotAHolder, PermitOverdraw, ReplicaError, UnknownLease, UnknownObject, UnknownPermit
from ledger.ops import (
    Builder,
    DeleteLease,
    DeleteObject,
    ExpectObject,
    HostFree,
    PutLease,
    PutObject,
    ReturnUnits,
    SwapObject,
    SwapPermit,
    TakeUnits,
    Unreserve,
)
from ledger.plan import Plan, Proof, Refusal, finish, shortfall
from ledger.state import DEVICE, HOST_MEDIUM, LedgerState, PhysicalObject, ReaderLease, Replica


# -- mechanics shared with transactions ---------------------------------------------------
_FIELD = MappingProxyType({f: i for i, f in enumerate(PhysicalObject._fields)})  # read-only: no module state
_VERSION = _FIELD["version"]
_new = tuple.__new__


def touch(b: Builder, o: PhysicalObject, **changes) -> PhysicalObject:
    """Replace `o` with a changed copy under a version check (RCL-2: commit re-verifies).
    Built field by field (`_replace` was most of a holder change's cost: ~470 pages a context)."""
    vals = list(o)
    vals[_VERSION] = o.version + 1
    for k, val in changes.items():
        vals[_FIELD[k]] = val
    new = _new(PhysicalObject, vals)
    b.do(SwapObject(o.version, new))
    return new


_HOLDERS = _FIELD["holders"]


def _holder_changes(b: Builder, ids, step, check):
    """Change the holder set of each object in `ids` to `step(old)`: the change every bind,
    capture and release makes on each of a context's pages (thousands a request). Read and
    written through the builder's overlay at once, so the version each SwapObject records is the
    one it replaced (a replay on another state checks it, RCL-2); holders never move replicas.
    `check(o)` raises when the change is not allowed. Yields each object as changed."""
    m = b._objs()
    ops = b.ops
    for oid in ids:
        o = m.get(oid)
        if o is None:
            raise UnknownObject(f"no live physical object {oid}")
        check(o)
        vals = list(o)
        vals[_VERSION] = o.version + 1
        vals[_HOLDERS] = step(o.holders)
        new = _new(PhysicalObject, vals)
        m[oid] = new
        ops.append(SwapObject(o.version, new))
        yield new


def _holder_sets(holder: Hashable, sign: int):
    """old holder set -> new, one per distinct set: pages with the same holders (a context's)
    share one new frozenset instead of one each."""
    memo: dict = {}

    def step(old: frozenset) -> frozenset:
        new = memo.get(old)
        if new is None:
            new = memo[old] = old | {holder} if sign > 0 else old - {holder}
        return new

    return step


def free_replica(b: Builder, o: PhysicalObject, r: Replica) -> None:
    if r.medium == DEVICE:
        b.do(ReturnUnits(o.pool, (r.location,)))
    else:
        b.do(HostFree(r.location, r.nbytes))


def release_if_unheld(b: Builder, o: PhysicalObject) -> bool:
    """Free every replica of an object with no holder, lease or pin (G-3). True if freed."""
    if o.holders or o.leases or o.pins:
        return False
    for r in (o.device, o.host):
        if r is not None:
            free_replica(b, o, r)
    b.do(DeleteObject(o.object_id, o.version))
    return True


def draw_from_permit(b: Builder, permit_id, owner: Hashable, pool: str, n: int) -> None:
    """Take n units of `pool` out of a permit's reservation (RES-3: allocations use the permit)."""
    p = b.permit(permit_id) if isinstance(permit_id, int) and not isinstance(permit_id, bool) else None
    if p is None:
        raise UnknownPermit(f"no outstanding permit {permit_id!r}")
    if p.owner != owner:
        raise NotAHolder(f"permit {permit_id} belongs to {p.owner!r}, not {owner!r}")
    left = p.remaining.get(pool, 0)
    if left < n:
        raise PermitOverdraw(f"permit {permit_id} has {left} units of {pool!r} left, asked {n}")
    b.do(SwapPermit(p, p._replace(remaining=p.remaining.set(pool, left - n))))
    b.do(Unreserve(pool, n))


def new_device_objects(b: Builder, pool: str, units: Sequence[int], holder: Hashable,
                       contents: Sequence[Hashable]) -> list[tuple[int, str, int]]:
    spec = b.spec(pool)
    kind = spec.object_kind
    holders = frozenset((holder,))
    empty = frozenset()
    out = []
    for unit, content in zip(units, contents):
        oid = b.new_id()
        b.do(PutObject(PhysicalObject(oid, kind, pool, content, 1, Replica(DEVICE, unit, spec.unit_bytes, True),
                                      None, holders, empty, empty)))
        out.append((oid, pool, unit))
    return out


# -- planners -------------------------------------------------------------------------------
def plan_allocate(state: LedgerState, pool: str, count: int, holder: Hashable, *, permit_id: int | None = None,
                  owner: Hashable = None, contents: Sequence[Hashable] | None = None) -> Plan | Refusal:
    """New Device objects (KV pages or StateImages) held by `holder`.

    With `permit_id` the units come out of that permit's reservation (the permit's owner is
    `owner`, default `holder`); without, out of what is available, or a Refusal (RES-2).
    """
    spec = state.pool(pool).spec
    v.count(count, f"allocation of {pool!r}", 1, spec.capacity)
    v.hashable(holder, "holder")
    if contents is None:
        contents = (None,) * count
    else:
        contents = tuple(contents)
        if len(contents) != count:
            raise v.InvalidRequest(f"{len(contents)} content ids for {count} objects")
        for c in contents:
            v.hashable(c, "content id")
    b = Builder(state)
    if permit_id is not None:
        draw_from_permit(b, permit_id, holder if owner is None else owner, pool, count)
    elif b.available(pool) < count:
        return shortfall({pool: count - b.available(pool)})
    units = b.pick_units(pool, count)
    b.do(TakeUnits(pool, units))
    allocated = new_device_objects(b, pool, units, holder, contents)
    return finish(b, "allocate", Proof(allocated=tuple(allocated)))


def plan_add_holders(state: LedgerState, object_ids: Iterable[int], holder: Hashable) -> Plan:
    """Share objects with one more logical holder; nothing is billed twice (G-3)."""
    ids = v.ids(object_ids, "objects")
    v.hashable(holder, "holder")
    b = Builder(state)

    def check(o):
        if holder in o.holders:
            raise AlreadyHolder(f"{holder!r} already holds object {o.object_id}")
        if not o.holders:
            raise NotAHolder(f"object {o.object_id} is being released (no holder left); it cannot be adopted")
    for _ in _holder_changes(b, ids, _holder_sets(holder, +1), check):
        pass
    return finish(b, "add_holders", Proof(note=f"{holder!r} now holds {len(ids)} objects"))


def plan_drop_holders(state: LedgerState, object_ids: Iterable[int], holder: Hashable) -> Plan:
    """Drop one holder's references; an object is freed only when nothing else holds or
    protects it, so this may free nothing (G-3). `proof.freed` / `proof.kept` say which."""
    ids = v.ids(object_ids, "objects")
    v.hashable(holder, "holder")
    b = Builder(state)
    freed, kept, released = [], [], {}

    def check(o):
        if holder not in o.holders:
            raise NotAHolder(f"{holder!r} does not hold object {o.object_id}")
    for o in _holder_changes(b, ids, _holder_sets(holder, -1), check):
        oid = o.object_id
        if release_if_unheld(b, o):
            freed.append(oid)
            if o.device is not None:
                released[o.pool] = released.get(o.pool, 0) + 1
        else:
            kept.append(oid)
    return finish(b, "drop_holders", Proof(freed=tuple(freed), kept=tuple(kept), released=tuple(released.items())))


def plan_lease(state: LedgerState, object_ids: Iterable[int], medium: str, owner: Hashable) -> Plan:
    """Reader leases on the complete `medium` replica of each object (TXN-1)."""
    ids = v.ids(object_ids, "objects")
    v.medium(medium)
    v.hashable(owner, "owner")
    b = Builder(state)
    leases = []
    for oid in ids:
        o = v.live_object(b, oid)
        r = o.replica(medium)
        if r is None or not r.complete:  # TXN-2: an incomplete replica is never a source
            raise ReplicaError(f"object {oid} has no complete {medium} replica to read")
        if not o.holders:
            raise NotAHolder(f"object {oid} is being released; it cannot be leased")
        lid = b.new_id()
        b.do(PutLease(ReaderLease(lid, oid, medium, owner)))
        touch(b, o, leases=o.leases | {lid})
        leases.append(lid)
    return finish(b, "lease", Proof(leases=tuple(leases)))


def release_lease(b: Builder, lease_id, owner: Hashable) -> PhysicalObject:
    lease = b.lease(lease_id) if isinstance(lease_id, int) and not isinstance(lease_id, bool) else None
    if lease is None:
        raise UnknownLease(f"no reader lease {lease_id!r} (already released?)")
    if lease.owner != owner:
        raise NotAHolder(f"lease {lease_id} belongs to {lease.owner!r}, not {owner!r}")
    b.do(DeleteLease(lease))
    o = b.obj(lease.object_id)
    return touch(b, o, leases=o.leases - {lease_id})


def plan_release_leases(state: LedgerState, lease_ids: Iterable[int], owner: Hashable) -> Plan:
    """End reads; an object whose last holder already left is freed now."""
    ids = v.ids(lease_ids, "leases")
    b = Builder(state)
    freed = []
    for lid in ids:
        lease = b.lease(lid)
        if lease is not None and b.transaction is not None and lid in b.transaction.leases:
            raise NotAHolder(f"lease {lid} belongs to the context transaction; it ends with it")
        o = release_lease(b, lid, owner)
        if release_if_unheld(b, o):
            freed.append(o.object_id)
    return finish(b, "release_leases", Proof(freed=tuple(freed)))


def plan_pin(state: LedgerState, object_ids: Iterable[int], owner: Hashable) -> Plan:
    """Keep each object's Device replica in place while `owner` writes or uses it."""
    ids = v.ids(object_ids, "objects")
    v.hashable(owner, "owner")
    b = Builder(state)
    for oid in ids:
        o = v.live_object(b, oid)
        if o.device is None or not o.device.complete:
            raise ReplicaError(f"object {oid} has no complete device replica to pin")
        if owner in o.pins:
            raise AlreadyHolder(f"{owner!r} already pins object {oid}")
        if not o.holders:
            raise NotAHolder(f"object {oid} is being released; it cannot be pinned")
        touch(b, o, pins=o.pins | {owner})
    return finish(b, "pin", Proof())


def plan_unpin(state: LedgerState, object_ids: Iterable[int], owner: Hashable) -> Plan:
    ids = v.ids(object_ids, "objects")
    b = Builder(state)
    freed = []
    for oid in ids:
        o = v.live_object(b, oid)
        if owner not in o.pins:
            raise NotAHolder(f"{owner!r} does not pin object {oid}")
        o = touch(b, o, pins=o.pins - {owner})
        if release_if_unheld(b, o):
            freed.append(oid)
    return finish(b, "unpin", Proof(freed=tuple(freed)))


def plan_drop_replica(state: LedgerState, object_id: int, medium: str) -> Plan | Refusal:
    """Free one replica of an object that keeps a complete other replica (RCL-6: with a
    complete Host replica, free the Device replica directly). Dropping the only replica would
    lose content: that is a deletion (drop the holders), so it raises ReplicaError."""
    v.medium(medium)
    o = v.live_object(state, object_id)
    r = o.replica(medium)
    other = o.host if medium == DEVICE else o.device
    if r is None:
        raise ReplicaError(f"object {object_id} has no {medium} replica")
    if not r.complete:
        raise ReplicaError(f"object {object_id}: the {medium} replica is a pending transfer destination")
    if other is None or not other.complete:
        raise ReplicaError(f"object {object_id}: the {medium} replica is its only complete copy")
    b = Builder(state)
    leased = [lid for lid in o.leases if b.lease(lid).medium == medium]
    if leased:
        return Refusal("protected", None, f"object {object_id}: {medium} replica read under leases {sorted(leased)}")
    if medium == DEVICE and o.pins:
        return Refusal("protected", None, f"object {object_id}: device replica pinned by {sorted(map(repr, o.pins))}")
    free_replica(b, o, r)
    touch(b, o, **({"device": None} if medium == DEVICE else {"host": None}))
    released = ((o.pool, 1),) if medium == DEVICE else ((HOST_MEDIUM, r.nbytes),)
    return finish(b, "drop_replica", Proof(released=released))


def plan_copy_on_write(state: LedgerState, object_id: int, holder: Hashable, *, permit_id: int | None = None,
                       owner: Hashable = None, content: Hashable = None) -> Plan | Refusal:
    """A private writable copy of a Device object (BIND-4: copy a partial tail page when a
    branch must stay isolated from immutable shared content). The copy is a new object held
    by `holder`; the effect copies the unit on the Device."""
    v.hashable(holder, "holder")
    v.hashable(content, "content id")
    o = v.live_object(state, object_id)
    if o.device is None or not o.device.complete:
        raise ReplicaError(f"object {object_id} has no complete device replica to copy")
    b = Builder(state)
    if permit_id is not None:
        draw_from_permit(b, permit_id, holder if owner is None else owner, o.pool, 1)
    elif b.available(o.pool) < 1:
        return shortfall({o.pool: 1 - b.available(o.pool)})
    units = b.pick_units(o.pool, 1)
    b.do(TakeUnits(o.pool, units))
    # The source must still be the object we read (its unit is what the effect copies).
    b.do(ExpectObject(o.object_id, o.version))
    allocated = new_device_objects(b, o.pool, units, holder, (content,))
    b.effects.append(CopyUnit(o.pool, o.device.location, units[0]))
    return finish(b, "copy_on_write", Proof(allocated=tuple(allocated)))
