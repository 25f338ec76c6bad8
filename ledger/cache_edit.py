"""`Edit`: one policy operation's changes to the ledger (a `Chain` of primitive plans) and to
the `CacheState`, closed together into a `CacheResult`.

The engine commits `result.plan` through the Program and, when that succeeds, keeps
`result.cache` as its new policy state; on `StalePlan` it drops both and plans again. A
refusal anywhere returns the ledger's `Refusal` and changes neither (RES-2, SRC-4).
"""
from __future__ import annotations

from typing import Hashable, NamedTuple

from ledger import prefix_index as px
from ledger.cache_state import CacheState, Checkpoint, ContinuationRecord, Tier, indexed, wait_holder
from ledger.chain import Chain
from ledger.objects import plan_add_holders, plan_drop_holders
from ledger.plan import Plan
from ledger.state import LedgerState


class CacheResult(NamedTuple):
    """A policy operation's outcome: the ledger plan and the policy state it leads to."""

    plan: Plan
    cache: CacheState
    outcome: tuple = ()  # what happened, in words and ids (e.g. ("private", cid), ("skipped", why))
    ok: bool = True


class Edit:
    __slots__ = ("chain", "cache", "base_cache", "outcome")

    def __init__(self, state: LedgerState, cache: CacheState):
        self.chain = Chain(state)
        self.cache = cache
        self.base_cache = cache
        self.outcome: list = []

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
        self.cache = self.cache._replace(**fields)

    # -- records -------------------------------------------------------------------------
    def put_record(self, r: ContinuationRecord) -> None:
        self.set(records=self.cache.records.set(r.rid, r))

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
        self.set(records=recs, sessions=sessions)

    # -- checkpoints -----------------------------------------------------------------------
    def put_point(self, c: Checkpoint, *, hold: bool = True) -> None:
        """Register a checkpoint; with `hold`, it takes its holder on its objects (G-3)."""
        if hold:
            self.add(plan_add_holders(self.state, c.object_ids(), c.holder))
        cache = self.cache
        index = px.add(cache.index, c.identity, c.cid) if indexed(c) else cache.index
        self.set(checkpoints=cache.checkpoints.set(c.cid, c), index=index)
        self._link(c)

    def drop_point(self, cid: int, *, release: bool = True) -> tuple:
        """Retire a checkpoint: leave its owner, the index, and (with `release`) its objects.
        Returns the object ids freed (dropping a point may free nothing, G-3)."""
        cache = self.cache
        c = cache.checkpoints[cid]
        freed = ()
        waiting = sorted((w.request for w in cache.waiters.values() if w.cid == cid), key=repr)
        if waiting and c.owner[0] != "wait":
            # WAIT-1: the owner retires it, a waiter still references it: it stays intact for
            # that waiter only, out of the index (no new public entry), owned by the waiter.
            self._unlink(c)
            index = px.remove(cache.index, c.identity, cid) if indexed(c) else cache.index
            orphan = c._replace(owner=("wait", waiting[0]))
            self.set(checkpoints=self.cache.checkpoints.set(cid, orphan), index=index)
            self._link(orphan)
            self._leave_owner(c)
            return ()
        if release:
            p = self.add(plan_drop_holders(self.state, c.object_ids(), c.holder))
            freed = p.proof.freed
        index = px.remove(cache.index, c.identity, cid) if indexed(c) else cache.index
        self.set(checkpoints=self.cache.checkpoints.delete(cid), index=index)
        self._unlink(c)
        self._leave_owner(c)
        return freed

    def end_wait(self, request) -> None:
        """WAIT-4: a waiting reference ends (adoption, reselection, cancel, revocation): its
        holders go, and a point only it kept goes to another waiter on it, or away."""
        w = self.cache.waiters.get(request)
        if w is None:
            return
        self.add(plan_drop_holders(self.state, w.objects, wait_holder(request)))
        self.set(waiters=self.cache.waiters.delete(request))
        c = self.cache.checkpoints.get(w.cid)
        if c is not None and c.owner == ("wait", request):
            others = sorted((x.request for x in self.cache.waiters.values() if x.cid == w.cid), key=repr)
            if others:
                self.set(checkpoints=self.cache.checkpoints.set(w.cid, c._replace(owner=("wait", others[0]))))
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
            self.set(shared=self.cache.shared.delete(key))

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
    def _link(self, c: Checkpoint) -> None:
        """c's fallback is its deepest indexed exact prefix strictly shallower than c. The points
        that fell back on that prefix (or an alias of it: same identity) and extend c strictly
        now fall back on c; no other point can be affected."""
        cache = self.cache
        fb = deepest_prefix_cid(cache, c.identity, c.cid, strict=True)
        fallback, deps = cache.fallback.set(c.cid, fb), cache.dependents
        if indexed(c):
            n = c.frontier
            for a in (aliases(cache, cache.checkpoints[fb]) if fb else (0,)):
                moved = [d for d in deps.get(a, ()) if cache.checkpoints[d].frontier > n
                         and c.identity.is_prefix_of(cache.checkpoints[d].identity)]
                if moved:
                    deps = _deps_set(deps, a, deps[a] - set(moved))
                    for d in moved:
                        fallback = fallback.set(d, c.cid)
                    deps = deps.set(c.cid, deps.get(c.cid, frozenset()) | set(moved))
        deps = _deps_set(deps, fb, deps.get(fb, frozenset()) | {c.cid})
        self.set(fallback=fallback, dependents=deps)

    def _unlink(self, c: Checkpoint) -> None:
        """Points that fell back on c fall back on a surviving alias of c, else on c's own."""
        cache = self.cache
        fb = cache.fallback.get(c.cid, 0)
        fallback, deps = cache.fallback.delete(c.cid), cache.dependents
        deps = _deps_set(deps, fb, deps.get(fb, frozenset()) - {c.cid})
        mine = deps.get(c.cid, frozenset())
        if mine:
            alive = sorted(a for a in aliases(cache, c) if a != c.cid) if indexed(c) else []
            to = alive[0] if alive else fb
            for d in mine:
                fallback = fallback.set(d, to)
            deps = _deps_set(deps.delete(c.cid), to, deps.get(to, frozenset()) | mine)
        self.set(fallback=fallback, dependents=deps)

    def note(self, *what) -> None:
        self.outcome.append(what)

    def finish(self, kind: str, note: str = "", victims: tuple = ()) -> CacheResult:
        return CacheResult(self.chain.finish(kind, note, victims), self.cache, tuple(self.outcome))


def holders_outside(state: LedgerState, oid: int, mine: Hashable) -> frozenset:
    o = state.objects.get(oid)
    return frozenset() if o is None else o.holders - {mine}


def _deps_set(deps, key, value):
    return deps.set(key, value) if value else (deps.delete(key) if key in deps else deps)


def aliases(cache: CacheState, c: Checkpoint) -> list:
    """Indexed checkpoints with exactly c's identity (c itself included when indexed)."""
    got = cache.index.get(px.key_of(c.identity), ())
    cps = cache.checkpoints
    return [a for a in got if a in cps and cps[a].identity == c.identity]


def deepest_prefix_cid(cache: CacheState, ident, exclude: int = 0, strict: bool = False) -> int:
    """The deepest indexed checkpoint (not `exclude`) that is an exact prefix of `ident`
    (with `strict`, strictly shorter): the index key narrows by digest, then tokens, media,
    positions and execution are compared (CKP-4). Ties at one frontier: the lowest id. 0: root."""
    index, cps = cache.index, cache.checkpoints
    toks, n = ident.tokens, len(ident.tokens)
    lim = n - 1 if strict else n
    keys = [(0, b"")] + [(k, d) for k, d in enumerate(ident.blocks, 1)]
    for key in reversed(keys):  # deepest block first: a verified hit there beats shallower ones
        got = index.get(key)
        if not got:
            continue
        best, best_cid = -1, 0
        for cid in got:
            if cid == exclude:
                continue
            d = cps[cid].identity
            m = len(d.tokens)
            if m <= lim and (m > best or (m == best and cid < best_cid)) and d.execution == ident.execution \
                    and d.tokens == toks[:m] and d.position_scheme == ident.position_scheme \
                    and d.media == tuple(x for x in ident.media if x[0] < m):
                best, best_cid = m, cid
        if best_cid:
            return best_cid
    return 0
