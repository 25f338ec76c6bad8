"""Bind: taking over a record or branching from a source (BIND-1..7, WAIT-3/4, TXN-2).

`plan_bind` turns a `SourceCandidate` into one all-or-nothing plan, in the commit order of
WAIT-4: retire the approved deeper points first (their freed space counts, BIND-4), then the
request's writable view (KV pages shared by reference, a partial tail page copied when the
page is not the writer's alone, BIND-4; the StateImage Moved when exclusive, otherwise a fresh
slot filled from the source, BIND-5), then its first unit permit (TXN-2). Any refusal drops
the whole chain: a failed bind retires nothing (SRC-4). Only after the plan is built are the
record, the evidence and the waiting reference updated (WAIT-4, HEAT-1/2).

Objects with no complete Device replica are brought over first by a bind transaction
(`plan_bind_transfer`, TXN-1/2); `plan_bind` refuses with reason "needs_transfer" until then.
"""
from __future__ import annotations

from typing import Hashable, NamedTuple

from ledger.reclamation import demand as ev
from ledger.reclamation.edit import CacheResult, Edit
from ledger.cache_state import ActiveUse, CacheState, Checkpoint, seq_holder
from ledger.effects import CopyToDevice, CopyUnit
from ledger.errors import InvalidRequest
from ledger.objects import plan_add_holders, plan_allocate, plan_copy_on_write
from ledger import outcomes as oc
from ledger.permits import UnitDemand, plan_unit_permit
from ledger.plan import Refusal
from ledger.sources import SourceCandidate, Takeover, exclusive
from ledger.state import DEVICE, STATE_POOL, LedgerState, TxnKind
from ledger.transactions import TransferRequest, plan_begin_transfer


class BindRequest(NamedTuple):
    request: Hashable
    candidate: SourceCandidate
    session: Hashable = None
    first_unit: UnitDemand | None = None  # TXN-2: the first unit permit (RECOVERY for a paused recovery)
    state_pool: str = STATE_POOL
    ticket: int = 0  # the original ticket (WAIT-2 ordering)
    resume: bool = False  # a paused request rebuilding its binding (PAUSE-2): no evidence (HEAT-3)


def plan_bind_transfer(state: LedgerState, cache: CacheState, request: Hashable, candidate: SourceCandidate):
    """TXN-1/2: begin a bind transaction copying the candidate's Host-only objects to Device."""
    c = cache.checkpoints.get(candidate.cid)
    if c is None:
        return Refusal("source_gone", None, f"checkpoint {candidate.cid} no longer exists")
    missing = [oid for oid in candidate.missing if oid in state.objects and state.objects[oid].device is None]
    if not missing:
        return Refusal("nothing_to_transfer", None, "every object already has a Device replica")
    return plan_begin_transfer(state, TransferRequest(TxnKind.BIND, request, tuple(missing), DEVICE))


def _tail_shared_with_writer(state: LedgerState, cache: CacheState, oid: int, frontier: int, me: tuple) -> bool:
    """BIND-4: may the new writer append into this partial page without a copy? Only when no
    other writer holds it and every other holder needs at most the positions below `frontier`."""
    o = state.objects[oid]
    for h in o.holders - {me}:
        if h[0] == "seq":
            return False
        if h[0] == "ckpt":
            c = cache.checkpoints.get(h[1])
            if c is None or c.frontier > frontier:
                return False
        elif h[0] == "wait":
            w = cache.waiters.get(h[1])
            if w is None or cache.checkpoints[w.cid].frontier > frontier:
                return False
        else:
            return False
    return True


def plan_bind(state: LedgerState, cache: CacheState, req: BindRequest) -> CacheResult | Refusal:
    cand = req.candidate
    if not isinstance(cand, SourceCandidate):
        raise InvalidRequest("plan_bind needs a SourceCandidate from query_sources")
    paused_use = cache.active.get(req.request)
    if (paused_use is not None) != bool(req.resume):
        raise InvalidRequest(f"request {req.request!r}: bound={paused_use is not None}, resume={req.resume}")
    if cand.takeover == Takeover.SNAPSHOT and not req.resume:
        raise InvalidRequest("only a paused request redeems its snapshot")
    me = seq_holder(req.request)
    e = Edit(state, cache)
    now = e.tick()
    pub = cache.next_publication  # RD-13: publication order assigned at bind, in admission order
    if paused_use is None:
        e.set(next_publication=pub + 1)
    src: Checkpoint | None = None
    if cand.cid is not None:
        src = cache.checkpoints.get(cand.cid)
        if src is None:
            return Refusal("source_gone", None, f"checkpoint {cand.cid} was retired; query again (SRC-5)")
    takeover, retired = cand.takeover, cand.retired
    if paused_use is not None and takeover in (Takeover.MOVE, Takeover.TAKEOVER_FORK) and cand.rid is not None:
        # PAUSE-1: a resume keeps its own record; it takes over no other record, retires none of
        # its points and never Moves their state (BIND-5): an independent Fork.
        takeover, retired = Takeover.FORK, ()
    if src is not None and takeover == Takeover.MOVE and not exclusive(state, cache, src, req.request):
        # BIND-5: a Move hands over a state only this point holds (the candidate may be stale)
        takeover = Takeover.TAKEOVER_FORK if cand.rid is not None else Takeover.FORK
    if src is not None:
        in_place = takeover in (Takeover.MOVE, Takeover.SNAPSHOT)
        missing = tuple(oid for oid in src.object_ids() if (state.objects[oid].device is None
                        or not state.objects[oid].device.complete) and (in_place or oid != src.state))
        if missing:
            return Refusal("needs_transfer", None, f"objects {missing} have no complete Device replica (TXN-2)")
        txn = state.transaction
        if txn is not None and {j.object_id for j in txn.jobs} & set(src.object_ids()):
            # SRC-5: a source in flight (e.g. leaving Device by a demotion) is waited for, not bound
            return Refusal("source_busy", None, f"transaction {txn.generation} moves part of checkpoint {src.cid}")

    if paused_use is None and cand.rid is not None and takeover in (Takeover.MOVE, Takeover.TAKEOVER_FORK):
        r0 = cache.records.get(cand.rid)
        if r0 is None or r0.active is not None:
            return Refusal("source_gone", None, f"record {cand.rid} is gone or active; query again (BIND-2)")
        e.put_record(r0._replace(active=req.request))  # the relation moves forward (BIND-1)
    # 1. BIND-4: retire the deeper private points approved for replacement first.
    for pid in retired:
        if pid in e.cache.checkpoints:
            e.drop_point(pid)
            e.note(oc.Retired(pid))

    # 2. The writer's view.
    view_kv, view_state = [], None
    if src is None:
        got = e.add(plan_allocate(e.state, req.state_pool, 1, me, contents=(("fresh", req.request),)))
        if isinstance(got, Refusal):
            return got
        view_state = got.proof.allocated[0][0]
    else:
        for pool, pages in src.kv:
            if not pages:
                view_kv.append((pool, ()))
                continue
            spec = e.state.pool(pool).spec
            full = list(pages)
            tail = None
            if src.frontier % spec.page_tokens:
                tail = full.pop()
            if full:
                e.add(plan_add_holders(e.state, full, me))  # full pages are shared, never copied
            if tail is not None:
                # A Move hands the page over; otherwise copy it unless the writer may append.
                if takeover in (Takeover.MOVE, Takeover.SNAPSHOT, Takeover.TAKEOVER_FORK) and \
                        _tail_shared_with_writer(e.state, e.cache, tail, src.frontier, me):
                    e.add(plan_add_holders(e.state, [tail], me))
                else:
                    got = e.add(plan_copy_on_write(e.state, tail, me, content=("tail", req.request, tail)))
                    if isinstance(got, Refusal):
                        return got
                    e.note(oc.TailCopied(tail))
                    tail = got.proof.allocated[0][0]
            view_kv.append((pool, tuple(full) + ((tail,) if tail is not None else ())))
        if takeover in (Takeover.MOVE, Takeover.SNAPSHOT):  # BIND-5: exclusive E is Moved
            e.add(plan_add_holders(e.state, [src.state], me))
            view_state = src.state
        else:  # BIND-5: Fork: a fresh slot filled from the immutable source
            so = e.state.objects[src.state]
            got = e.add(plan_allocate(e.state, so.pool, 1, me, contents=(("fork", req.request, src.state),)))
            if isinstance(got, Refusal):
                return got
            unit = got.proof.allocated[0][2]
            view_state = got.proof.allocated[0][0]
            if so.device is not None and so.device.complete:  # TXN-2: never read a pending replica
                e.chain.effects.append(CopyUnit(so.pool, so.device.location, unit))
            else:
                e.chain.effects.append(CopyToDevice(so.host.location, so.pool, unit, so.host.nbytes))

    # 3. TXN-2: the first unit permit (or the full recovery permit) with the bind.
    permit = None
    if req.first_unit is not None:
        got = e.add(plan_unit_permit(e.state, req.first_unit))
        if isinstance(got, Refusal):
            return got
        permit = got.proof.permits[0]
        e.note(oc.PermitTaken(permit))

    # 4. WAIT-3/4: the request's own waiting reference is handed over now.
    orphan = src is not None and src.owner[0] == "wait"
    if req.request in e.cache.waiters:
        e.end_wait(req.request)  # an orphaned source point of this waiter goes with it

    # 5. Records and evidence (only now: WAIT-4).
    if paused_use is not None:  # PAUSE-1/5: same record, same publication order, no heat
        if src is not None and takeover == Takeover.SNAPSHOT:
            e.drop_point(src.cid)
        use = e.cache.active[req.request]
        e.set(active=e.cache.active.set(req.request, use._replace(snapshot=None)))
        e.note(oc.Resumed(takeover, use.rid, permit))
        e.note(oc.View(view_state, tuple(view_kv)))
        return e.finish("bind", note=f"resume {takeover} at {cand.frontier}")
    if src is None or orphan:  # a root, or WAIT-3: the waiter's own old point (the directory was replaced)
        rid = e.new_record(session=req.session, publication=pub, active=req.request).rid
    elif takeover in (Takeover.MOVE, Takeover.TAKEOVER_FORK):
        rid = cand.rid
        if takeover == Takeover.MOVE:
            e.drop_point(src.cid)  # the E state now belongs to the writer (kept: it holds it)
        rec = e.cache.records[rid]
        rec = rec._replace(active=req.request, publication_order=pub,
                           session=rec.session if rec.session is not None else req.session)
        rec = ev.inherit_pair(rec, src.frontier, now, consume=True)  # HEAT-1: Consume resets the pair
        e.put_record(rec)
        e.cache = ev.observe_adoption(e.cache, req.request, src.cid, now, own=False)
    else:  # FORK: an independent branch; the child takes this adoption's time and position
        child = e.new_record(session=req.session, publication=pub, active=req.request)
        kind, key = src.owner
        e.cache = ev.observe_adoption(e.cache, req.request, src.cid, now, own=False)
        child = e.cache.records[child.rid]
        child = ev.inherit_pair(child, src.frontier, now, consume=True) if src.frontier else child
        e.put_record(child)
        if kind == "rec" and key in e.cache.records:  # RD-6: parent updated only if covered
            e.put_record(ev.inherit_pair(e.cache.records[key], src.frontier, now, consume=False))
        rid = child.rid
    if req.session is not None:
        e.set(sessions=e.cache.sessions.set(req.session, rid))
    e.set(active=e.cache.active.set(req.request, ActiveUse(
        req.request, rid, None if src is None else src.cid, 0 if src is None else src.frontier, pub, frozenset())))
    e.note(oc.Bound(takeover, rid, permit))
    e.note(oc.View(view_state, tuple(view_kv)))
    return e.finish("bind", note=f"{takeover} at {cand.frontier}")  # HEAT-4: quotes place the segment
