"""Waiting references (WAIT-1..4).

A request whose chosen source is blocked (SRC-5), or that waits for a lane, references the
same checkpoint (and the compatible points it would carry) under `("wait", request)`. It
allocates nothing, holds no lane or permit, but keeps the objects alive; it is not a reader
lease: the content may still migrate between Device and Host (WAIT-2). Optional writes never
delete it; necessary progress may revoke it, younger waiters first, and fresh admission only
younger, unpaused ones (`quote(..., Applicant(revoke_waiters=True))`). A waiting reference
produces no heat and no hit (WAIT-1, HEAT-3). It ends on adoption (`plan_bind` hands it over),
reselection, cancel, timeout or shutdown (`plan_release_wait`) or revocation (`plan_revoke_wait`).
"""
from __future__ import annotations

from typing import Hashable

from ledger.reclamation.edit import CacheResult, Edit
from ledger.cache_state import CacheState, WaitRef, wait_holder
from ledger.errors import InvalidRequest
from ledger.objects import plan_add_holders
from ledger.outcomes import WaitRevoked
from ledger.plan import Refusal
from ledger.sources import SourceCandidate
from ledger.state import LedgerState


def plan_wait(state: LedgerState, cache: CacheState, request: Hashable, candidate: SourceCandidate, *,
              ticket: int, paused: bool = False) -> CacheResult | Refusal:
    if candidate.cid is None:
        raise InvalidRequest("nothing to wait for at root")
    if request in cache.waiters:
        raise InvalidRequest(f"{request!r} already waits; release or reselect first")
    c = cache.checkpoints.get(candidate.cid)
    if c is None:
        return Refusal("source_gone", None, f"checkpoint {candidate.cid} no longer exists")
    objs = set(c.object_ids())
    for pid in candidate.carried:  # WAIT-1: with its compatible input point and bounded anchors
        p = cache.checkpoints.get(pid)
        if p is not None:
            objs.update(p.object_ids())
    objs = tuple(sorted(o for o in objs if state.objects[o].holders))
    e = Edit(state, cache)
    e.add(plan_add_holders(e.state, objs, wait_holder(request)))
    e.put_waiter(WaitRef(request, c.cid, objs, ticket, paused))
    return e.finish("wait", note=f"{request!r} waits on {c.cid}")


def plan_release_wait(state: LedgerState, cache: CacheState, request: Hashable) -> CacheResult:
    """Reselection, cancel, timeout or shutdown: the waiting reference ends (WAIT-4)."""
    w = cache.waiters.get(request)
    if w is None:
        raise InvalidRequest(f"{request!r} holds no waiting reference")
    e = Edit(state, cache)
    e.end_wait(request)
    return e.finish("release_wait")


def revocable_waiters(cache: CacheState, *, ticket: int | None, fresh: bool) -> list:
    """WAIT-2: the waiters this applicant may revoke, youngest first."""
    out = []
    for w in cache.waiters.values():
        if fresh and (w.paused or ticket is None or w.ticket <= ticket):
            continue
        out.append(w)
    out.sort(key=lambda w: -w.ticket)
    return out


def plan_revoke_wait(state: LedgerState, cache: CacheState, request: Hashable) -> CacheResult:
    """Revoke one waiting protection; the affected request must reselect (WAIT-2)."""
    res = plan_release_wait(state, cache, request)
    return res._replace(outcome=res.outcome + (WaitRevoked(request),))
