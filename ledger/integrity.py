"""check_integrity: recount everything from first principles and compare (doctrine 2, docs/rules.md).

From the objects alone it recomputes which Device units and Host bytes are in use, and
checks them against each pool's free set, the arena's extents (which must tile the arena
exactly, coalesced), the reservations against the permits, the leases against the objects,
and the transaction against the pending replicas. Any disagreement raises IntegrityError
listing every problem found.
"""
from __future__ import annotations

from typing import NamedTuple

from ledger import extents as ex
from ledger.errors import IntegrityError
from ledger.state import DEVICE, HOST_MEDIUM, LedgerState, RecoveryPermit, TxnPhase, exception


class Recount(NamedTuple):
    pools: dict  # pool id -> {"used", "free", "reserved", "capacity"}
    host_used_bytes: int
    host_free_bytes: int
    objects: int
    holders: int  # total (object, holder) references
    leases: int
    permits: int


def check_integrity(state: LedgerState) -> Recount:
    errs: list[str] = []
    err = errs.append
    specs = {pid: p.spec for pid, p in state.pools.items()}
    used_units: dict[str, dict[int, int]] = {pid: {} for pid in specs}
    host_used: dict[int, int] = {}
    host_owner: dict[int, int] = {}
    pending: set[tuple[int, str]] = set()
    max_id = 0
    n_holders = 0

    for oid, o in state.objects.items():
        max_id = max(max_id, oid)
        if o.object_id != oid:
            err(f"object key {oid} holds object {o.object_id}")
        spec = specs.get(o.pool)
        if spec is None:
            err(f"object {oid} in unknown pool {o.pool!r}")
            continue
        if o.kind != spec.object_kind:
            err(f"object {oid} kind {o.kind} in a {spec.kind} pool")
        if o.device is None and o.host is None:
            err(f"object {oid} has no replica")
        if not (o.holders or o.leases or o.pins):
            err(f"object {oid} has no holder, lease or pin but was not freed")
        n_holders += len(o.holders)
        for r, medium in ((o.device, DEVICE), (o.host, HOST_MEDIUM)):
            if r is None:
                continue
            if r.medium != medium:
                err(f"object {oid}: {medium} replica says medium {r.medium}")
            if r.nbytes != spec.unit_bytes:
                err(f"object {oid}: {medium} replica of {r.nbytes} bytes, unit is {spec.unit_bytes}")
            if not r.complete:
                pending.add((oid, medium))
            if medium == DEVICE:
                if not 0 <= r.location < spec.capacity:
                    err(f"object {oid}: device unit {r.location} outside pool {o.pool!r}")
                elif r.location in used_units[o.pool]:
                    err(f"unit {r.location} of {o.pool!r} used by objects {used_units[o.pool][r.location]} and {oid}")
                else:
                    used_units[o.pool][r.location] = oid
            else:
                if r.location in host_used:
                    err(f"host offset {r.location} used by objects {host_owner[r.location]} and {oid}")
                host_used[r.location] = r.nbytes
                host_owner[r.location] = oid
        for lid in o.leases:
            lease = state.leases.get(lid)
            if lease is None:
                err(f"object {oid} lists lease {lid}, which does not exist")
            elif lease.object_id != oid:
                err(f"object {oid} lists lease {lid} of object {lease.object_id}")
            else:
                r = o.replica(lease.medium)
                if r is None or not r.complete:
                    err(f"lease {lid} reads a missing or incomplete {lease.medium} replica of object {oid}")

    # The replica exceptions (objects not held as exactly one complete Device replica).
    want_x = {}
    for oid, o in state.objects.items():
        x = exception(o)
        if x is not None:
            want_x[oid] = x
    if dict(state.xrep.items()) != want_x or len(state.xrep) != len(want_x):
        bad = sorted(k for k in set(want_x) | {k for k, _ in state.xrep.items()}
                     if want_x.get(k) != state.xrep.get(k))
        err(f"replica exceptions disagree with the objects at {bad[:8]}")

    for lid, lease in state.leases.items():
        max_id = max(max_id, lid)
        o = state.objects.get(lease.object_id)
        if lease.lease_id != lid:
            err(f"lease key {lid} holds lease {lease.lease_id}")
        if o is None or lid not in o.leases:
            err(f"lease {lid} on object {lease.object_id}, which does not list it")

    # Permits and reservations.
    reserved = {pid: 0 for pid in specs}
    recovery = []
    for pid, p in state.permits.items():
        max_id = max(max_id, pid)
        if p.permit_id != pid:
            err(f"permit key {pid} holds permit {p.permit_id}")
        if isinstance(p, RecoveryPermit):
            recovery.append(pid)
        for pool, n in p.remaining.items():
            if pool not in specs:
                err(f"permit {pid} reserves unknown pool {pool!r}")
            elif n < 0:
                err(f"permit {pid} has {n} units of {pool!r}")
            else:
                reserved[pool] += n
    if len(recovery) > 1:  # SCH-7
        err(f"{len(recovery)} recovery permits: {recovery}")
    if (recovery[0] if recovery else None) != state.recovery_permit:
        err(f"recovery_permit is {state.recovery_permit}, the permits say {recovery}")

    # Device pools: free + used = capacity, disjoint; reserved matches the permits.
    pools = {}
    for pid, pool in state.pools.items():
        spec = pool.spec
        used = used_units[pid]
        for u in pool.free:
            if not 0 <= u < spec.capacity:
                err(f"pool {pid!r}: free unit {u} outside capacity {spec.capacity}")
            elif u in used:
                err(f"pool {pid!r}: unit {u} is free and used by object {used[u]}")
        if len(pool.free) + len(used) != spec.capacity:
            err(f"pool {pid!r}: {len(pool.free)} free + {len(used)} used != capacity {spec.capacity}")
        if pool.reserved != reserved[pid]:
            err(f"pool {pid!r}: reserved {pool.reserved}, permits reserve {reserved[pid]}")
        if pool.reserved > len(pool.free):
            err(f"pool {pid!r}: {pool.reserved} reserved but only {len(pool.free)} free")
        pools[pid] = {"capacity": spec.capacity, "used": len(used), "free": len(pool.free),
                      "reserved": pool.reserved}

    # Host arena: allocations match the objects; free extents coalesced; all tile [0, capacity).
    a = state.arena
    if dict(a.used.items()) != host_used:
        extra = set(a.used.keys()) ^ set(host_used)
        err(f"arena allocations differ from the objects' host replicas at offsets {sorted(extra)[:8]}")
    used_bytes = sum(host_used.values())
    if a.used_bytes != used_bytes:
        err(f"arena used_bytes {a.used_bytes}, objects hold {used_bytes}")
    free = list(ex.iter_extents(a.free))
    _check_extent_list(a.free, errs)
    for (o1, l1), (o2, _) in zip(free, free[1:]):
        if o1 + l1 == o2:
            err(f"free extents at {o1} and {o2} are adjacent but not coalesced")
    pos = 0
    for off, ln, what in sorted([(o, l, "free") for o, l in free] + [(o, l, "used") for o, l in host_used.items()]):
        if ln <= 0:
            err(f"{what} extent at {off} has length {ln}")
        if off != pos:
            err(f"arena {'gap' if off > pos else 'overlap'} at {min(off, pos)} ({what} extent at {off}, expected {pos})")
        pos = max(pos, off + ln)
    if pos != a.capacity:
        err(f"arena extents end at {pos}, capacity is {a.capacity}")

    # The transaction: its jobs are exactly the pending replicas, its leases exist.
    t = state.transaction
    if t is None:
        if pending:
            err(f"incomplete replicas with no transaction: {sorted(pending)[:8]}")
    else:
        max_id = max(max_id, t.generation)
        want = {(j.object_id, j.dst.medium) for j in t.jobs}
        if want != pending:
            err(f"transaction {t.generation} destinations {sorted(want)[:8]} != pending replicas {sorted(pending)[:8]}")
        if len(t.leases) != len(t.jobs):
            err(f"transaction {t.generation}: {len(t.jobs)} jobs, {len(t.leases)} leases")
        for j, lid in zip(t.jobs, t.leases):
            lease = state.leases.get(lid)
            o = state.objects.get(j.object_id)
            if lease is None or lease.object_id != j.object_id or lease.medium != j.src.medium or lease.owner != t.owner:
                err(f"transaction {t.generation}: lease {lid} does not protect the source of object {j.object_id}")
            if o is None or o.replica(j.dst.medium) != j.dst:
                err(f"transaction {t.generation}: object {j.object_id} lost its destination replica")
            elif o.replica(j.src.medium) != j.src:
                err(f"transaction {t.generation}: object {j.object_id} lost its source replica")
        if t.phase not in (TxnPhase.RESERVED, TxnPhase.SUBMITTED, TxnPhase.COMPLETED, TxnPhase.CANCELLING):
            err(f"transaction {t.generation} in unknown phase {t.phase!r}")
    if state.next_id <= max_id:
        err(f"next_id {state.next_id} is not above the largest id in use {max_id}")

    if errs:
        raise IntegrityError(f"{len(errs)} integrity problem(s):\n  " + "\n  ".join(errs))
    return Recount(pools, used_bytes, a.free.total, len(state.objects), n_holders, len(state.leases),
                   len(state.permits))


def _check_extent_list(el: ex.ExtentList, errs: list[str]) -> None:
    n = total = 0
    prev = -1
    if not (len(el.offs) == len(el.lens) == len(el.firsts) == len(el.maxes)):
        errs.append("free extent list: block tables differ in length")
        return
    for o, l, f, m in zip(el.offs, el.lens, el.firsts, el.maxes):
        if not o or len(o) != len(l):
            errs.append("free extent list: empty or ragged block")
            continue
        if f != o[0] or m != max(l):
            errs.append(f"free extent list: block at {o[0]} has stale first/max ({f}, {m})")
        for off in o:
            if off <= prev:
                errs.append(f"free extent list: offsets out of order at {off}")
            prev = off
        n += len(o)
        total += sum(l)
    if n != el.count or total != el.total:
        errs.append(f"free extent list: counts ({el.count}, {el.total}) != recount ({n}, {total})")
