"""Context transactions (TXN-1, TXN-2): bind, capture, demotion or pause, one at a time.

Steps, each its own plan:
  begin     choose the physical set; take a reader lease on every source replica and reserve
            every destination (Device units, or Host extents placed first-fit in page groups,
            HOST-1/3), plus the unit or recovery permit that goes with it (TXN-2); all of it
            or a Refusal with the exact shortfall (RES-2). The destination is charged from here
            on (CFG-5); publishing does not change occupancy.
  submit    the copies become effects for the Program's stores.
  complete  the copy finished (the real reader is done).
  publish   destination replicas become complete (only now a query source, TXN-2), source
            leases are released, a demotion frees its source Device replicas.
  cancel    before submit: reverts the reservation at once; after submit: waits for the
            completion, which then reverts instead of publishing (TXN-2).
Every step after begin names the transaction's generation (and may name its owner); a step
naming another generation raises StaleGeneration (another owner: NotAHolder) and changes
nothing, so a late completion cannot touch a reused descriptor (TXN-2).
"""
from __future__ import annotations

from typing import Hashable, NamedTuple, Sequence

from ledger import arena as host
from ledger import validate as v
from ledger.effects import CopyToDevice, CopyToHost
from ledger.errors import InvalidRequest, NotAHolder, ReplicaError, StaleGeneration, TransactionStateError
from ledger.objects import free_replica, release_if_unheld, release_lease, touch
from ledger.ops import Builder, HostTake, PutLease, SetTransaction, TakeUnits
from ledger.permits import UnitDemand, _grant, _settle, _validate
from ledger.plan import Plan, Proof, Refusal, finish, shortfall
from ledger.state import (
    DEVICE,
    HOST,
    HOST_MEDIUM,
    KV_PAGE,
    CopyJob,
    LedgerState,
    ReaderLease,
    Replica,
    Transaction,
    TxnKind,
    TxnPhase,
    UnitKind,
)

DEFAULT_PAGE_GROUP = 64  # HOST-3: KV Host destinations are reserved in groups of this many pages


class TransferRequest(NamedTuple):
    kind: str  # TxnKind
    owner: Hashable
    object_ids: Sequence[int]  # in copy order; consecutive KV pages form page groups (HOST-3)
    to: str  # destination medium: DEVICE (bind / read-back) or HOST_MEDIUM (demotion, pause)
    drop_source: bool = False  # free each source replica on publish (a Host demotion)
    page_group: int = DEFAULT_PAGE_GROUP
    permit: UnitDemand | None = None  # the first unit permit or the full recovery permit (TXN-2)


def _check_request(state: LedgerState, req) -> tuple:
    if not isinstance(req, TransferRequest):
        raise InvalidRequest(f"expected a TransferRequest, got {type(req).__name__}")
    if req.kind not in TxnKind.ALL:
        raise InvalidRequest(f"transaction kind {req.kind!r} not in {TxnKind.ALL}")
    v.hashable(req.owner, "owner")
    v.medium(req.to)
    v.count(req.page_group, "page_group", 1, 1 << 20)
    if not isinstance(req.drop_source, bool):
        raise InvalidRequest("drop_source must be a bool")
    ids = v.ids(req.object_ids, "objects")
    amounts = _validate(state, req.permit) if req.permit is not None else ()
    src_medium = HOST_MEDIUM if req.to == DEVICE else DEVICE
    objs = []
    for oid in ids:
        o = v.live_object(state, oid)
        if not o.holders:
            raise NotAHolder(f"object {oid} is being released; nothing to transfer for")
        src = o.replica(src_medium)
        if src is None or not src.complete:  # TXN-2: an incomplete replica is never a source
            raise ReplicaError(f"object {oid} has no complete {src_medium} replica to copy from")
        if o.replica(req.to) is not None:
            raise ReplicaError(f"object {oid} already has a {req.to} replica")
        objs.append(o)
    return objs, amounts, src_medium


def plan_begin_transfer(state: LedgerState, req: TransferRequest) -> Plan | Refusal:
    """Source leases + destination reservation (+ permit), all or nothing (TXN-1, RES-2)."""
    objs, amounts, src_medium = _check_request(state, req)
    if state.transaction is not None:  # TXN-1: at most one context transaction at a time
        return Refusal("transaction_busy", None, f"transaction {state.transaction.generation} is running")
    b = Builder(state)
    if req.permit is not None and req.permit.kind == UnitKind.RECOVERY and b.recovery_permit is not None:
        return Refusal("recovery_permit_held", None, f"permit {b.recovery_permit} holds it")  # SCH-7
    # Joint demand on the device pools: Device destinations plus the permit.
    need: dict[str, int] = {}
    for pool, n in amounts:
        need[pool] = need.get(pool, 0) + n
    if req.to == DEVICE:
        for o in objs:
            need[o.pool] = need.get(o.pool, 0) + 1
    missing = {pool: n - b.available(pool) for pool, n in need.items() if n > b.available(pool)}
    placements = None
    host_short = None
    if req.to == HOST_MEDIUM:
        allocs, order = _host_allocations(objs, req.page_group, b)
        placed = host.place(b.arena, allocs)
        if isinstance(placed, host.HostShortfall):
            host_short = placed
            if placed.bytes_missing:
                missing[HOST] = placed.bytes_missing
        else:
            placements = (placed[1], order)
    if missing or host_short is not None:  # RES-2: nothing reserved; the exact gap per pool
        return shortfall(missing, host_short)

    # Destinations, in object order.
    dests: dict[int, Replica] = {}
    if req.to == DEVICE:
        by_pool: dict[str, list] = {}
        for o in objs:
            by_pool.setdefault(o.pool, []).append(o)
        for pool, group in by_pool.items():
            units = b.pick_units(pool, len(group))
            b.do(TakeUnits(pool, units))
            nbytes = b.spec(pool).unit_bytes
            for o, u in zip(group, units):
                dests[o.object_id] = Replica(DEVICE, u, nbytes, False)
    else:
        placed, order = placements
        it = iter(order)
        for offset, size, pieces in placed:
            b.do(HostTake(offset, size, pieces))
            piece = size // pieces
            for k in range(pieces):
                o = next(it)
                dests[o.object_id] = Replica(HOST_MEDIUM, offset + k * piece, piece, False)
    permit_id = None
    if req.permit is not None:
        permit_id = _grant(b, req.permit, amounts)
        assert not isinstance(permit_id, Refusal)  # checked jointly above
    jobs, leases = [], []
    for o in objs:
        lid = b.new_id()
        b.do(PutLease(ReaderLease(lid, o.object_id, src_medium, req.owner)))
        dst = dests[o.object_id]
        touch(b, o, leases=o.leases | {lid}, **({"device": dst} if req.to == DEVICE else {"host": dst}))
        jobs.append(CopyJob(o.object_id, o.pool, o.replica(src_medium), dst))
        leases.append(lid)
    gen = b.new_id()
    txn = Transaction(gen, req.kind, req.owner, TxnPhase.RESERVED, tuple(jobs), tuple(leases), permit_id,
                      req.drop_source)
    b.do(SetTransaction(None, txn))
    return finish(b, "begin_transfer", Proof(
        reserved=tuple(need.items()), permits=() if permit_id is None else (permit_id,),
        allocated=tuple((j.object_id, j.pool, j.dst.location) for j in jobs if j.dst.medium == DEVICE),
        host_placed=tuple((j.object_id, j.dst.location) for j in jobs if j.dst.medium == HOST_MEDIUM),
        leases=tuple(leases), generation=gen))


def _host_allocations(objs, page_group: int, b: Builder):
    """HOST-1: a StateImage is one block; KV pages of one pool, consecutive in the request,
    are placed in page groups (HOST-3)."""
    allocs, order = [], []
    run: list = []

    def flush():
        if run:
            unit = b.spec(run[0].pool).unit_bytes
            allocs.extend(host.page_groups(unit, len(run), page_group))
            order.extend(run)
            run.clear()

    for o in objs:
        if o.kind == KV_PAGE:
            if run and run[0].pool != o.pool:
                flush()
            run.append(o)
        else:
            flush()
            allocs.append(host.HostAllocation(b.spec(o.pool).unit_bytes, 1))
            order.append(o)
    flush()
    return allocs, order


_ANY = object()


def _current(state: LedgerState, generation, owner=_ANY) -> Transaction:
    t = state.transaction
    if not isinstance(generation, int) or isinstance(generation, bool):
        raise InvalidRequest(f"generation must be an int, got {type(generation).__name__}")
    if t is None or t.generation != generation:  # TXN-2: a late step from an older generation
        raise StaleGeneration(f"transaction generation {generation} is not the running one "
                              f"({None if t is None else t.generation})")
    if owner is not _ANY and owner != t.owner:  # TXN-2: owner check on the pending handle
        raise NotAHolder(f"transaction {generation} belongs to {t.owner!r}, not {owner!r}")
    return t


def plan_submit(state: LedgerState, generation: int, owner: Hashable = _ANY) -> Plan:
    """Hand the copies to the Program (effects); the transaction is now in flight."""
    t = _current(state, generation, owner)
    if t.phase != TxnPhase.RESERVED:
        raise TransactionStateError(f"transaction {generation} is {t.phase}, not {TxnPhase.RESERVED}")
    b = Builder(state)
    for j in t.jobs:
        if j.dst.medium == HOST_MEDIUM:
            b.effects.append(CopyToHost(j.pool, j.src.location, j.dst.location, j.dst.nbytes))
        else:
            b.effects.append(CopyToDevice(j.src.location, j.pool, j.dst.location, j.dst.nbytes))
    b.do(SetTransaction(t, t._replace(phase=TxnPhase.SUBMITTED)))
    return finish(b, "submit", Proof(generation=generation))


def plan_complete(state: LedgerState, generation: int, owner: Hashable = _ANY) -> Plan:
    """The copy finished. A transaction cancelled in flight reverts now (TXN-2)."""
    t = _current(state, generation, owner)
    if t.phase == TxnPhase.CANCELLING:
        return _revert(state, t, "complete")
    if t.phase != TxnPhase.SUBMITTED:
        raise TransactionStateError(f"transaction {generation} is {t.phase}, not {TxnPhase.SUBMITTED}")
    b = Builder(state)
    b.do(SetTransaction(t, t._replace(phase=TxnPhase.COMPLETED)))
    return finish(b, "complete", Proof(generation=generation))


def plan_publish(state: LedgerState, generation: int, owner: Hashable = _ANY) -> Plan:
    """Publish the destination replicas, release the source leases, end the transaction.

    A demotion (drop_source) frees each source replica that nothing else reads or pins;
    one still protected keeps its replica (listed in proof.kept)."""
    t = _current(state, generation, owner)
    if t.phase != TxnPhase.COMPLETED:
        raise TransactionStateError(f"transaction {generation} is {t.phase}, not {TxnPhase.COMPLETED}")
    b = Builder(state)
    freed, kept, released = [], [], {}
    for j, lid in zip(t.jobs, t.leases):
        o = release_lease(b, lid, t.owner)
        dst = j.dst._replace(complete=True)
        o = touch(b, o, **({"device": dst} if dst.medium == DEVICE else {"host": dst}))
        if t.drop_source:
            src = o.replica(j.src.medium)
            busy = any(b.lease(x).medium == src.medium for x in o.leases) or (src.medium == DEVICE and o.pins)
            if busy:
                kept.append(o.object_id)
            else:
                free_replica(b, o, src)
                o = touch(b, o, **({"device": None} if src.medium == DEVICE else {"host": None}))
                key = o.pool if src.medium == DEVICE else HOST
                released[key] = released.get(key, 0) + (1 if src.medium == DEVICE else src.nbytes)
        if release_if_unheld(b, o):  # the last holder left while the copy ran
            freed.append(o.object_id)
    b.do(SetTransaction(t, None))
    return finish(b, "publish", Proof(generation=generation, freed=tuple(freed), kept=tuple(kept),
                                      released=tuple(released.items())))


def plan_cancel(state: LedgerState, generation: int, owner: Hashable = _ANY) -> Plan:
    """Cancel: before submit (or after completion) revert now; in flight, mark it so the
    completion reverts once the real reader has finished (TXN-2)."""
    t = _current(state, generation, owner)
    if t.phase in (TxnPhase.RESERVED, TxnPhase.COMPLETED):
        return _revert(state, t, "cancel")
    if t.phase == TxnPhase.SUBMITTED:
        b = Builder(state)
        b.do(SetTransaction(t, t._replace(phase=TxnPhase.CANCELLING)))
        return finish(b, "cancel", Proof(generation=generation, note="in flight: reverts on completion"))
    raise TransactionStateError(f"transaction {generation} is already {t.phase}")


def _revert(state: LedgerState, t: Transaction, kind: str) -> Plan:
    """Free the destinations, release the leases and the permit taken with them; end it."""
    b = Builder(state)
    freed = []
    for j, lid in zip(t.jobs, t.leases):
        o = release_lease(b, lid, t.owner)
        free_replica(b, o, j.dst)
        o = touch(b, o, **({"device": None} if j.dst.medium == DEVICE else {"host": None}))
        if release_if_unheld(b, o):
            freed.append(o.object_id)
    released: dict[str, int] = {}
    if t.permit_id is not None and b.permit(t.permit_id) is not None:
        _settle(b, t.permit_id, b.permit(t.permit_id).owner, released)
    b.do(SetTransaction(t, None))
    return finish(b, kind, Proof(generation=t.generation, freed=tuple(freed), released=tuple(released.items()),
                                 note="reverted"))
