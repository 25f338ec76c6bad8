"""The demotion walk of shared objects, kept by a batch of index changes (RCL-6): for every object
two or more points list, its listing points in `walk_key` order with how many of each point's
objects come before it there (`VictimIndex.listers`), and the objects listed by more than BIG
points (`wide_objects`). When a point joins or leaves an object's listing and the first lister
changes, the listers' demotion reach moves: their candidates are marked for re-keying. Each
function reads and writes the working maps of an `index_batch.IndexBatch` it is given.
"""
from __future__ import annotations

from bisect import bisect_left

from ledger.reclamation.index import BIG, walk_key
from ledger.reclamation.index_keys import ahead_map


def objects_ahead(batch, cid: int, oid: int, pool: str) -> int:
    """How many of point cid's objects come before oid in its demotion order in that pool."""
    m = batch.aheads.get((cid, pool))
    if m is None:
        m = batch.aheads[(cid, pool)] = ahead_map(batch.cache.checkpoints[cid], pool)
    return m[oid]


def first_moved(batch, oid: int, cids) -> None:
    """The first point listing a shared object changed: its listers' reach (RCL-6) moves."""
    pool = batch.object_pool.get(oid)
    demotions, dirty, dirty_keys = batch.demotions, batch.dirty_demotions, batch.dirty_demotion_keys
    if pool is None:
        for c in cids:
            for p in batch.index.pools:
                if (p, c) in demotions:
                    dirty.add((p, c))
                    dirty_keys.add((p, c))
        return
    for c in cids:
        if (pool, c) in demotions:
            dirty.add((pool, c))
            dirty_keys.add((pool, c))


def walk_one(batch, oid: int, cid: int, sign: int) -> None:
    """Keep the listing points of a shared object in demotion walk order (RCL-6): a tuple of
    (walk key, cid, objects ahead of it in that point's demotion order), kept for objects
    with two or more."""
    cur = batch.listers.get(oid)
    if cur is None:  # fewer than two before this change: count them after it
        cids = [h[1] for h in batch.holder_sets.get(oid, ()) if h[0] == "ckpt"]
        if len(cids) >= 2:  # one point became two: the first of them may not be the old one
            pool = batch.object_pool[oid]
            batch.listers[oid] = tuple(sorted((walk_key(c), c, objects_ahead(batch, c, oid, pool)) for c in cids))
            first_moved(batch, oid, cids)
        return
    k = (walk_key(cid), cid)
    i = bisect_left(cur, k)
    here = i < len(cur) and cur[i][:2] == k
    if sign > 0:
        new = cur if here else cur[:i] + (k + (objects_ahead(batch, cid, oid, batch.object_pool[oid]),),) + cur[i:]
    else:
        new = cur[:i] + cur[i + 1:] if here else cur
    if len(new) >= 2:
        batch.listers[oid] = new
    else:
        del batch.listers[oid]
    if (len(new) > BIG) != (len(cur) > BIG):  # its listers count it in the other reach now
        if len(new) > BIG:
            batch.wide_objects[oid] = batch.object_pool[oid]
        else:
            del batch.wide_objects[oid]
        first_moved(batch, oid, [e[1] for e in cur] + [cid])
    elif not new or len(new) < 2 or new[0] != cur[0]:
        first_moved(batch, oid, [e[1] for e in cur] + [cid])


def walk_same(batch, run: list, old, pool: str, cid: int, sign: int) -> None:
    """`walk_one` for objects that all had holder set `old`: they have the same listing points,
    so the new point's place in their walk order and what it moves are found once."""
    was = batch.memo.point_ids(old)
    n = len(was)
    listers = batch.listers
    if n < 2:  # no walk entry yet: one appears when a second point lists them
        if sign < 0 or n < 1:
            return
        keys = sorted((walk_key(c), c) for c in was + (cid,))
        for oid in run:
            listers[oid] = tuple(k + (objects_ahead(batch, k[1], oid, pool),) for k in keys)
        first_moved(batch, run[0], list(was) + [cid])
        return
    k = (walk_key(cid), cid)
    i = bisect_left(sorted((walk_key(c), c) for c in was), k)
    m = n + 1 if sign > 0 else n - 1
    listers = listers.mut()
    for oid in run:
        cur = listers.get(oid)
        if cur is None or len(cur) != n:  # not the listing `old` names: one by one
            walk_one(batch, oid, cid, sign)
            continue
        if sign > 0:
            new = cur[:i] + (k + (objects_ahead(batch, cid, oid, pool),),) + cur[i:]
        else:
            new = cur[:i] + cur[i + 1:]
        if m >= 2:
            listers[oid] = new
        else:
            del listers[oid]
        if (m > BIG) != (n > BIG):
            if m > BIG:
                batch.wide_objects[oid] = pool
            else:
                del batch.wide_objects[oid]
    if (m > BIG) != (n > BIG) or m < 2 or i == 0:  # the first listing point moved
        first_moved(batch, run[0], list(was) + [cid])
