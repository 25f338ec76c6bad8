"""What a cache-policy operation did, as typed records: a `CacheResult.outcome`
(ledger/reclamation/edit.py) is a tuple of these, in the order the operation noted them — one
small frozen record per kind of event (a point retired, the writer's view handed over, a part of a
capture skipped, a demotion begun, a waiter revoked, ...), each with named fields and none
readable by position. Producers are bind.py, capture.py, waiting.py and reclamation/apply.py;
readers ask `isinstance` and read fields (ledger/driver.py's `bound_view` and `captured` are the
convenience drivers use). Ids are the ledger's: `cid` a checkpoint, `rid` a continuation record,
an object id a physical object, `permit` a unit permit.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Union

# -- bind (ledger/bind.py) ---------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Retired:
    """A private point retired: a deeper point approved for replacement by a bind (BIND-4), or
    a record's obsolete input point before a capture (REC-9)."""

    cid: int


@dataclass(frozen=True, slots=True)
class TailCopied:
    """BIND-4: the source's partial tail page was copied for the writer (the copy is in the view)."""

    page: int  # the source tail page's object id


@dataclass(frozen=True, slots=True)
class PermitTaken:
    """TXN-2: the first unit permit (or the recovery permit) taken with the bind."""

    permit: int


@dataclass(frozen=True, slots=True)
class Resumed:
    """PAUSE-1/5: a paused request rebound to its own record (same publication order, no heat)."""

    takeover: str  # a `Takeover` kind (BIND-5)
    rid: int
    permit: int | None  # TXN-2, if one was taken


@dataclass(frozen=True, slots=True)
class View:
    """BIND-4/5: the writer's view a bind hands over: its StateImage and its pages per KV pool."""

    state_object: int
    kv: tuple  # ((pool, (page object ids in position order)), ...)


@dataclass(frozen=True, slots=True)
class Bound:
    """BIND-1/5: a request bound, with the takeover kind it really got and its record."""

    takeover: str  # a `Takeover` kind
    rid: int
    permit: int | None  # TXN-2, if one was taken


# -- capture, the end of a request, pause (ledger/capture.py) ------------------------------------
@dataclass(frozen=True, slots=True)
class ReclaimedForCapture:
    """SAVE-5, RCL-10/11: the capture's own admitted reclamation made its destination room."""

    pool: str  # the gap's pool (a State pool or the Host)
    loss: int  # recovery tokens the reclamation lost (RCL-5)


@dataclass(frozen=True, slots=True)
class Carried:
    """SAVE-6: an existing compatible point is carried as it is (no new point)."""

    cid: int


@dataclass(frozen=True, slots=True)
class ReplacedAnchor:
    """REC-9: the record's oldest anchor retired to make room for a new one."""

    cid: int


@dataclass(frozen=True, slots=True)
class PrivateSkipped:
    """SAVE-5: no admitted room for the private point: it was skipped."""

    reason: str  # the destination's `Refusal.reason`


@dataclass(frozen=True, slots=True)
class PrivateSaved:
    """A private point (input point or anchor) captured; it copies no KV (BIND-3)."""

    cid: int


@dataclass(frozen=True, slots=True)
class SharedSkipped:
    """SAVE-4: the shared part failed; the private part stays."""

    reason: str  # the shared part's `Refusal.reason`


@dataclass(frozen=True, slots=True)
class SharedExists:
    """SH-1: the position already has a shared entry; none is added."""

    cid: int


@dataclass(frozen=True, slots=True)
class SharedSaved:
    """SH-1, SAVE-3: a shared entry captured."""

    cid: int


@dataclass(frozen=True, slots=True)
class EndPublished:
    """BIND-6, REC-1: the request's end checkpoint E published (the live state, no copy)."""

    cid: int


@dataclass(frozen=True, slots=True)
class SessionKeptByNewer:
    """BIND-7: a newer publication keeps the session name; the late finisher leaves it."""

    rid: int  # the newer record holding the name


@dataclass(frozen=True, slots=True)
class Paused:
    """PAUSE-2: a request paused by Snapshot (its own point) or by Replay (nothing kept)."""

    mode: str  # "snapshot" | "replay"
    snapshot: int | None  # the snapshot point's cid (None for Replay)


# -- waiting and reclamation (ledger/waiting.py, ledger/reclamation/apply.py) ----------------------
@dataclass(frozen=True, slots=True)
class DemotionStale:
    """RCL-6/RCL-7: objects that left the demotion batch (freed, or no longer Device-only)."""

    objects: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class DemotionBegun:
    """RCL-7: one demotion transaction begun for a batch of objects."""

    generation: int  # the transaction's generation (TXN-2)
    objects: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class DemotionRefused:
    """RCL-7: a demotion batch (or single group) whose transfer was refused."""

    reason: str
    objects: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class WaitRevoked:
    """WAIT-2: a waiting reference revoked; its request must reselect."""

    request: Hashable


@dataclass(frozen=True, slots=True)
class DropStale:
    """RCL-5/RCL-7: a duplicate replica drop with nothing left to drop (freed by this plan)."""

    object_id: int


@dataclass(frozen=True, slots=True)
class DropRefused:
    """RCL-6: a duplicate replica drop refused; the rest of the action applies."""

    object_id: int
    reason: str


@dataclass(frozen=True, slots=True)
class Deleted:
    """RCL-5: a checkpoint deleted by reclamation (a pause snapshot's request turns to Replay, PAUSE-4)."""

    cid: int


Outcome = Union[Retired, TailCopied, PermitTaken, Resumed, View, Bound, ReclaimedForCapture, Carried, ReplacedAnchor,
                PrivateSkipped, PrivateSaved, SharedSkipped, SharedExists, SharedSaved, EndPublished,
                SessionKeptByNewer, Paused, DemotionStale, DemotionBegun, DemotionRefused, WaitRevoked, DropStale,
                DropRefused, Deleted]

SAVED = (PrivateSaved, SharedSaved)  # the points a capture kept (SAVE-*)
SKIPPED = (PrivateSkipped, SharedSkipped)  # the parts of a capture it skipped (SAVE-4/5)
