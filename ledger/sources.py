"""Source selection (SRC-1..5): which complete point a request binds from.

`query_sources` is read-only (SRC-4): it walks the prefix index along the request's hit path
(SRC-1, including root), verifies every candidate exactly (CKP-4), works out for each the
takeover kind (logical takeover of the record or an independent branch, BIND-1/2), the
physical handover (Move of an exclusive E or Fork, BIND-5), the carried and the approved-retired
points of the record (REC-9, BIND-4), the bytes to move, and ranks them by the cost model
passed in (SRC-2, SRC-3). A request's own Snapshot is redeemed first, with no query (SRC-5).
"""
from __future__ import annotations

from typing import Hashable, NamedTuple

from ledger import prefix_index as px
from ledger.cache_state import CacheState, Checkpoint, CostModel, PointKind, ckpt_holder, wait_holder
from ledger.errors import InvalidRequest
from ledger.identity import InputIdentity
from ledger.state import LedgerState


class Takeover:
    MOVE = "move"  # logical takeover, the source state handed over exclusively (BIND-5)
    TAKEOVER_FORK = "takeover_fork"  # logical takeover, the source state kept (an input point)
    FORK = "fork"  # an independent branch (BIND-2)
    ROOT = "root"
    SNAPSHOT = "snapshot"  # the request's own pause snapshot (SRC-5)


class SourceQuery(NamedTuple):
    request: Hashable
    identity: InputIdentity  # the input up to the largest allowed frontier
    session: Hashable = None  # BIND-7: a lookup hint
    publication_order: int | None = None  # WAIT-3: a re-query never takes over a later record
    snapshot: int | None = None  # the request's own complete Snapshot checkpoint (SRC-5)


class SourceCandidate(NamedTuple):
    cid: int | None  # None: root
    frontier: int
    takeover: str
    rid: int | None  # the record taken over (MOVE / TAKEOVER_FORK)
    carried: tuple  # compatible points of that record kept as they are (REC-9)
    retired: tuple  # its deeper / incompatible points approved for replacement (BIND-4)
    transfer_bytes: int  # H2D bytes of objects with no complete Device replica
    copy_bytes: int  # Device copies: tail page / state fork (BIND-4, BIND-5)
    cost: float  # transfer + remaining prefill (SRC-2)
    private: bool
    session_hint: bool
    publication: int
    seq: int
    blocked: bool  # a needed object is the target of the running transaction (SRC-5: wait)
    missing: tuple  # object ids needing an H2D copy before the bind

    def rank(self) -> tuple:
        """SRC-2: cost, then bytes moved, deeper, session hint, private, newer publication, seq."""
        return (self.cost, self.transfer_bytes + self.copy_bytes, -self.frontier, not self.session_hint,
                not self.private, -self.publication, self.seq)


def _bytes(state: LedgerState, c: Checkpoint, takeover: str) -> tuple[int, int, tuple, bool]:
    """H2D bytes, Device copy bytes, the objects missing on Device, and whether blocked."""
    txn = state.transaction
    busy = {j.object_id for j in txn.jobs} if txn is not None else set()
    h2d, copy, missing, blocked = 0, 0, [], False
    in_place = takeover in (Takeover.MOVE, Takeover.SNAPSHOT)
    for oid in c.object_ids():
        o = state.objects[oid]
        if oid in busy:
            blocked = True
        if o.device is None or not o.device.complete:
            h2d += o.host.nbytes if o.host is not None else state.pool(o.pool).spec.unit_bytes
            if in_place or oid != c.state:
                missing.append(oid)  # a forked StateImage is read from Host by the bind itself (BIND-5)
    so = state.objects[c.state]
    if not in_place and so.device is not None and so.device.complete:
        copy += state.pool(state.objects[c.state].pool).spec.unit_bytes  # BIND-5: state fork
        for pool, pages in c.kv:  # BIND-4: a partial tail page is copied for a writable view
            spec = state.pool(pool).spec
            if pages and c.frontier % spec.page_tokens:
                copy += spec.unit_bytes
    return h2d, copy, tuple(missing), blocked


def exclusive(state: LedgerState, cache: CacheState, c: Checkpoint, request) -> bool:
    """BIND-5: the state can be Moved when nothing but this point (and the request's own
    waiting reference) holds or reads it, and no other waiter references the point (WAIT-1: it
    would stay intact for that waiter, sharing the state with the writer)."""
    o = state.objects[c.state]
    return (not o.leases and not o.pins and o.holders <= {ckpt_holder(c.cid), wait_holder(request)}
            and not any(w.cid == c.cid and w.request != request for w in cache.waiters.values()))


def _record_candidate(state, cache, q, c, rec, cost: CostModel):
    can_take = (rec.active is None  # BIND-2: an inactive record may be taken over
                and q.request not in cache.active  # PAUSE-1: a paused request keeps its own record: Fork
                and (rec.session is None or rec.session == q.session)  # crossing named entries: branch
                and (q.publication_order is None or rec.publication_order <= q.publication_order))  # WAIT-3
    carried, retired = (), ()
    if can_take:
        keep, drop = [], []
        for pid in rec.points():
            if pid == c.cid:
                continue
            p = cache.checkpoints[pid]
            if p.frontier <= c.frontier and p.identity.is_prefix_of(q.identity):
                keep.append(pid)  # REC-9: still exactly compatible, carried as is
            else:
                drop.append(pid)  # BIND-4: deeper or incompatible, approved for replacement
        carried, retired = tuple(keep), tuple(drop)
        if c.kind == PointKind.END and exclusive(state, cache, c, q.request):
            kind = Takeover.MOVE
        else:
            kind = Takeover.TAKEOVER_FORK
    else:
        kind = Takeover.FORK
    return kind, carried, retired


def query_sources(state: LedgerState, cache: CacheState, q: SourceQuery, cost: CostModel = CostModel()) -> tuple:
    """Ranked candidates, best first; the last resort root is always present (SRC-1)."""
    if not isinstance(q, SourceQuery) or not isinstance(q.identity, InputIdentity):
        raise InvalidRequest("query_sources needs a SourceQuery with an InputIdentity")
    n = len(q.identity.tokens)
    if q.snapshot is not None:  # SRC-5: the request's own complete Snapshot first, no ranking
        c = cache.checkpoints.get(q.snapshot)
        if c is not None and c.owner == ("snap", q.request):
            h2d, _, missing, blocked = _bytes(state, c, Takeover.MOVE)
            return (SourceCandidate(c.cid, c.frontier, Takeover.SNAPSHOT, None, (), (), h2d, 0,
                                    h2d * cost.h2d_per_byte, True, False, 0, c.cid, blocked, missing),)
    out, seen = [], {}
    for cid in px.candidates(cache.index, q.identity):
        c = cache.checkpoints[cid]
        if c.frontier > n or not c.identity.is_prefix_of(q.identity):  # CKP-4: verify exactly
            continue
        kind_owner, key = c.owner
        if kind_owner == "rec":
            rec = cache.records[key]
            kind, carried, retired = _record_candidate(state, cache, q, c, rec, cost)
            rid = key if kind != Takeover.FORK else None
            private, hint, pub = True, q.session is not None and rec.session == q.session, rec.publication_order
        else:
            kind, carried, retired, rid = Takeover.FORK, (), (), None
            private, hint, pub = False, False, 0
        h2d, copy, missing, blocked = _bytes(state, c, kind)
        total = h2d * cost.h2d_per_byte + copy * cost.d2d_per_byte + (n - c.frontier) * cost.prefill_per_token
        cand = SourceCandidate(cid, c.frontier, kind, rid, carried, retired, h2d, copy, total, private, hint, pub,
                               cid, blocked, missing)
        dup = (c.state, kind, carried)  # SRC-2: same handle, same takeover, same carried points
        prev = seen.get(dup)
        if prev is not None and prev.rank() <= cand.rank():
            continue
        seen[dup] = cand
    out = list(seen.values())
    w = cache.waiters.get(q.request)
    c = cache.checkpoints.get(w.cid) if w is not None else None
    if c is not None and c.owner[0] == "wait" and c.frontier <= n and c.identity.is_prefix_of(q.identity):
        # WAIT-3: the old point this waiter alone keeps (its directory was replaced): an
        # independent branch; exclusively held, its state may still be Moved.
        kind = Takeover.MOVE if exclusive(state, cache, c, q.request) else Takeover.FORK
        h2d, copy, missing, blocked = _bytes(state, c, kind)
        total = h2d * cost.h2d_per_byte + copy * cost.d2d_per_byte + (n - c.frontier) * cost.prefill_per_token
        out.append(SourceCandidate(c.cid, c.frontier, kind, None, (), (), h2d, copy, total, True, False, 0, c.cid,
                                   blocked, missing))
    out.append(SourceCandidate(None, 0, Takeover.ROOT, None, (), (), 0, 0, n * cost.prefill_per_token, False, False,
                               0, 0, False, ()))
    out.sort(key=SourceCandidate.rank)
    return tuple(out)


def select_source(state: LedgerState, cache: CacheState, q: SourceQuery, cost: CostModel = CostModel()):
    """The best candidate (SRC-2)."""
    return query_sources(state, cache, q, cost)[0]
