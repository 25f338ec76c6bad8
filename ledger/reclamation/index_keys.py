"""The victim index's keys, read from the cache's own facts: which holder sets are special
(WAIT-2, PAUSE-4, SCH-4), the item a group files in its pool order (RCL-3/4/5, RD-8: tier, loss,
demand, frees; a bound for more than BIG points), its Host-order item (HOST-2), a demotion
candidate's key and reach (RCL-6), the replica classes a change moves between, the HEAT-4
footprint of an owner, the demotion order of a point's pages (`pages_of`) and the pages it leads
with that cannot move (`lead`). Shared by the from-scratch build and the incremental batch.
"""
from __future__ import annotations

from itertools import chain, islice

from ledger.cache_state import PointKind, Tier
from ledger.reclamation.index import (BIG, DEMOTE_NORMAL, DEMOTE_REUSE, INF, NO_HOLDERS, NORMAL, REUSE, WIDE,
                                      IndexMemo, VictimIndex)
from ledger.reclamation.pricing import LossPricing
from ledger.state import KV_PAGES


def replica_presence(x):
    """(device, host, Host bytes) from a replica exception (None: one complete Device replica)."""
    return (2, 0, 0) if x is None else x


def device_only(x) -> bool:
    """A replica exception (or None) of an object a demotion may move: a Device replica, no
    Host one (RCL-6)."""
    return x is None or (x[0] and not x[1])


def add_presence(vec: list, pool_index: dict, pool: str, x) -> None:
    """Add one object's footprint (a Device unit of its pool, its Host bytes) to a vector."""
    d, h, hb = replica_presence(x)
    if d:
        vec[pool_index[pool]] += 1
    if h:
        vec[-1] += hb


def special_holder(cache, h) -> bool:
    """A waiter, a pause snapshot or a point kept only by a waiter (WAIT-2, PAUSE-4, SCH-4)."""
    if h[0] == "wait":
        return True
    if h[0] == "ckpt":
        c = cache.checkpoints.get(h[1])
        return c is None or c.kind == PointKind.SNAPSHOT or c.owner[0] == "wait"
    return False


def is_special(cache, hs) -> bool:
    return any(special_holder(cache, h) for h in hs)


def single_loss(cache, pricing: LossPricing, cid: int):
    """RCL-5: a point's loss deleted alone (None for a point the cache no longer has)."""
    return pricing.loss(frozenset((cid,))) if cid in cache.checkpoints else None


def owner_status(cache, owner):
    """(reuse tier?, demand time, points) of a record or shared entry (HEAT-4)."""
    kind, key = owner
    if kind == "rec":
        r = cache.records.get(key)
        if r is None:
            return False, 0, ()
        return r.tier == Tier.REUSE, r.demand_time, r.points()
    e = cache.shared.get(key)
    if e is None:
        return False, 0, ()
    return e.tier == Tier.REUSE, e.demand_time, (e.point,)


def footprint_objects(cache, points) -> frozenset:
    """HEAT-4: every object of these points."""
    cps = cache.checkpoints
    out = set()
    for p in points:
        c = cps.get(p)
        if c is not None:
            out.update(c.object_ids())
    return frozenset(out)


def hot_demand(cache, pricing: LossPricing, cids) -> tuple[frozenset, int]:
    """RCL-3: the owners protecting these points as hot content, and their latest demand."""
    gone = frozenset(cids)
    cps = cache.checkpoints
    hot, demand = set(), 0
    for cid in cids:
        c = cps[cid]
        h, t = pricing.hot(c, gone)
        if h:
            hot.add(c.owner)
        if t > demand:
            demand = t
    return frozenset(hot), demand


def point_facts(cache, pricing: LossPricing, memo: IndexMemo, hs, point_loss, batch_facts=None) -> tuple:
    """(hot owners, demand, loss) of deleting an ordinary holder set of up to BIG points
    (RCL-3, RCL-5), shared by its pool orders and the Host order (`batch_facts`: within one batch)."""
    if batch_facts is not None:
        got = batch_facts.get(hs)
        if got is not None:
            return got
    cids = memo.point_ids(hs)
    hot, demand = hot_demand(cache, pricing, cids)
    loss = point_loss[cids[0]] if point_loss is not None and len(cids) == 1 and point_loss.get(cids[0]) is not None \
        else pricing.loss(frozenset(cids))
    got = (hot, demand, loss)
    if batch_facts is not None:
        batch_facts[hs] = got
    return got


def group_key(cache, pricing: LossPricing, memo: IndexMemo, hs, live: int, frees: int, point_loss=None,
              batch_facts=None) -> tuple[tuple, frozenset]:
    """The items an ordinary group keeps in its pool order, and its hot owners (RCL-3/4/5).

    A group of more than BIG points (a page many histories share) keeps a lower bound only,
    cheap to keep: normal tier, no demand, the sum of its points' own losses (RCL-5: nested
    points of one history lose disjoint intervals, other histories add theirs), frees capped by
    the gap; its exact key is computed when a quote reaches it."""
    if not live:
        return (), NO_HOLDERS
    cids = memo.point_ids(hs)
    if len(cids) > BIG:
        return (((NORMAL, WIDE), (sum(point_loss[c] for c in cids), 0, cids, INF)),), NO_HOLDERS
    hot, demand, loss = point_facts(cache, pricing, memo, hs, point_loss, batch_facts)
    if hot:
        return ((REUSE, (demand, cids, loss)),), hot
    return (((NORMAL, min(frees, WIDE)), (loss, demand, cids, frees)),), NO_HOLDERS


def host_key(cache, pricing: LossPricing, memo: IndexMemo, hs, point_loss) -> tuple:
    """The Host order item of an ordinary holder set, its hot owners and whether a point of it
    has a reuse-tier owner. The item is a lower bound of the HOST-2 rank of its deletion: the
    stored tier (no owner beyond the soft target; NORMAL for more than BIG points), the sum of
    its points' own losses (RCL-5: nested points of one history lose disjoint intervals, other
    histories add theirs; exact for one point), the demand; a quote divides the loss by the
    useful amount's cap and evaluates the entry exactly when it reaches it."""
    cids = memo.point_ids(hs)
    cps = cache.checkpoints
    reuse = any(owner_status(cache, cps[c].owner)[0] for c in cids)
    loss = sum(point_loss.get(c) or 0 for c in cids)
    if len(cids) > BIG:
        return (Tier.NORMAL, loss, 0, cids), NO_HOLDERS, reuse
    hot, demand = hot_demand(cache, pricing, cids)
    return (Tier.REUSE if hot else Tier.NORMAL, loss, demand, cids), hot, reuse


def demotion_key(cache, pricing: LossPricing, cid: int, reaches: tuple) -> tuple:
    """A demotion candidate's (order name, item): by its owner's tier and demand (RCL-6)."""
    c = cache.checkpoints.get(cid)
    if c is None:
        return None
    h, t = pricing.hot(c, NO_HOLDERS)
    return (DEMOTE_REUSE if h else DEMOTE_NORMAL, (t, cid) + reaches)


def reach(cid: int, objs, listers, xrep) -> tuple:
    """RCL-6: (reach, wide reach): the demotion group of point `cid` (objects `objs` in one pool)
    can take something only for gaps up to one of these. Only Device-only objects can move. An
    object another point lists first in walk order, with fewer objects ahead of it there than
    the gap, goes to that point's group (or, when it may not move, to none); an object `cid`
    lists first or alone may be its own at any gap (INF). Objects listed by more than BIG points
    (a page every history shares) count in the wide reach: a quote reads it only when such an
    object may move for its applicant, so a shared page its applicant protects does not make
    every point that lists it a candidate."""
    r, wr = -1, -1
    xget = xrep.get
    for oid in objs:
        # the replica is read only where the object could change the answer (a point's pages
        # that went to Host are many; the walk entry decides most without it)
        w = listers.get(oid)
        if w is None or w[0][1] == cid:
            if device_only(xget(oid)):
                return INF, -1
            continue  # a Host replica exists or no Device one: not demotable
        a = w[0][2]
        if len(w) > BIG:
            if a > wr and device_only(xget(oid)):
                wr = a
        elif a > r and device_only(xget(oid)):
            r = a
    return r, wr


def pool_objects(c, pool: str, object_pool):
    """Point c's objects in `pool`: its KV pages there (as `pages_of` lists them), or its
    StateImage."""
    segs = [pages for p, pages in c.kv if p == pool]
    if segs:
        return segs[0] if len(segs) == 1 else [o for pages in segs for o in pages]
    return (c.state,) if object_pool.get(c.state) == pool else ()


def ahead_map(c, pool: str) -> dict:
    """oid -> how many of c's objects come before it in c's demotion order in that pool (RCL-6:
    the StateImage alone; KV pages deepest first)."""
    out = {c.state: 0}
    for p, pages in c.kv:
        if p == pool:
            n = len(pages)
            for i, oid in enumerate(pages):
                out[oid] = n - 1 - i
    return out


def pages_of(c, pool: str, kind: str, skip: int = 0):
    """The objects of checkpoint c in a pool, in the order a demotion takes them (RCL-6), read
    lazily: a demotion group stops once it holds the gap. `skip`: start after that many."""
    if kind != KV_PAGES:
        return (c.state,)
    if not skip:
        return chain.from_iterable(reversed(pages) for p, pages in c.kv if p == pool)
    return islice(chain.from_iterable(reversed(pages) for p, pages in c.kv if p == pool), skip, None)


def lead(vi: VictimIndex, c, pool: str) -> int:
    """How many of point c's KV pages in `pool`, in demotion walk order (`pages_of`), come
    before its first Device-only one. None of them can join a demotion group (RCL-6: only
    objects with a Device replica and no Host one move), and they are the walk's head whenever
    an earlier demotion moved the point's tail to Host, so a group's walk starts after them.

    Kept in `vi.memo.leads` (one table all versions of an index share) as (`demotions` entry, the
    point's pages, lead, exact?), and read only while both are the very same objects: every change
    of one of the point's objects into or out of Device-only rewrites that entry (the batch's
    demotion counts, re-keyed at its close), so versions sharing it agree on the point's
    Device-only pages, and a point's pages are one tuple for its life (`Checkpoint.kv`). A change
    that only took Device-only objects away carries the lead to the new entry as a lower bound
    (`index_rekey.carry_leads`): the walk goes on from there, past the pages just demoted."""
    key = (pool, c.cid)
    d = vi.demotions.get(key)
    if d is None or vi.memo is None:
        return 0
    leads = vi.memo.leads
    got = kept_lead(vi, key, c)
    if got is not None and got[1]:
        return got[0]
    n = past_moved(c, pool, vi.replica_exceptions, got[0] if got else 0)
    if len(leads) > 2 * len(vi.demotions) + 4096:  # points deleted since: drop what they left behind
        live = vi.demotions
        for k in [k for k in leads if k not in live]:
            del leads[k]
    leads[key] = (d, c.kv, n, True)
    return n


def kept_lead(vi: VictimIndex, key, c):
    """(lead, exact?) kept for point c on index version `vi`, else None."""
    got = vi.memo.leads.get(key) if vi.memo is not None else None
    if got is None or got[0] is not vi.demotions.get(key) or got[1] is not c.kv:
        return None
    return got[2], got[3]


def past_moved(c, pool: str, xrep, n: int) -> int:
    """`n` (pages known not to move) plus the pages after them, in walk order, before point c's
    first Device-only one."""
    xget = xrep.get
    for oid in pages_of(c, pool, KV_PAGES, n):
        if device_only(xget(oid)):
            break
        n += 1
    return n
