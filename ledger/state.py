"""The ledger's data model: typed pools, physical objects and replicas, permits, leases,
the context transaction, and the immutable `LedgerState` that holds them all.

G-3: continuation records, checkpoints and physical objects are three separate units. This
module holds only the third: what bytes are really held, where, and who holds them. A
record or checkpoint (a later issue) points at objects by holding them; a physical object is
billed once however many holders it has, and dropping one holder may free nothing.

Records are NamedTuples (cheap to build and compare) and collections are `immutables.Map`
(cheap persistent updates), so a plan's new state shares almost everything with the old one.
"""
from __future__ import annotations

from typing import Hashable, NamedTuple

import immutables

from ledger import ptrie
from ledger.arena import HostArena, empty_arena
from ledger.errors import InvalidRequest

# Pool kinds.
KV_PAGES = "kv_pages"  # Main KV (64-token pages) or a backend KV pool (its own page size)
STATE_SLOTS = "state_slots"  # Device StateImage slots (C basic + device_state_slots, CFG-4)
POOL_KINDS = (KV_PAGES, STATE_SLOTS)

# Conventional pool ids (a config may add backend pools such as "backend_kv:mtp").
MAIN_KV = "main_kv"
STATE_POOL = "state_slots"
HOST = "host_arena"  # the id under which Host bytes appear in a Shortfall

# Media of a replica.
DEVICE = "device"
HOST_MEDIUM = "host"
MEDIA = (DEVICE, HOST_MEDIUM)

# Object kinds follow the pool kind.
KV_PAGE = "kv_page"
STATE_IMAGE = "state_image"

MAX_UNITS = 1 << 31  # absurd-size bound for a device pool (units)


class UnitKind:
    """Typed KV coverage a unit needs (RES-1), plus the full recovery permit (RES-5)."""

    PREFILL = "prefill"
    REPLAY = "replay"
    DECODE = "decode"
    VERIFY = "verify"
    CONTROL = "control"
    NORMALIZE = "normalize"
    RECOVERY = "recovery"
    ALL = (PREFILL, REPLAY, DECODE, VERIFY, CONTROL, NORMALIZE, RECOVERY)


class TxnKind:
    """The context transactions a Program runs one at a time (TXN-1)."""

    BIND = "bind"
    CAPTURE = "capture"
    DEMOTION = "demotion"  # a Host demotion: Device -> Host copy (RD-4)
    PAUSE = "pause"
    ALL = (BIND, CAPTURE, DEMOTION, PAUSE)


class TxnPhase:
    """source lease + destination reservation -> submitted -> completed -> published (TXN-1)."""

    RESERVED = "reserved"
    SUBMITTED = "submitted"
    COMPLETED = "completed"
    CANCELLING = "cancelling"  # cancelled after submit: revert once the real reader finished (TXN-2)


class PoolSpec(NamedTuple):
    """One typed device pool: `capacity` units of `unit_bytes` each (CFG-2, CFG-4)."""

    pool_id: str
    kind: str  # KV_PAGES | STATE_SLOTS
    capacity: int  # units: pages or slots
    unit_bytes: int  # bytes of one unit (its Host replica has the same size)
    page_tokens: int = 0  # tokens per page for KV pools (Main KV: 64); 0 for slots

    @property
    def object_kind(self) -> str:
        return KV_PAGE if self.kind == KV_PAGES else STATE_IMAGE


class LedgerConfig(NamedTuple):
    """The pools a Program has and its Host arena size (CFG-5: one shared Host backing)."""

    pools: tuple[PoolSpec, ...]
    host_capacity_bytes: int

    def validate(self) -> "LedgerConfig":
        seen = set()
        for p in self.pools:
            if not isinstance(p, PoolSpec):
                raise InvalidRequest(f"pool spec must be a PoolSpec, got {type(p).__name__}")
            if not isinstance(p.pool_id, str) or not p.pool_id or p.pool_id == HOST:
                raise InvalidRequest(f"bad pool id {p.pool_id!r}")
            if p.pool_id in seen:
                raise InvalidRequest(f"duplicate pool id {p.pool_id!r}")
            seen.add(p.pool_id)
            if p.kind not in POOL_KINDS:
                raise InvalidRequest(f"pool {p.pool_id!r}: kind {p.kind!r} not in {POOL_KINDS}")
            _check_int(p.capacity, f"pool {p.pool_id!r} capacity", 0, MAX_UNITS)
            _check_int(p.unit_bytes, f"pool {p.pool_id!r} unit_bytes", 1, 1 << 40)
            if p.kind == KV_PAGES:
                _check_int(p.page_tokens, f"pool {p.pool_id!r} page_tokens", 1, 1 << 20)
        _check_int(self.host_capacity_bytes, "host_capacity_bytes", 0, 1 << 50)
        return self


def _check_int(n, what: str, lo: int, hi: int) -> None:
    if not isinstance(n, int) or isinstance(n, bool):
        raise InvalidRequest(f"{what} must be an int, got {type(n).__name__}")
    if not lo <= n <= hi:
        raise InvalidRequest(f"{what} = {n} outside [{lo}, {hi}]")


class DevicePool(NamedTuple):
    """Occupancy of one device pool: which units are free, and how many are reserved.

    available = len(free) - reserved. A unit permit reserves a count (RES-1); allocation takes
    concrete unit indices out of `free`; a transfer destination takes concrete units at
    reservation time (CFG-5: charged from reservation).
    """

    spec: PoolSpec
    free: immutables.Map  # unit index -> None
    reserved: int

    @property
    def available(self) -> int:
        return len(self.free) - self.reserved


class Replica(NamedTuple):
    """Where one copy of an object's bytes lies.

    Device: `location` is the unit index in the object's pool. Host: the arena offset.
    `complete` is False while it is a transfer destination not yet published: an incomplete
    replica is never a query or copy source (TXN-2).
    """

    medium: str  # DEVICE | HOST_MEDIUM
    location: int
    nbytes: int
    complete: bool


class PhysicalObject(NamedTuple):
    """A KV page or a StateImage: the bytes really held, on Device and/or Host (G-3).

    `holders` are logical references (records, checkpoints, sequences); the object is billed
    once however many there are. `leases` (ReaderLease ids) protect a specific replica while
    it is read (TXN-1); `pins` keep the Device replica in place (an active writer). The object
    is freed when its last holder goes and no lease or pin remains. `version` increases with
    every change; plans check it before they touch the object (RCL-2).
    """

    object_id: int
    kind: str  # KV_PAGE | STATE_IMAGE
    pool: str  # the device pool its Device replica lives in (and whose unit size it has)
    content: Hashable  # content identity (CKP-4): shared pages keep their real identity
    version: int
    device: Replica | None
    host: Replica | None
    holders: frozenset
    leases: frozenset  # lease ids
    pins: frozenset  # pin owners

    def replica(self, medium: str) -> Replica | None:
        return self.device if medium == DEVICE else self.host

    @property
    def protected(self) -> bool:
        return bool(self.leases or self.pins)


class UnitPermit(NamedTuple):
    """A resident unit permit (RES-1..3): the typed pool counts one unit reserved.

    `remaining` shrinks as the unit allocates from it; settling returns the rest.
    """

    permit_id: int
    owner: Hashable
    kind: str  # UnitKind
    remaining: immutables.Map  # pool id -> units still reserved


class RecoveryPermit(UnitPermit):
    """The full recovery permit of a paused request (RES-5, SCH-7): at most one at a time.

    Held across Replay chunks; allocations draw from it until it is settled.
    """

    __slots__ = ()


class ReaderLease(NamedTuple):
    """Protects one replica of one object while a computation or copy reads it (TXN-1)."""

    lease_id: int
    object_id: int
    medium: str
    owner: Hashable


class CopyJob(NamedTuple):
    """One object's copy inside a context transaction: from a complete replica to a pending one."""

    object_id: int
    pool: str
    src: Replica
    dst: Replica


class Transaction(NamedTuple):
    """The Program's one context transaction (TXN-1): bind, capture, demotion or pause.

    `generation` is unique per transaction and is the handle every later step must name, so
    a late completion cannot touch the reused descriptor (TXN-2).
    """

    generation: int
    kind: str  # TxnKind
    owner: Hashable
    phase: str  # TxnPhase
    jobs: tuple[CopyJob, ...]
    leases: tuple[int, ...]  # source ReaderLease ids taken by this transaction
    permit_id: int | None  # unit/recovery permit taken together with the destination (TXN-2)
    drop_source: bool  # a Host demotion frees the source Device replica on publish


class LedgerState(NamedTuple):
    config: LedgerConfig
    pools: immutables.Map  # pool id -> DevicePool
    arena: HostArena
    objects: immutables.Map  # object id -> PhysicalObject
    permits: immutables.Map  # permit id -> UnitPermit | RecoveryPermit
    leases: immutables.Map  # lease id -> ReaderLease
    transaction: Transaction | None
    recovery_permit: int | None  # id of the one RecoveryPermit, if any (SCH-7)
    next_id: int  # ids and generations are drawn from one increasing counter
    version: int  # increases with every committed plan
    # Objects whose replicas are not exactly one complete Device replica (oid -> `exception(o)`):
    # kept by every op, so a reader holding an older version learns which objects moved between
    # Device and Host by `ptrie.diff` (the cache policy's victim order, RCL-4, HEAT-4).
    xrep: ptrie.Trie = ptrie.EMPTY

    def pool(self, pool_id: str) -> DevicePool:
        p = self.pools.get(pool_id)
        if p is None:
            raise InvalidRequest(f"unknown pool {pool_id!r}; pools are {sorted(self.pools)}")
        return p


def _rstate(r: Replica | None) -> int:
    return 0 if r is None else (2 if r.complete else 1)


def exception(o: PhysicalObject) -> tuple | None:
    """An object's replica state when it is not the common one (a complete Device replica and no
    Host replica): (device 0/1/2, host 0/1/2, Host bytes), 0 absent, 1 pending, 2 complete."""
    d, h = o.device, o.host
    if h is None and d is not None and d.complete:
        return None
    return (_rstate(d), _rstate(h), 0 if h is None else h.nbytes)


def initial_state(config: LedgerConfig) -> LedgerState:
    """An empty ledger: every unit free, nothing reserved, an empty arena."""
    config.validate()
    pools = {}
    for spec in config.pools:
        pools[spec.pool_id] = DevicePool(spec, immutables.Map(dict.fromkeys(range(spec.capacity))), 0)
    return LedgerState(
        config=config,
        pools=immutables.Map(pools),
        arena=empty_arena(config.host_capacity_bytes),
        objects=immutables.Map(),
        permits=immutables.Map(),
        leases=immutables.Map(),
        transaction=None,
        recovery_permit=None,
        next_id=1,
        version=0,
    )
