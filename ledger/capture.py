"""Capture, generation end, pause, cancel and clear (SAVE-1..6, REC-1..9, SH-1, BIND-6/7, PAUSE-2).

The engine calls `plan_capture` right after the chunk that ends exactly on a semantic
frontier (the actual input recovery point, an explicit anchor, a shared marker, REC-8 /
SAVE-1: a chunk end by itself is never a save). The request's `SequenceView` names its live
StateImage object and KV pages; the capture copies the StateImage into a destination (a Device
slot, else a Host block, else room made by an admitted reclamation, SAVE-2/SAVE-5) and has the
new checkpoint hold the KV pages it covers, sharing them with the writer (no KV copy, BIND-3,
SAVE-3). A shared entry at a partial page still being written takes a copy of that tail page
(SAVE-3); failing the shared part keeps the private part (SAVE-4). A capture never blocks: with
no room it is skipped and returns a Refusal saying why (SAVE-5). While a recovery permit is in
force every optional capture is skipped (SAVE-6, RD-1).
"""
from __future__ import annotations

from typing import Hashable, NamedTuple

from ledger import arena as host
from ledger import outcomes as oc
from ledger import reclamation as rc
from ledger.reclamation import demand as ev
from ledger.reclamation.edit import CacheResult, Edit
from ledger.cache_state import (
    MAX_ANCHORS,
    CacheState,
    Checkpoint,
    InputKind,
    PointKind,
    SharedEntry,
    Tier,
    seq_holder,
)
from ledger.effects import CopyToHost, CopyUnit
from ledger.errors import InvalidRequest
from ledger.identity import InputIdentity
from ledger.objects import plan_add_holders, plan_allocate, plan_copy_on_write, plan_drop_holders
from ledger.ops import Builder, HostTake, PutObject
from ledger.plan import Plan, Proof, Refusal, finish, shortfall
from ledger.state import HOST, HOST_MEDIUM, LedgerState, PhysicalObject, Replica


import immutables

_EMPTY = immutables.Map()


class SequenceView(NamedTuple):
    """What the engine's active request holds now (under `seq_holder(request)`)."""

    request: Hashable
    identity: InputIdentity  # committed tokens [0, execution_frontier)
    state: int  # its live StateImage object, at execution_frontier
    kv: tuple  # ((pool, (page ids in position order)), ...)

    @property
    def frontier(self) -> int:
        return len(self.identity.tokens)


class CaptureRequest(NamedTuple):
    view: SequenceView  # at the capture frontier
    private: str | None = PointKind.INPUT  # INPUT | ANCHOR | None (shared only)
    input_kind: str = InputKind.RESPONSE_REPLAY  # REC-3..6 for an INPUT point
    shared: bool = False  # also (or only) a shared entry here (SH-1)
    explicit: bool = True  # the shared entry comes from a caller marker (RD-10)
    allow_reclaim: bool = True  # SAVE-5: room may be made only through admission (RCL-10/11)


def _coverage(state: LedgerState, view: SequenceView, frontier: int) -> tuple:
    out = []
    for pool, pages in view.kv:
        pt = state.pool(pool).spec.page_tokens
        out.append((pool, tuple(pages[: -(-frontier // pt)])))
    return tuple(out)


def plan_host_object(state: LedgerState, pool: str, holder: Hashable, src_unit: int, content=None):
    """A new object with only a Host replica, filled from a Device unit (D2H) at commit.
    A StateImage is one contiguous block, placed first-fit (HOST-1)."""
    spec = state.pool(pool).spec
    got = host.alloc(state.arena, spec.unit_bytes)
    if got is None:
        s = host.place(state.arena, [host.HostAllocation(spec.unit_bytes)])
        return shortfall({HOST: s.bytes_missing or 0}, s)
    _, offset = got
    b = Builder(state)
    b.do(HostTake(offset, spec.unit_bytes, 1))
    oid = b.new_id()
    b.do(PutObject(PhysicalObject(oid, spec.object_kind, pool, content, 1, None,
                                  Replica(HOST_MEDIUM, offset, spec.unit_bytes, True), frozenset((holder,)),
                                  frozenset(), frozenset())))
    b.effects.append(CopyToHost(pool, src_unit, offset, spec.unit_bytes))
    return finish(b, "host_object", Proof(host_placed=((oid, offset),)))


def _state_destination(e: Edit, view: SequenceView, cid: int, budget: int, owner_tier: int, demand: int,
                       allow_reclaim: bool, owner: tuple | None = None):
    """SAVE-2: a Device slot, else a Host block, else an admitted reclamation (SAVE-5).
    Returns the new StateImage object id, or the Refusal explaining the skip."""
    holder = ("ckpt", cid)
    so = e.state.objects[view.state]
    pool = so.pool
    if e.state.pool(pool).available >= 1:
        got = e.add(plan_allocate(e.state, pool, 1, holder, contents=(("state", cid),)))
        e.chain.effects.append(CopyUnit(pool, so.device.location, got.proof.allocated[0][2]))
        return got.proof.allocated[0][0]
    got = plan_host_object(e.state, pool, holder, so.device.location, ("state", cid))
    if isinstance(got, Plan):
        e.add(got)
        return got.proof.host_placed[0][0]
    if not allow_reclaim:
        return got
    # SAVE-5 / RCL-10/11: reclaim only what the capture's own admission allows; an owner
    # beyond the reuse segment's soft target has only normal rights (HEAT-4).
    if owner_tier == Tier.REUSE and owner is not None and owner in ev.beyond_target(e.state, e.cache):
        owner_tier = Tier.NORMAL
    applicant = rc.Applicant(rc.ApplicantKind.CAPTURE, budget=budget, demand_time=demand, tier=owner_tier)
    facts = None
    for gap in (rc.Gap(pool, 1), rc.Gap(HOST, e.state.pool(pool).spec.unit_bytes)):
        if facts is None or not facts.valid_for(e.state, e.cache):
            facts = rc.quote_facts(e.state, e.cache)  # RCL-2: the State and Host gaps share them
        q = facts.quote(gap, applicant, protect=(view.state,))
        if not q.admitted:
            continue
        m = e.mark()
        rc.apply_quote(e, q)
        again = _state_destination(e, view, cid, 0, owner_tier, demand, False, owner)
        if not isinstance(again, Refusal):
            e.note(oc.ReclaimedForCapture(gap.pool, q.loss))
            return again
        e.rollback(m)
    return got


def _fallback(cache: CacheState, ident: InputIdentity) -> int:
    """The deepest existing point that is an exact prefix of `ident` (RCL-5, RCL-11)."""
    from ledger.reclamation.prefixes import deepest_prefix_cid

    cid = deepest_prefix_cid(cache, ident)
    return cache.checkpoints[cid].frontier if cid else 0


def plan_capture(state: LedgerState, cache: CacheState, req: CaptureRequest) -> CacheResult | Refusal:
    view = req.view
    use = cache.active.get(view.request)
    if use is None:
        raise InvalidRequest(f"request {view.request!r} is not bound")
    if req.private not in (None, PointKind.INPUT, PointKind.ANCHOR):
        raise InvalidRequest(f"private capture kind {req.private!r}")
    if state.recovery_permit is not None:  # SAVE-6, RD-1: no optional capture during recovery
        return Refusal("recovery_in_force", None, "optional captures are skipped while a recovery permit is held")
    f = view.frontier
    if f == 0:
        return Refusal("nothing_to_save", None, "frontier 0 is root")
    ident = view.identity
    e = Edit(state, cache)
    rec = cache.records[use.rid]
    now = cache.clock
    demand = ev.demand_time_at(cache, ident)  # RCL-9: the candidate position's own demand
    kv = _coverage(state, view, f)
    state_oid = None
    if req.private is not None:
        existing = [cache.checkpoints[c] for c in rec.points()]
        same = [c for c in existing if c.identity == ident and c.kind == req.private]
        if same:  # SAVE-6: an existing compatible point is carried as it is
            e.note(oc.Carried(same[0].cid))
            state_oid = same[0].state
        else:
            if req.private == PointKind.INPUT and rec.input_point is not None:
                e.drop_point(rec.input_point)  # REC-9: the obsolete input point retires first
                e.note(oc.Retired(rec.input_point))
            if req.private == PointKind.ANCHOR and len(rec.anchors) >= MAX_ANCHORS:
                oldest = e.cache.checkpoints[rec.anchors[0]]  # REC-9: replace the oldest published
                if not rc.safely_removable(e.state, e.cache, oldest):
                    return Refusal("anchor_limit", None, "four anchors and the oldest is protected (REC-9)")
                e.drop_point(oldest.cid)
                e.note(oc.ReplacedAnchor(oldest.cid))
            cid = e.new_id()
            budget = f - _fallback(e.cache, ident)  # RCL-11: fixed added coverage
            rec_now = e.cache.records[use.rid]
            got = _state_destination(e, view, cid, budget, rec_now.tier, demand, req.allow_reclaim, ("rec", use.rid))
            if isinstance(got, Refusal):
                e.note(oc.PrivateSkipped(got.reason))
                if not req.shared:
                    if e.empty:
                        return got
                    return e.finish("capture", note="skipped; obsolete point retired")
            else:
                c = Checkpoint(cid, ("rec", use.rid), req.private, ident, got, kv, now,
                               req.input_kind if req.private == PointKind.INPUT else "", demand)
                e.put_point(c, hold=False)
                hold = [oid for _, pages in kv for oid in pages]
                if hold:
                    e.add(plan_add_holders(e.state, hold, c.holder))  # BIND-3: no KV copy
                r = e.cache.records[use.rid]
                if req.private == PointKind.INPUT:
                    r = r._replace(input_point=cid)
                    if demand:  # HEAT-3: repeated demand promotes the owner through its input point
                        r = r._replace(tier=Tier.REUSE, demand_time=max(r.demand_time, demand), proven_frontier=f)
                else:
                    r = r._replace(anchors=r.anchors + (cid,))
                e.put_record(r)
                e.note(oc.PrivateSaved(cid))
                state_oid = got
    if req.shared:
        m = e.mark()
        got = _capture_shared(e, view, ident, kv, state_oid, demand, req)
        if isinstance(got, Refusal):
            e.rollback(m)
            e.note(oc.SharedSkipped(got.reason))  # SAVE-4: the private part stays
            if e.empty:
                return got
    if e.empty and not e.outcome:
        return Refusal("nothing_to_save", None, "")
    return e.finish("capture", note=f"at {f}")  # HEAT-4: quotes place the reuse segment


def _capture_shared(e: Edit, view: SequenceView, ident, kv, state_oid, demand, req):
    from ledger import prefix_index as px

    for cid in px.same(e.cache.index, ident):
        c = e.cache.checkpoints[cid]
        if c.kind == PointKind.SHARED and c.identity == ident:
            e.note(oc.SharedExists(cid))
            return cid
    cid = e.new_id()
    if state_oid is None:  # no private point here: the entry takes its own destination
        got = _state_destination(e, view, cid, len(ident.tokens) - _fallback(e.cache, ident), Tier.NORMAL, demand,
                                 req.allow_reclaim)
        if isinstance(got, Refusal):
            return got
        state_oid = got
        own_state = True
    else:
        own_state = False  # SH-1: one state, two uses, shared by reference
    pages_out = []
    me = seq_holder(view.request)
    for pool, pages in kv:
        pt = e.state.pool(pool).spec.page_tokens
        pages = list(pages)
        if pages and len(ident.tokens) % pt and me in e.state.objects[pages[-1]].holders:
            # SAVE-3: an independent view of a partial page the writer is still filling.
            got = e.add(plan_copy_on_write(e.state, pages[-1], ("ckpt", cid), content=("tail", cid)))
            if isinstance(got, Refusal):
                return got
            pages[-1] = got.proof.allocated[0][0]
            tail_copied = True
        else:
            tail_copied = False
        pages_out.append((pool, tuple(pages), tail_copied))
    c = Checkpoint(cid, ("shared", cid), PointKind.SHARED, ident, state_oid,
                   tuple((p, pg) for p, pg, _ in pages_out), e.cache.clock, "", demand)
    e.put_point(c, hold=False)
    hold = [] if own_state else [state_oid]
    for pool, pages, copied in pages_out:
        hold.extend(pages[:-1] if copied else pages)
    if hold:
        e.add(plan_add_holders(e.state, hold, c.holder))
    tier = Tier.REUSE if demand else Tier.NORMAL
    e.put_shared(SharedEntry(cid, cid, tier, demand, len(ident.tokens) if demand else 0, req.explicit))
    e.note(oc.SharedSaved(cid))
    return cid


# -- the end of a request -----------------------------------------------------------------
def _release_seq(e: Edit, view: SequenceView) -> None:
    me = seq_holder(view.request)
    held = [oid for oid in (view.state,) + tuple(o for _, pages in view.kv for o in pages)
            if oid in e.state.objects and me in e.state.objects[oid].holders]
    if held:
        e.add(plan_drop_holders(e.state, held, me))


def plan_publish_end(state: LedgerState, cache: CacheState, view: SequenceView, *, cancel: bool = False) -> CacheResult:
    """BIND-6: a normal finish freezes the execution state as the new E (a handover of the
    live StateImage, no copy) and releases the request's writable view; a cancel only releases
    it. BIND-7: an older request finishing late never takes a session name a newer publication
    holds; its history stays reusable by exact content. Completion adds no heat (HEAT-1)."""
    use = cache.active.get(view.request)
    if use is None:
        raise InvalidRequest(f"request {view.request!r} is not bound")
    e = Edit(state, cache)
    rec = cache.records[use.rid]
    if not cancel and view.frontier > 0:
        if rec.end is not None:
            e.drop_point(rec.end)  # REC-1: one E per record
        cid = e.new_id()
        kv = _coverage(state, view, view.frontier)
        same = [c for c in (e.cache.checkpoints[p] for p in e.cache.records[use.rid].points())
                if c.identity == view.identity]
        # REC-9: no extra image per generation; same-position uses share one physical state.
        st = view.state
        if same:
            so = e.state.objects[same[0].state]
            if so.device is not None and so.device.complete:
                st = same[0].state
            else:  # the kept point lies on Host only: it takes the live Device state instead
                for c in same:
                    e.add(plan_add_holders(e.state, [view.state], c.holder))
                    e.add(plan_drop_holders(e.state, [c.state], c.holder))
                    e.replace_point(c._replace(state=view.state))
        e.put_point(Checkpoint(cid, ("rec", use.rid), PointKind.END, view.identity, st, kv, cache.clock))
        rec = e.cache.records[use.rid]._replace(end=cid)
        e.note(oc.EndPublished(cid))
    else:
        rec = e.cache.records[use.rid]
    _release_seq(e, view)
    sessions = e.cache.sessions
    if rec.session is not None:
        holder = sessions.get(rec.session)
        other = e.cache.records.get(holder) if holder is not None else None
        if other is not None and other.rid != rec.rid and other.publication_order > rec.publication_order:
            rec = rec._replace(session=None)  # BIND-7: the newer publication keeps the name
            e.note(oc.SessionKeptByNewer(other.rid))
        else:
            sessions = sessions.set(rec.session, rec.rid)
    e.put_record(rec._replace(active=None))
    snap = use.snapshot
    e.set(active=e.cache.active.delete(view.request), sessions=sessions)
    if snap is not None and snap in e.cache.checkpoints:
        e.drop_point(snap)
    e.prune_record(use.rid)  # CFG-7
    return e.finish("end" if not cancel else "cancel")


def plan_cancel_paused(state: LedgerState, cache: CacheState, request: Hashable) -> CacheResult:
    """A paused request (no writable view) is cancelled or ends: its snapshot and its binding go
    (BIND-6: optional caches it took over may go; other owners stay valid)."""
    if request not in cache.active:
        raise InvalidRequest(f"request {request!r} is not bound")
    from ledger.identity import identity_of

    return plan_publish_end(state, cache, SequenceView(request, identity_of(()), -1, ()), cancel=True)


def plan_pause(state: LedgerState, cache: CacheState, view: SequenceView, *, snapshot: bool) -> CacheResult:
    """PAUSE-2: Snapshot keeps the execution position as the request's own checkpoint (never
    in the index, SRC-5); Replay keeps nothing. Either way the writable view is released and
    the request stays bound to its record (PAUSE-1)."""
    use = cache.active.get(view.request)
    if use is None:
        raise InvalidRequest(f"request {view.request!r} is not bound")
    e = Edit(state, cache)
    snap = None
    if snapshot and view.frontier > 0:
        snap = e.new_id()
        e.put_point(Checkpoint(snap, ("snap", view.request), PointKind.SNAPSHOT, view.identity, view.state,
                               _coverage(state, view, view.frontier), cache.clock))
    _release_seq(e, view)
    e.set(active=e.cache.active.set(view.request, use._replace(snapshot=snap)))
    e.note(oc.Paused("snapshot" if snap else "replay", snap))
    return e.finish("pause")


def plan_revoke_snapshot(state: LedgerState, cache: CacheState, request: Hashable) -> CacheResult | Refusal:
    """PAUSE-4: a revoked pause snapshot drops its references; the request turns to Replay."""
    use = cache.active.get(request)
    if use is None or use.snapshot is None:
        return Refusal("no_snapshot", None, f"{request!r} holds no snapshot")
    e = Edit(state, cache)
    e.drop_point(use.snapshot)
    e.set(active=e.cache.active.set(request, use._replace(snapshot=None)))
    return e.finish("revoke_snapshot")


def plan_clear(state: LedgerState, cache: CacheState) -> CacheResult:
    """Drop every record, shared entry, snapshot and waiting reference (no request active)."""
    if cache.active:
        raise InvalidRequest(f"cannot clear with bound requests {sorted(map(repr, cache.active))}")
    e = Edit(state, cache, bulk=True)  # the victim order is rebuilt (empty) at finish
    for req in list(cache.waiters.keys()):
        e.end_wait(req)
    for cid in list(e.cache.checkpoints.keys()):
        e.drop_point(cid)
    e.set(records=_EMPTY, shared=_EMPTY, sessions=_EMPTY, index=_EMPTY)
    return e.finish("clear")
