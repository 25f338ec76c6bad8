"""HEAT-4 billing kept by one batch of index changes: the reuse segment bills each object once, to
the newest reuse-tier owner holding it, and keeps each owner's footprint vector (units per Device
pool, Host bytes). `ReuseBilling` overlays the kept `ReuseSegment` with the owners a batch
re-bills (a record or shared entry that changed tier, demand or points) and the replicas it
moves, and `finish` returns the new segment.
"""
from __future__ import annotations

from ledger.reclamation.index import NO_HOLDERS, LazyMap, ReuseSegment, VictimIndex
from ledger.reclamation.index_keys import add_presence, footprint_objects, owner_status


class ReuseBilling:
    """The segment's working copy for one batch. `owner_order`: owner -> (-demand, owner), or
    None once it left the segment; `owner_vectors`: owner -> its footprint vector (a list, being
    changed); `owner_footprints`: owner -> frozenset of its objects; `billed`: oid -> (owner, pool)."""

    def __init__(self, index: VictimIndex, holder_sets: LazyMap, object_pool: LazyMap, pool_index: dict):
        self.index = index
        self.holder_sets, self.object_pool, self.pool_index = holder_sets, object_pool, pool_index
        self.owner_order: dict = {}
        self.owner_vectors: dict = {}
        self.owner_footprints: dict = {}
        self.billed = LazyMap(index.segment.billed)

    def order_of(self, owner):
        """The owner's place in the segment, (-demand, owner), or None when it is not in it."""
        if owner in self.owner_order:
            return self.owner_order[owner]
        it = self.index.segment.owners.get(owner)
        return None if it is None else it[:2]

    def footprint(self, owner):
        if owner in self.owner_footprints:
            return self.owner_footprints[owner]
        return self.index.segment.footprints.get(owner, NO_HOLDERS)

    def vector(self, owner) -> list:
        v = self.owner_vectors.get(owner)
        if v is None:
            it = self.index.segment.owners.get(owner)
            v = self.owner_vectors[owner] = list(it[2]) if it is not None else [0] * (len(self.index.pools) + 1)
            if owner not in self.owner_order:
                self.owner_order[owner] = None if it is None else it[:2]
        return v

    def best_owner(self, oid: int, cache):
        """The newest reuse-tier owner whose footprint has oid (recounted)."""
        cps = cache.checkpoints
        best, best_order = None, None
        for h in self.holder_sets.get(oid, ()):
            if h[0] != "ckpt":
                continue
            c = cps.get(h[1])
            if c is None:
                continue
            o = c.owner
            s = self.order_of(o)
            if s is not None and (best_order is None or s < best_order) and oid in self.footprint(o):
                best, best_order = o, s
        return best

    def rebill(self, owner, cache, xrep) -> None:
        """A record or shared entry changed: its place in the segment, its footprint, and the
        objects billed to it or now billed to it (each to the newest owner holding it)."""
        if owner[0] not in ("rec", "shared"):
            return
        reuse, demand, points = owner_status(cache, owner)
        old_order, old_fp = self.order_of(owner), self.footprint(owner)
        new_order = (-demand, owner) if reuse else None
        new_fp = footprint_objects(cache, points) if reuse else NO_HOLDERS
        if old_order is None and new_order is None:
            return
        self.vector(owner)
        self.owner_order[owner] = new_order
        self.owner_footprints[owner] = new_fp
        newer = old_order is not None and new_order is not None and new_order <= old_order
        billed = self.billed
        for oid in old_fp | new_fp:
            cur = billed.get(oid)
            cur_owner = cur[0] if cur is not None else None
            if cur_owner is not None and cur_owner != owner:
                to = owner if (new_order is not None and oid in new_fp and new_order < self.order_of(cur_owner)) \
                    else cur_owner
            elif cur_owner == owner and newer and oid in new_fp:
                to = owner
            elif cur_owner is None and new_order is not None and oid in new_fp:
                to = owner  # billed to nobody: no other reuse-tier owner holds it
            else:
                to = self.best_owner(oid, cache)
            if to == cur_owner:
                continue
            pool = cur[1] if cur is not None else self.object_pool.get(oid)
            x = xrep.get(oid)
            if cur_owner is not None:
                v = self.vector(cur_owner)
                neg = [0] * len(v)
                add_presence(neg, self.pool_index, pool, x)
                for k in range(len(v)):
                    v[k] -= neg[k]
            if to is None:
                del billed[oid]
            else:
                add_presence(self.vector(to), self.pool_index, pool, x)
                billed[oid] = (to, pool)

    def move(self, oid: int, x0, x1) -> None:
        """An object's replicas moved (x0 -> x1): its owner's footprint vector follows."""
        b = self.billed.get(oid)
        if b is None:
            return
        vec = self.vector(b[0])
        neg = [0] * len(vec)
        add_presence(neg, self.pool_index, b[1], x0)
        pos = [0] * len(vec)
        add_presence(pos, self.pool_index, b[1], x1)
        for k in range(len(vec)):
            vec[k] += pos[k] - neg[k]

    def finish(self) -> ReuseSegment:
        segment = self.index.segment
        if not (self.owner_vectors or self.owner_order):
            return segment._replace(billed=self.billed.finish())
        owners = segment.owners.mutate()
        footprints = segment.footprints.mutate()
        removed, added = [], []
        for o in set(self.owner_vectors) | set(self.owner_order):
            old = segment.owners.get(o)
            order = self.order_of(o)
            vec = tuple(self.owner_vectors[o]) if o in self.owner_vectors else (old[2] if old else ())
            new = None if order is None else order + (vec,)
            if new == old:
                continue
            if old is not None:
                removed.append(old)
            if new is not None:
                added.append(new)
                owners[o] = new
            elif o in owners:
                del owners[o]
        for o, f in self.owner_footprints.items():
            if f:
                footprints[o] = f
            elif o in footprints:
                del footprints[o]
        return ReuseSegment(owners.finish(), segment.newest_first.update(removed, added), footprints.finish(),
                            self.billed.finish())
