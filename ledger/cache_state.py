"""The context-cache policy's data model (G-3): continuation records, checkpoints, shared
entries, waiting references, active uses, and the immutable `CacheState` that holds them.

Three units stay apart (G-3): a `ContinuationRecord` names one history's recovery positions
(E, one input recovery point, at most four anchors); a `Checkpoint` is one exact restorable
position (input identity, frontier, StateImage object, typed KV coverage); the bytes are
`PhysicalObject`s in the `LedgerState`. A checkpoint holds its StateImage and the KV pages of
its coverage by putting its holder key `("ckpt", id)` into their `holders`; the points of one
history therefore reference one KV directory (the record's pages, BIND-3) each with its own
coverage, and a page is billed once however many points cover it. Dropping a point is
`plan_drop_holders`: it may free nothing.
"""
from __future__ import annotations

from typing import Hashable, NamedTuple

import immutables

from ledger.identity import InputIdentity


class Tier:
    """HEAT-1: a record's or shared entry's retention tier."""

    NORMAL = 0
    REUSE = 1


class PointKind:
    """What a checkpoint is to its owner (REC-1, SH-1, PAUSE-2)."""

    END = "E"  # REC-2: the committed generation end
    INPUT = "input"  # REC-3..5: the input recovery point (typed R, or C before it)
    ANCHOR = "anchor"  # REC-6: an explicit private anchor
    SHARED = "shared"  # SH-1: a shared entry's point
    SNAPSHOT = "snapshot"  # PAUSE-2: a request's own pause snapshot (never in the index)


class InputKind:
    """REC-3..6: the typed R kind of an input point and where its state really lies."""

    RESPONSE_REPLAY = "ResponseReplay"
    TURN_CLOSURE = "TurnClosure"
    RAW = "P"  # no typed rewrite: raw/token input end


MAX_ANCHORS = 4  # REC-1
MAX_MARKERS = 4  # SH-2, RD-10
SUMMARY_ITEMS = 256  # HEAT-2
SOFT_TARGET = (3, 4)  # HEAT-4, RD-5: 3/4 of each physical pool


def indexed(c: "Checkpoint") -> bool:
    """Is c a public lookup entry? Snapshots (SRC-5) and points kept only by waiters (WAIT-1)
    are not."""
    return c.kind != PointKind.SNAPSHOT and c.owner[0] in ("rec", "shared")


def ckpt_holder(cid: int) -> tuple:
    return ("ckpt", cid)


def seq_holder(request: Hashable) -> tuple:
    """The holder key of a request's active execution (its writable KV pages and State)."""
    return ("seq", request)


def wait_holder(request: Hashable) -> tuple:
    """The holder key of a waiting reference (WAIT-1)."""
    return ("wait", request)


class Checkpoint(NamedTuple):
    """One exact restorable position (CKP-1)."""

    cid: int
    owner: tuple  # ("rec", rid) | ("shared", sid) | ("snap", request) | ("wait", request) (WAIT-1)
    kind: str  # PointKind
    identity: InputIdentity  # exact input identity of [0, frontier)
    state: int  # object id of the immutable StateImage
    kv: tuple  # typed KV coverage: ((pool, (page object ids...)), ...) covering [0, frontier)
    published: int  # when it was published (REC-9: the oldest anchor is replaced first)
    input_kind: str = ""  # InputKind for INPUT points (REC-3..6)
    demand_time: int = 0  # its own repeated demand (RCL-9); 0: none

    @property
    def frontier(self) -> int:
        return len(self.identity.tokens)

    @property
    def holder(self) -> tuple:
        return ("ckpt", self.cid)

    def object_ids(self) -> tuple:
        out = [self.state]
        for _, pages in self.kv:
            out.extend(pages)
        return tuple(out)


class ContinuationRecord(NamedTuple):
    """One history's recovery positions and names (REC-1, HEAT-1, BIND-7)."""

    rid: int
    session: Hashable  # a lookup hint and named entry (BIND-7); None: unnamed
    publication_order: int  # RD-13: assigned at bind, in admission order
    end: int | None  # cid of E (REC-2)
    input_point: int | None  # cid of the input recovery point (REC-5)
    anchors: tuple  # cids, oldest published first (REC-9)
    tier: int  # Tier
    demand_time: int  # HEAT-1: real demand time of the pair
    proven_frontier: int  # HEAT-1: the position really adopted
    active: Hashable  # the request that took it over and is running; None: inactive

    def points(self) -> tuple:
        out = [c for c in (self.end, self.input_point) if c is not None]
        out.extend(self.anchors)
        return tuple(out)


class SharedEntry(NamedTuple):
    """A public entry many requests can fork from (SH-1), with its own heat."""

    sid: int
    point: int  # cid
    tier: int
    demand_time: int
    proven_frontier: int
    explicit: bool  # caller marker (True) or automatic (False)


class WaitRef(NamedTuple):
    """WAIT-1: a waiting request's reference on one checkpoint (and its carried points)."""

    request: Hashable
    cid: int
    objects: tuple  # object ids held by ("wait", request)
    ticket: int  # original ticket: younger waiters are revoked first (WAIT-2)
    paused: bool  # a paused request's wait (fresh admission never revokes it)


class ActiveUse(NamedTuple):
    """A request between bind and finish: which record it writes, and evidence bookkeeping."""

    request: Hashable
    rid: int  # the record it continues or branches into
    source_cid: int | None
    source_frontier: int
    publication_order: int
    observed: frozenset  # HEAT-2: positions whose compute demand this request recorded
    snapshot: int | None = None  # its own pause snapshot cid (SRC-5)


class SummaryItem(NamedTuple):
    """HEAT-2: one demand-summary item (no State/KV held)."""

    key: tuple  # (digest of the position, frontier, identity tag)
    frontier: int
    requests: frozenset  # requests that really observed it (bounded to two is enough)
    demand_time: int  # time it became repeated demand; 0: not (yet)
    seen: int  # last observation time (RD-9: the least recently observed is dropped)


class CostModel(NamedTuple):
    """SRC-3: per-token and per-byte costs (any unit, e.g. µs), calibrated outside the ledger."""

    prefill_per_token: float = 1.0
    h2d_per_byte: float = 1e-4
    d2d_per_byte: float = 1e-6


class CacheState(NamedTuple):
    records: immutables.Map  # rid -> ContinuationRecord
    shared: immutables.Map  # sid -> SharedEntry
    checkpoints: immutables.Map  # cid -> Checkpoint
    index: immutables.Map  # prefix index (ledger/prefix_index.py): blocks -> tail length -> tail -> cids
    waiters: immutables.Map  # request -> WaitRef
    active: immutables.Map  # request -> ActiveUse
    sessions: immutables.Map  # session -> rid
    summary: immutables.Map  # key -> SummaryItem
    clock: int  # logical time of evidence events
    next_id: int
    next_publication: int
    # RCL-2/RCL-5 facts kept current: each checkpoint's deepest other indexed exact prefix
    # (0: root), and the reverse relation, so a quote reads a loss instead of searching.
    fallback: immutables.Map = immutables.Map()  # cid -> cid of its fallback (0: root)
    # The reverse relation, each fallback's dependents in token order (`dep_item`): the points
    # a new point now covers (those extending it) are one contiguous run from its own tokens
    # on, found without reading every point that falls back on the same prefix (_link).
    dep_order: immutables.Map = immutables.Map()  # cid -> PSorted of (tokens, cid) falling back on it
    # RCL-4/RD-8 victim order and HEAT-4 reuse footprint, kept by every edit (ledger/reclamation/index.py);
    # None until the first Edit builds it (a quote then enumerates, as `quote_reference`).
    victims: object = None

    def owner_of(self, cid: int):
        c = self.checkpoints[cid]
        kind, key = c.owner
        if kind == "rec":
            return self.records.get(key)
        if kind == "shared":
            return self.shared.get(key)
        return None


def dep_item(c: "Checkpoint") -> tuple:
    """A dependent's entry in its fallback's `dep_order` (its identity's own tokens tuple)."""
    return (c.identity.tokens, c.cid)


def empty_cache() -> CacheState:
    m = immutables.Map()
    return CacheState(m, m, m, m, m, m, m, m, 0, 1, 1)
