"""The edit a reclamation produces (RCL-2, RCL-5..7, WAIT-2, PAUSE-4, RD-4): `plan_reclaim` turns a
quote made on the very same states into a `CacheResult` (a stale quote is refused: quote again),
and `apply_quote` writes a quote's chosen actions into an open `Edit` — the HEAT-4 tier demotions
the quote read, each Host victim and deletion or duplicate drop (revoking the waiters it names,
turning a deleted pause snapshot's request to Replay), then one batched demotion transaction of
whatever still may move. The plan's ops re-check every object's version at commit (RCL-2, RCL-5).
"""
from __future__ import annotations

from ledger import outcomes as oc
from ledger.cache_state import CacheState, Checkpoint, PointKind
from ledger.objects import plan_drop_replica
from ledger.plan import Refusal
from ledger.reclamation.demand import demote_tiers
from ledger.reclamation.edit import CacheResult, Edit
from ledger.reclamation.terms import Action, Quote
from ledger.state import DEVICE, HOST_MEDIUM, LedgerState, TxnKind
from ledger.transactions import TransferRequest, plan_begin_transfer


def plan_reclaim(state: LedgerState, cache: CacheState, q: Quote) -> CacheResult | Refusal:
    """Commit a quote's victim set (RCL-2: a quote is void once anything changed)."""
    if q.base is not state or q.cache is not cache:
        return Refusal("stale_quote", None, "resources changed since the quote; quote again (RCL-2)")
    if not q.admitted:
        return Refusal("not_admitted", None, f"no admissible action set closes the gap {q.gap}")
    e = Edit(state, cache)
    apply_quote(e, q)
    victims = tuple((a.kind, a.cids, a.objects) for a in q.chosen)
    return e.finish("reclaim", note=f"gap {q.gap.pool} {q.gap.amount}, loss {q.loss}", victims=victims)


def apply_quote(e: Edit, q: Quote) -> None:
    """Apply a quote's chosen actions to an Edit (deletions, duplicate drops, then one batched
    demotion transaction, RCL-7). Waiters revoked here must reselect (WAIT-2)."""
    if q.cold:
        e.cache = demote_tiers(e.cache, q.cold)  # HEAT-4, RD-4: the tier demotions the quote used
    demote, groups = [], []
    for a in q.chosen:
        for hv in a.host_victims:
            _apply_one(e, hv)
        if a.kind == "demote":
            demote.extend(a.objects)
            groups.append(a.objects)
        else:
            _apply_one(e, a)
    # RCL-6/RCL-7: re-validate what moves before the transfer starts: an object this plan's
    # deletions freed (or that is no longer a Device-only replica) leaves the batch, never raises.
    stale = [oid for oid in demote if not _demotable(e.state, oid)]
    if stale:
        e.note(oc.DemotionStale(tuple(stale)))
        demote = [oid for oid in demote if oid not in stale]
        groups = [g for g in (tuple(o for o in g if o not in stale) for g in groups) if g]
    if demote and e.state.transaction is None:
        # RCL-7: one transaction for the batch; if its reservation fails, the single groups.
        for objs in [tuple(demote)] + (groups if len(groups) > 1 else []):
            got = plan_begin_transfer(e.state, TransferRequest(TxnKind.DEMOTION, ("reclaim",), objs, HOST_MEDIUM,
                                                               drop_source=True))
            if not isinstance(got, Refusal):
                e.add(got)
                e.note(oc.DemotionBegun(got.proof.generation, objs))
                break
            e.note(oc.DemotionRefused(got.reason, objs))


def safely_removable(state: LedgerState, cache: CacheState, c: Checkpoint) -> bool:
    """REC-9: a point may be replaced only if no waiter or reader protects it."""
    for oid in c.object_ids():
        o = state.objects.get(oid)
        if o is None or o.leases or any(h[0] == "wait" for h in o.holders):
            return False
    return True


def _demotable(state: LedgerState, oid: int) -> bool:
    """Still alive and held, with a complete Device replica and no Host one (RCL-6)."""
    o = state.objects.get(oid)
    return o is not None and bool(o.holders) and o.device is not None and o.device.complete and o.host is None


def _apply_one(e: Edit, a: Action) -> None:
    for req in a.waiters:
        if req in e.cache.waiters:
            e.end_wait(req)  # WAIT-2: the request must reselect
            e.note(oc.WaitRevoked(req))
    if a.kind == "drop_replica":
        for oid in a.objects:
            o = e.state.objects.get(oid)
            other = None if o is None else (o.host if a.medium == DEVICE else o.device)
            if o is None or o.replica(a.medium) is None or other is None or not other.complete:
                e.note(oc.DropStale(oid))  # RCL-5/RCL-7: freed by this plan's deletions: nothing to drop
                continue
            got = e.add(plan_drop_replica(e.state, oid, a.medium))
            if isinstance(got, Refusal):
                e.note(oc.DropRefused(oid, got.reason))  # the stale part is refused, the rest applies
        return
    for cid in a.cids:
        c = e.cache.checkpoints.get(cid)
        if c is None:
            continue
        if c.kind == PointKind.SNAPSHOT:  # PAUSE-4: the paused request turns to Replay
            req = c.owner[1]
            use = e.cache.active.get(req)
            if use is not None:
                e.set(active=e.cache.active.set(req, use._replace(snapshot=None)))
        e.drop_point(cid)
        e.note(oc.Deleted(cid))
