"""The cache edit: one policy operation's changes to the ledger (a `Chain` of primitive plans) and to
the `CacheState`, closed together into a `CacheResult`. Every change of records, shared entries,
checkpoints and waiting references goes through `Edit`'s methods, which keep the fallback facts
(RCL-5) and queue the victim index's changes (RCL-4, HEAT-4; index_sync.change), brought to the
final replicas when the edit finishes. The engine commits `result.plan` through the Program and,
when that succeeds, keeps `result.cache` as its new policy state; on `StalePlan` it drops both and
plans again. A refusal anywhere returns the ledger's `Refusal` and changes neither (RES-2, SRC-4).
"""
from __future__ import annotations

from typing import NamedTuple

from ledger import prefix_index as px
from ledger.cache_state import (CacheState, Checkpoint, ContinuationRecord, SharedEntry, Tier, WaitRef, dep_item,
                                indexed, wait_holder)
from ledger.chain import Chain
from ledger.errors import InvalidRequest
from ledger.objects import plan_add_holders, plan_drop_holders
from ledger.outcomes import Outcome
from ledger.plan import Plan
from ledger.psorted import PSorted
from ledger.reclamation.index_build import build
from ledger.reclamation.index_sync import change, sync
from ledger.reclamation.prefixes import aliases, deepest_prefix_cid
from ledger.state import LedgerState


class CacheResult(NamedTuple):
    """A policy operation's outcome: the ledger plan and the policy state it leads to."""

    plan: Plan
    cache: CacheState
    outcome: tuple[Outcome, ...] = ()  # what happened, as typed records (ledger/outcomes.py), in order
    ok: bool = True


_KEPT = ("records", "shared", "checkpoints", "index", "waiters", "fallback", "dep_order", "victims")


class Edit:
    """Every change of records, shared entries, checkpoints and waiting references goes through
    these methods, which keep the fallback facts (RCL-5) and the victim order (RCL-4, HEAT-4,
    ledger/reclamation/index.py) current; `finish` brings the order to the final replicas."""

    __slots__ = ("chain", "cache", "base_cache", "outcome", "bulk")

    def __init__(self, state: LedgerState, cache: CacheState, *, bulk: bool = False):
        self.chain = Chain(state)
        if cache.victims is None and not bulk:
            cache = cache._replace(victims=build(state, cache))
        self.cache = cache
        self.base_cache = cache
        self.outcome: list[Outcome] = []
        self.bulk = bulk  # many changes at once: the victim order is rebuilt at finish

    def _victims(self, holders=(), cids=(), owners=(), pools=None) -> None:
        """Queue victim-order changes (applied at `finish`, or by a quote, on the cache then)."""
        if self.bulk:
            return
        c = self.cache
        self.cache = c._replace(victims=change(c.victims, c, holders=holders, cids=cids, owners=owners, pools=pools))

    @property
    def state(self) -> LedgerState:
        return self.chain.state

    def add(self, plan):
        return self.chain.add(plan)

    def new_id(self) -> int:
        c = self.cache
        self.cache = c._replace(next_id=c.next_id + 1)
        return c.next_id

    def tick(self) -> int:
        c = self.cache
        self.cache = c._replace(clock=c.clock + 1)
        return c.clock + 1

    def set(self, **fields) -> None:
        """Other fields (active uses, sessions, clocks); the kept ones have their own methods."""
        if not self.bulk:
            kept = [f for f in fields if f in _KEPT]
            if kept:
                raise InvalidRequest(f"Edit.set({kept}): use put_point/drop_point/put_record/put_shared/put_waiter")
        self.cache = self.cache._replace(**fields)

    def _set(self, **fields) -> None:
        self.cache = self.cache._replace(**fields)

    # -- records -------------------------------------------------------------------------
    def put_record(self, r: ContinuationRecord) -> None:
        self._set(records=self.cache.records.set(r.rid, r))
        self._victims(owners=(("rec", r.rid),))

    def put_shared(self, e: SharedEntry) -> None:
        self._set(shared=self.cache.shared.set(e.sid, e))
        self._victims(owners=(("shared", e.sid),))

    def put_waiter(self, w: WaitRef) -> None:
        """WAIT-1: a waiting reference (its holders are added by the caller's plan)."""
        old = self.cache.waiters.get(w.request)
        self._set(waiters=self.cache.waiters.set(w.request, w))
        h = wait_holder(w.request)
        changes = [(oid, h, -1) for oid in (old.objects if old else ())]
        changes += [(oid, h, +1) for oid in w.objects]
        self._victims(holders=changes, pools={oid: self.state.objects[oid].pool for oid in w.objects})

    def new_record(self, session=None, publication=0, active=None, tier=Tier.NORMAL, demand_time=0,
                   proven=0) -> ContinuationRecord:
        r = ContinuationRecord(self.new_id(), session, publication, None, None, (), tier, demand_time, proven, active)
        self.put_record(r)
        return r

    def prune_record(self, rid: int) -> None:
        """CFG-7: an inactive record with no point left is deleted at once (and its session)."""
        r = self.cache.records.get(rid)
        if r is None or r.points() or r.active is not None:
            return
        recs = self.cache.records.delete(rid)
        sessions = self.cache.sessions
        if r.session is not None and sessions.get(r.session) == rid:
            sessions = sessions.delete(r.session)
        self._set(records=recs, sessions=sessions)
        self._victims(owners=(("rec", rid),))

    # -- checkpoints -----------------------------------------------------------------------
    def put_point(self, c: Checkpoint, *, hold: bool = True) -> None:
        """Register a checkpoint; with `hold`, it takes its holder on its objects (G-3)."""
        if hold:
            self.add(plan_add_holders(self.state, c.object_ids(), c.holder))
        cache = self.cache
        index = px.add(cache.index, c.identity, c.cid) if indexed(c) else cache.index
        self._set(checkpoints=cache.checkpoints.set(c.cid, c), index=index)
        moved = self._link(c)
        if not self.bulk:
            objs = set(c.object_ids())
            objects = self.state.objects
            dirty = {c.cid} | moved | (set(aliases(self.cache, c)) if indexed(c) else set())
            self._victims(holders=[(oid, c.holder, +1) for oid in objs], cids=dirty,
                          pools={oid: objects[oid].pool for oid in objs})

    def replace_point(self, c: Checkpoint) -> None:
        """The same point (identity, owner) with other objects (e.g. another StateImage); the
        caller's plan moves the ledger holders."""
        old = self.cache.checkpoints[c.cid]
        if old.identity != c.identity or old.owner != c.owner or old.kind != c.kind:
            raise InvalidRequest("replace_point keeps identity, owner and kind")
        self._set(checkpoints=self.cache.checkpoints.set(c.cid, c))
        was, now = set(old.object_ids()), set(c.object_ids())
        objects = self.state.objects
        self._victims(holders=[(o, c.holder, -1) for o in was - now] + [(o, c.holder, +1) for o in now - was],
                      cids=(c.cid,), pools={o: objects[o].pool for o in now - was})

    def drop_point(self, cid: int, *, release: bool = True) -> tuple:
        """Retire a checkpoint: leave its owner, the index, and (with `release`) its objects.
        Returns the object ids freed (dropping a point may free nothing, G-3)."""
        cache = self.cache
        c = cache.checkpoints[cid]
        freed = ()
        waiting = sorted((w.request for w in cache.waiters.values() if w.cid == cid), key=repr)
        als = [a for a in aliases(cache, c) if a != cid] if indexed(c) else []
        if waiting and c.owner[0] != "wait":
            # WAIT-1: the owner retires it, a waiter still references it: it stays intact for
            # that waiter only, out of the index (no new public entry), owned by the waiter.
            moved = self._unlink(c)
            index = px.remove(cache.index, c.identity, cid) if indexed(c) else cache.index
            orphan = c._replace(owner=("wait", waiting[0]))
            self._set(checkpoints=self.cache.checkpoints.set(cid, orphan), index=index)
            moved |= self._link(orphan)
            self._victims(cids={cid} | moved | set(als))
            self._leave_owner(c)
            return ()
        if release:
            p = self.add(plan_drop_holders(self.state, c.object_ids(), c.holder))
            freed = p.proof.freed
        index = px.remove(cache.index, c.identity, cid) if indexed(c) else cache.index
        self._set(checkpoints=self.cache.checkpoints.delete(cid), index=index)
        moved = self._unlink(c)
        if not self.bulk:
            self._victims(holders=[(oid, c.holder, -1) for oid in set(c.object_ids())], cids=moved | set(als) | {cid})
        self._leave_owner(c)
        return freed

    def end_wait(self, request) -> None:
        """WAIT-4: a waiting reference ends (adoption, reselection, cancel, revocation): its
        holders go, and a point only it kept goes to another waiter on it, or away."""
        w = self.cache.waiters.get(request)
        if w is None:
            return
        self.add(plan_drop_holders(self.state, w.objects, wait_holder(request)))
        self._set(waiters=self.cache.waiters.delete(request))
        self._victims(holders=[(oid, wait_holder(request), -1) for oid in w.objects])
        c = self.cache.checkpoints.get(w.cid)
        if c is not None and c.owner == ("wait", request):
            others = sorted((x.request for x in self.cache.waiters.values() if x.cid == w.cid), key=repr)
            if others:
                self._set(checkpoints=self.cache.checkpoints.set(w.cid, c._replace(owner=("wait", others[0]))))
                self._victims(cids=(w.cid,))
            else:
                self.drop_point(w.cid)

    def _leave_owner(self, c: Checkpoint) -> None:
        cid = c.cid
        kind, key = c.owner
        if kind == "rec":
            r = self.cache.records.get(key)
            if r is not None:
                r = r._replace(end=None if r.end == cid else r.end,
                               input_point=None if r.input_point == cid else r.input_point,
                               anchors=tuple(a for a in r.anchors if a != cid))
                self.put_record(r)
                self.prune_record(key)
        elif kind == "shared":
            self._set(shared=self.cache.shared.delete(key))
            self._victims(owners=(("shared", key),))

    def mark(self) -> tuple:
        """A point to roll back to (SAVE-4: a failed shared part keeps the private part)."""
        c = self.chain
        return (c.state, len(c.ops), len(c.effects), len(c.proofs), self.cache, len(self.outcome))

    def rollback(self, m: tuple) -> None:
        c = self.chain
        c.state = m[0]
        del c.ops[m[1]:], c.effects[m[2]:], c.proofs[m[3]:]
        self.cache = m[4]
        del self.outcome[m[5]:]

    @property
    def empty(self) -> bool:
        return not self.chain.ops

    # -- fallback facts (RCL-5) -----------------------------------------------------------
    def _link(self, c: Checkpoint) -> set:
        """c's fallback is its deepest indexed exact prefix strictly shallower than c. The points
        that fell back on that prefix (or an alias of it: same identity) and extend c strictly
        now fall back on c; no other point can be affected."""
        cache = self.cache
        cps = cache.checkpoints
        fb = deepest_prefix_cid(cache, c.identity, c.cid, strict=True)
        fallback, dord = cache.fallback.set(c.cid, fb), cache.dep_order
        moved_all: set = set()
        if indexed(c):
            n, toks = c.frontier, c.identity.tokens
            for a in (aliases(cache, cps[fb]) if fb else (0,)):
                order = dord.get(a)
                if order is None:
                    continue
                moved = []
                for dt, d in order.scan(start=(toks,)):  # the points whose tokens extend c's, in a run
                    if dt[:n] != toks:
                        break
                    if len(dt) > n and c.identity.is_prefix_of(cps[d].identity):
                        moved.append(d)
                if moved:
                    moved_all.update(moved)
                    pts = [cps[d] for d in moved]
                    dord = _order_edit(_order_edit(dord, a, pts, -1), c.cid, pts, +1)
                    for d in moved:
                        fallback = fallback.set(d, c.cid)
        dord = _order_edit(dord, fb, (c,), +1)
        self._set(fallback=fallback, dep_order=dord)
        return moved_all

    def _unlink(self, c: Checkpoint) -> set:
        """Points that fell back on c fall back on a surviving alias of c, else on c's own."""
        cache = self.cache
        cps = cache.checkpoints
        fb = cache.fallback.get(c.cid, 0)
        fallback, dord = cache.fallback.delete(c.cid), _order_edit(cache.dep_order, fb, (c,), -1)
        mine = {d for _, d in dord.get(c.cid, ())}
        if mine:
            alive = sorted(a for a in aliases(cache, c) if a != c.cid) if indexed(c) else []
            to = alive[0] if alive else fb
            for d in mine:
                fallback = fallback.set(d, to)
            dord = _order_edit(dord.delete(c.cid), to, [cps[d] for d in mine], +1)
        self._set(fallback=fallback, dep_order=dord)
        return set(mine)

    def note(self, event: Outcome) -> None:
        """Record what happened (one ledger/outcomes.py record) in the result's outcome."""
        self.outcome.append(event)

    def finish(self, kind: str, note: str = "", victims: tuple = ()) -> CacheResult:
        plan = self.chain.finish(kind, note, victims)
        cache = self.cache
        if self.bulk:
            cache = cache._replace(victims=build(plan.result, cache))
        elif cache.victims is not None:
            cache = cache._replace(victims=sync(cache.victims, plan.result, cache))  # the final replicas
        return CacheResult(plan, cache, tuple(self.outcome))


def _order_edit(dord, a: int, points, sign: int):
    """Add (+1) or remove (-1) `points` among the dependents of `a` in token order."""
    o = dord.get(a)
    if o is None:
        o = PSorted()
    for d in points:
        o = o.add(dep_item(d)) if sign > 0 else o.remove(dep_item(d))
    return dord.set(a, o) if len(o) else (dord.delete(a) if a in dord else dord)
