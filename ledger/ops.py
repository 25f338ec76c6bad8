"""The diff language of plans, and the `Builder` that applies it to a state without changing it.

A plan's diff is a tuple of small ops. Each op checks its own precondition against the
state it is applied to and raises `StalePlan` when it does not hold, so the same diff can be
applied to the state it was planned on or, at commit, to a newer state (a plan whose
preconditions no longer hold is refused). Ops name concrete things (unit indices, Host
offsets, object ids and versions), so a diff either reproduces exactly the planned change or
fails; it never lands somewhere else.

The `Builder` is an overlay on one immutable `LedgerState`: planners read through it and
apply ops to it; `finish()` yields the new state. Dropping a builder leaves no trace, which is
what makes "evaluating a plan changes nothing" and "nothing is half-applied" hold.
"""
from __future__ import annotations

from typing import Hashable, NamedTuple

import immutables

from ledger import arena as host
from ledger import ptrie
from ledger.errors import ArenaError, StalePlan
from ledger.state import (
    DevicePool,
    LedgerState,
    PhysicalObject,
    ReaderLease,
    Transaction,
    UnitPermit,
    exception,
)

_MISSING = object()


class Precondition(NamedTuple):
    """One fact a plan relies on, e.g. ("object_version", 17, 3) or ("available", "main_kv", 2)."""

    kind: str
    subject: Hashable
    value: Hashable


class _PoolOverlay:
    __slots__ = ("base", "free", "count", "reserved", "it", "returned")

    def __init__(self, pool: DevicePool):
        self.base = pool
        self.free = None  # MapMutation, made on first change
        self.count = len(pool.free)
        self.reserved = pool.reserved
        self.it = None  # iterator over base free units, for picking
        self.returned: list[int] = []

    def is_free(self, unit: int) -> bool:
        m = self.free if self.free is not None else self.base.free
        return m.get(unit, _MISSING) is not _MISSING

    def mut(self):
        if self.free is None:
            self.free = self.base.free.mutate()
        return self.free


class Builder:
    """A mutable overlay on an immutable LedgerState; records the ops applied to it."""

    __slots__ = ("base", "_pools", "arena", "_objects", "_permits", "_leases", "transaction",
                 "recovery_permit", "next_id", "_fresh", "ops", "effects", "xrep")

    def __init__(self, state: LedgerState):
        self.base = state
        self._pools: dict[str, _PoolOverlay] = {}
        self.arena = state.arena
        self._objects = None
        self._permits = None
        self._leases = None
        self.transaction = state.transaction
        self.recovery_permit = state.recovery_permit
        self.next_id = state.next_id
        self._fresh: set[int] = set()  # ids introduced by the ops applied so far
        self.ops: list = []
        self.effects: list = []
        self.xrep = state.xrep  # replica exceptions, kept with every object change

    # -- recording ----------------------------------------------------------------------
    def do(self, op) -> None:
        op.apply(self)
        self.ops.append(op)

    def new_id(self) -> int:
        i = self.next_id
        self.next_id = i + 1
        return i

    def claim_id(self, i: int) -> None:
        """An op introduces id i. Ids are never reused (TXN-2: a handle from an older
        generation must not name a new thing), so i must be at least the next_id of the state
        the ops are applied to; a replay on a state that has moved past it is stale."""
        if i < self.base.next_id or i in self._fresh:
            raise StalePlan(f"id {i} is no longer fresh (next id is {self.base.next_id})")
        self._fresh.add(i)
        if i >= self.next_id:
            self.next_id = i + 1

    def finish(self) -> LedgerState:
        s = self.base
        pools = s.pools
        if self._pools:
            m = pools.mutate()
            for pid, ov in self._pools.items():
                free = ov.free.finish() if ov.free is not None else ov.base.free
                if free is not ov.base.free or ov.reserved != ov.base.reserved:
                    m[pid] = DevicePool(ov.base.spec, free, ov.reserved)
            pools = m.finish()
        return LedgerState(
            s.config,
            pools,
            self.arena,
            self._objects.finish() if self._objects is not None else s.objects,
            self._permits.finish() if self._permits is not None else s.permits,
            self._leases.finish() if self._leases is not None else s.leases,
            self.transaction,
            self.recovery_permit,
            self.next_id,
            s.version + 1,
            self.xrep,
        )

    # -- pools --------------------------------------------------------------------------
    def _pool(self, pool_id: str) -> _PoolOverlay:
        ov = self._pools.get(pool_id)
        if ov is None:
            ov = self._pools[pool_id] = _PoolOverlay(self.base.pool(pool_id))
        return ov

    def spec(self, pool_id: str):
        return self._pool(pool_id).base.spec

    def available(self, pool_id: str) -> int:
        ov = self._pool(pool_id)
        return ov.count - ov.reserved

    def reserved(self, pool_id: str) -> int:
        return self._pool(pool_id).reserved

    def pick_units(self, pool_id: str, k: int) -> tuple[int, ...]:
        """Choose k free units (not yet taken); the caller takes them with TakeUnits."""
        ov = self._pool(pool_id)
        out: list[int] = []
        if k <= 0:
            return ()
        if ov.it is None:
            ov.it = iter(ov.base.free)
        for u in ov.it:
            if ov.is_free(u):
                out.append(u)
                if len(out) == k:
                    return tuple(out)
        for u in ov.returned:
            if ov.is_free(u) and u not in out:
                out.append(u)
                if len(out) == k:
                    return tuple(out)
        raise StalePlan(f"pool {pool_id!r}: fewer than {k} free units to pick")

    # -- objects, permits, leases ---------------------------------------------------------
    def obj(self, object_id: int) -> PhysicalObject | None:
        m = self._objects if self._objects is not None else self.base.objects
        return m.get(object_id)

    def _objs(self):
        if self._objects is None:
            self._objects = self.base.objects.mutate()
        return self._objects

    def _replicas(self, object_id: int, before: PhysicalObject | None, after: PhysicalObject | None) -> None:
        """Keep `xrep` (objects not held as exactly one complete Device replica)."""
        x0 = None if before is None else exception(before)
        x1 = None if after is None else exception(after)
        if x0 != x1:
            self.xrep = ptrie.set_(self.xrep, object_id, x1)

    def permit(self, permit_id: int) -> UnitPermit | None:
        m = self._permits if self._permits is not None else self.base.permits
        return m.get(permit_id)

    def _perms(self):
        if self._permits is None:
            self._permits = self.base.permits.mutate()
        return self._permits

    def lease(self, lease_id: int) -> ReaderLease | None:
        m = self._leases if self._leases is not None else self.base.leases
        return m.get(lease_id)

    def _lses(self):
        if self._leases is None:
            self._leases = self.base.leases.mutate()
        return self._leases


# --------------------------------------------------------------------------------------
# Ops. Each: apply(builder) checks its precondition (StalePlan) and changes the overlay;
# requires() names the preconditions for the plan's record.
# --------------------------------------------------------------------------------------


class Reserve(NamedTuple):
    """Reserve n units of a pool by count (a unit permit, RES-1)."""

    pool: str
    n: int

    def apply(self, b: Builder) -> None:
        ov = b._pool(self.pool)
        if ov.count - ov.reserved < self.n:
            raise StalePlan(f"pool {self.pool!r}: {ov.count - ov.reserved} available, plan reserves {self.n}")
        ov.reserved += self.n

    def requires(self):
        return (Precondition("available", self.pool, self.n),)


class Unreserve(NamedTuple):
    pool: str
    n: int

    def apply(self, b: Builder) -> None:
        ov = b._pool(self.pool)
        if ov.reserved < self.n:
            raise StalePlan(f"pool {self.pool!r}: {ov.reserved} reserved, plan returns {self.n}")
        ov.reserved -= self.n

    def requires(self):
        return (Precondition("reserved", self.pool, self.n),)


class TakeUnits(NamedTuple):
    """Allocate these concrete units; the pool must still cover its other reservations."""

    pool: str
    units: tuple[int, ...]

    def apply(self, b: Builder) -> None:
        ov = b._pool(self.pool)
        if ov.count - ov.reserved < len(self.units):
            raise StalePlan(f"pool {self.pool!r}: {ov.count - ov.reserved} available, plan takes {len(self.units)}")
        m = ov.mut()
        for u in self.units:
            if m.get(u, _MISSING) is _MISSING:
                raise StalePlan(f"pool {self.pool!r}: unit {u} is no longer free")
            del m[u]
        ov.count -= len(self.units)

    def requires(self):
        return (Precondition("units_free", self.pool, self.units),)


class ReturnUnits(NamedTuple):
    pool: str
    units: tuple[int, ...]

    def apply(self, b: Builder) -> None:
        ov = b._pool(self.pool)
        cap = ov.base.spec.capacity
        m = ov.mut()
        for u in self.units:
            if not 0 <= u < cap or m.get(u, _MISSING) is not _MISSING:
                raise StalePlan(f"pool {self.pool!r}: unit {u} is not allocated")
            m[u] = None
            ov.returned.append(u)
        ov.count += len(self.units)

    def requires(self):
        return (Precondition("units_used", self.pool, self.units),)


class HostTake(NamedTuple):
    """Carve [offset, offset+length) of the Host arena as `pieces` allocations (HOST-1/3)."""

    offset: int
    length: int
    pieces: int = 1

    def apply(self, b: Builder) -> None:
        try:
            b.arena = host.take(b.arena, self.offset, self.length, self.pieces)
        except ArenaError as e:
            raise StalePlan(str(e)) from None

    def requires(self):
        return (Precondition("host_free", self.offset, self.length),)


class HostFree(NamedTuple):
    offset: int
    length: int

    def apply(self, b: Builder) -> None:
        if b.arena.used.get(self.offset) != self.length:
            raise StalePlan(f"host allocation [{self.offset}, +{self.length}) is not held")
        b.arena = host.free(b.arena, self.offset)

    def requires(self):
        return (Precondition("host_used", self.offset, self.length),)


class PutObject(NamedTuple):
    obj: PhysicalObject

    def apply(self, b: Builder) -> None:
        b.claim_id(self.obj.object_id)
        b._objs()[self.obj.object_id] = self.obj
        b._replicas(self.obj.object_id, None, self.obj)

    def requires(self):
        return (Precondition("fresh_id", self.obj.object_id, None),)


class SwapObject(NamedTuple):
    """Replace an object whose version is still `before` (holders, leases, pins unchanged)."""

    before: int
    after: PhysicalObject

    def apply(self, b: Builder) -> None:
        after = self.after
        oid = after.object_id
        m = b._objs()  # the overlay it is written to (read through it: the same answers as `b.obj`)
        cur = m.get(oid)
        if cur is None or cur.version != self.before:
            raise StalePlan(f"object {oid} changed (version {None if cur is None else cur.version},"
                            f" plan expects {self.before})")
        m[oid] = after
        if cur.device is not after.device or cur.host is not after.host:
            b._replicas(oid, cur, after)

    def requires(self):
        return (Precondition("object_version", self.after.object_id, self.before),)


class ExpectObject(NamedTuple):
    """Change nothing; only require the object to be unchanged (a source a plan reads)."""

    object_id: int
    version: int

    def apply(self, b: Builder) -> None:
        cur = b.obj(self.object_id)
        if cur is None or cur.version != self.version:
            raise StalePlan(f"object {self.object_id} changed since the plan read it")

    def requires(self):
        return (Precondition("object_version", self.object_id, self.version),)


class DeleteObject(NamedTuple):
    object_id: int
    version: int

    def apply(self, b: Builder) -> None:
        cur = b.obj(self.object_id)
        if cur is None or cur.version != self.version:
            raise StalePlan(f"object {self.object_id} changed before its release")
        del b._objs()[self.object_id]
        b._replicas(self.object_id, cur, None)

    def requires(self):
        return (Precondition("object_version", self.object_id, self.version),)


class PutPermit(NamedTuple):
    permit: UnitPermit

    def apply(self, b: Builder) -> None:
        b.claim_id(self.permit.permit_id)
        b._perms()[self.permit.permit_id] = self.permit

    def requires(self):
        return (Precondition("fresh_id", self.permit.permit_id, None),)


class SwapPermit(NamedTuple):
    before: UnitPermit
    after: UnitPermit

    def apply(self, b: Builder) -> None:
        if b.permit(self.before.permit_id) != self.before:
            raise StalePlan(f"permit {self.before.permit_id} changed")
        b._perms()[self.after.permit_id] = self.after

    def requires(self):
        return (Precondition("permit", self.before.permit_id, tuple(self.before.remaining.items())),)


class DeletePermit(NamedTuple):
    before: UnitPermit

    def apply(self, b: Builder) -> None:
        if b.permit(self.before.permit_id) != self.before:
            raise StalePlan(f"permit {self.before.permit_id} changed or was settled")
        del b._perms()[self.before.permit_id]

    def requires(self):
        return (Precondition("permit", self.before.permit_id, tuple(self.before.remaining.items())),)


class PutLease(NamedTuple):
    lease: ReaderLease

    def apply(self, b: Builder) -> None:
        b.claim_id(self.lease.lease_id)
        b._lses()[self.lease.lease_id] = self.lease

    def requires(self):
        return (Precondition("fresh_id", self.lease.lease_id, None),)


class DeleteLease(NamedTuple):
    lease: ReaderLease

    def apply(self, b: Builder) -> None:
        if b.lease(self.lease.lease_id) != self.lease:
            raise StalePlan(f"lease {self.lease.lease_id} was already released")
        del b._lses()[self.lease.lease_id]

    def requires(self):
        return (Precondition("lease", self.lease.lease_id, self.lease.owner),)


class SetTransaction(NamedTuple):
    before: Transaction | None
    after: Transaction | None

    def apply(self, b: Builder) -> None:
        if b.transaction != self.before:
            raise StalePlan("the context transaction changed")
        if self.after is not None and (self.before is None or self.before.generation != self.after.generation):
            b.claim_id(self.after.generation)  # a new generation is a fresh id (TXN-2)
        b.transaction = self.after

    def requires(self):
        b = self.before
        return (Precondition("transaction", None if b is None else b.generation, None if b is None else b.phase),)


class SetRecoveryPermit(NamedTuple):
    before: int | None
    after: int | None

    def apply(self, b: Builder) -> None:
        if b.recovery_permit != self.before:
            raise StalePlan("the recovery permit changed (SCH-7: at most one)")
        b.recovery_permit = self.after

    def requires(self):
        return (Precondition("recovery_permit", None, self.before),)
