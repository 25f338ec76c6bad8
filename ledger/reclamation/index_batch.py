"""One batch of changes to a victim index, taken in: `IndexBatch` starts from a kept `VictimIndex`
and the cache as it is now, and hears what changed — a holder joining or leaving objects (`hold`,
`hold_run`: a point's or a waiter's pages at once), points whose fallback, aliases or owner
changed (`dirty_cid`), records and shared entries that changed (`dirty_owner`, HEAT-4 re-billing)
and the replicas the ledger moved (`sync_replicas`, from the diff of its replica exceptions). It
keeps the per-object counts (groups' members and live counts, held objects, duplicates, Host-only
counts, Device-only counts per demotion candidate) in working copies and marks what must be
re-keyed; index_groups.py and index_rekey.py close it into the next persistent index.
"""
from __future__ import annotations

from ledger import ptrie
from ledger.reclamation.index import DUPLICATES, EMPTY_ORDER, NO_HOLDERS, LazyMap, PoolOrder, VictimIndex
from ledger.reclamation.index_billing import ReuseBilling
from ledger.reclamation.index_keys import owner_status, replica_presence
from ledger.reclamation.index_walk import walk_one, walk_same
from ledger.reclamation.pricing import stored_tier_pricing
from ledger.psorted import PSorted


class IndexBatch:
    """One batch of changes to a VictimIndex; `index_rekey.finish_batch(batch)` returns the new
    (persistent) index. Working copies of the index's maps (`LazyMap`s) and, per key, what moved:

    `group_work`: (pool, holder set) -> [members (set), live, live before]; `order_work`: pool ->
    {order name: PSorted} for the orders changed; `held_delta`: pool -> change of its held count;
    `dirty_groups`: groups to re-key; `dirty_group_points`: groups with a point whose facts changed
    (special status, loss, tier); `dirty_demotions`: demotion candidates whose count moved, `gained`
    those one of whose objects became Device-only (`lead`), `dirty_demotion_keys` those whose key
    may have moved (tier, demand, reach); `dirty_cids`: points whose own loss may have changed;
    `host_dirty`: holder sets whose Host-only count moved."""

    def __init__(self, index: VictimIndex, cache):
        self.index, self.cache = index, cache
        self.memo = index.memo
        self.replica_exceptions = index.replica_exceptions
        self.holder_sets = LazyMap(index.holder_sets)
        self.object_pool = LazyMap(index.object_pool)
        self.demotions = LazyMap(index.demotions)
        self.listers = LazyMap(index.listers)
        self.wide_objects = LazyMap(index.wide_objects)
        self.host_only = LazyMap(index.host_only)
        self.host_dirty: set = set()
        self.aheads: dict = {}  # (cid, pool) -> `ahead_map` of that point, within this batch
        self.group_work: dict = {}
        self.dirty_groups: set = set()
        self.dirty_group_points: set = set()
        self.dirty_demotions: set = set()
        self.gained: set = set()
        self.dirty_demotion_keys: set = set()
        self.dirty_cids: set = set()
        self.order_work: dict = {}
        self.held_delta: dict = {}
        self.pool_index = {p: i for i, p in enumerate(index.pools)}
        self.billing = ReuseBilling(index, self.holder_sets, self.object_pool, self.pool_index)
        self._pricing = None

    @property
    def pricing(self):
        """The stored-tier pricing of the batch's cache, made on first use."""
        if self._pricing is None:
            self._pricing = stored_tier_pricing(self.cache)
        return self._pricing

    # -- orders --
    def order(self, pool: str, name) -> PSorted:
        """The pool's order `name` as this batch has it (a normal-tier bucket: (NORMAL, bucket))."""
        d = self.order_work.get(pool)
        if d is None:
            d = self.order_work[pool] = {}
        o = d.get(name)
        if o is None:
            po: PoolOrder = self.index.orders[pool]
            o = d[name] = po.normal.get(name[1], EMPTY_ORDER) if isinstance(name, tuple) else getattr(po, name)
        return o

    def put_order(self, pool: str, name, o: PSorted) -> None:
        self.order_work[pool][name] = o

    def drop_items(self, pool, items) -> None:
        for name, it in items:
            self.put_order(pool, name, self.order(pool, name).remove(it))

    # -- objects --
    def group(self, pool, hs):
        key = (pool, hs)
        w = self.group_work.get(key)
        if w is None:
            g = self.index.groups.get(key)
            w = self.group_work[key] = [set(g.members), g.live, g.live] if g is not None else [set(), 0, 0]
        return w

    def count_object(self, oid: int, hs, x, pool: str, sign: int, demotable: bool = True) -> None:
        """Object oid with holder set hs and replica exception x joins (+1) or leaves its group."""
        d, h, _ = replica_presence(x)
        if not any(t[0] == "ckpt" for t in hs):
            return  # held by waiters only: not a candidate (RCL-1: checkpoints' objects)
        w = self.group(pool, hs)
        if sign > 0:
            w[0].add(oid)
        else:
            w[0].discard(oid)
        if d == 2 and h != 2:
            w[1] += sign
        if d == 2:
            self.held_delta[pool] = self.held_delta.get(pool, 0) + sign
            if h == 2:
                xo = self.order(pool, DUPLICATES)
                self.put_order(pool, DUPLICATES, xo.add((oid,)) if sign > 0 else xo.remove((oid,)))
        if h == 2 and d != 2:  # Host-only: what deleting its holders frees on Host (HOST-2)
            n = self.host_only.get(hs, 0) + sign
            if n:
                self.host_only[hs] = n
            else:
                del self.host_only[hs]
            self.host_dirty.add(hs)
        if demotable and d and not h:
            for t in hs:
                if t[0] == "ckpt":
                    self.count_demotable(pool, t[1], sign)

    def count_demotable(self, pool: str, cid: int, delta: int) -> None:
        k = (pool, cid)
        cur = self.demotions.get(k)
        self.demotions[k] = ((cur[0] if cur else 0) + delta, cur[1] if cur else None)
        self.dirty_demotions.add(k)
        if delta > 0:
            self.gained.add(k)

    def hold(self, oid: int, holder, sign: int, pool: str | None = None) -> None:
        old = self.holder_sets.get(oid, NO_HOLDERS)
        new = old | {holder} if sign > 0 else old - {holder}
        if new == old:
            return
        self.memo.derive_wide(old, new, holder, sign)
        if pool is None:
            pool = self.object_pool[oid]
        x = self.replica_exceptions.get(oid)
        # One holder joins or leaves: the others' demotion counts stay as they are, so only the
        # changed holder's moves (a page every history shares has thousands of holders).
        if old:
            self.count_object(oid, old, x, pool, -1, demotable=False)
        if new:
            self.count_object(oid, new, x, pool, +1, demotable=False)
        d, h, _ = replica_presence(x)
        if d and not h and holder[0] == "ckpt":
            self.count_demotable(pool, holder[1], sign)
        if new:
            self.holder_sets[oid] = new
            self.object_pool[oid] = pool
        else:
            del self.holder_sets[oid]
            del self.object_pool[oid]
        if holder[0] == "ckpt":
            walk_one(self, oid, holder[1], sign)

    def hold_run(self, oids, holder, sign: int, pools) -> None:
        """`holder` joins (sign > 0) or leaves each of `oids`, as `hold` one by one would. The
        objects that had the same holder set (a context's pages) move between the same two
        groups, so the group, count and walk work is done once per holder set, and the new
        holder set is one object all of them share."""
        if len(set(oids)) != len(oids):  # an object twice: its second change sees the first
            for oid in oids:
                self.hold(oid, holder, sign, pools.get(oid))
            return
        holder_sets, object_pool = self.holder_sets, self.object_pool
        buckets: dict = {}
        for oid in oids:
            old = holder_sets.get(oid, NO_HOLDERS)
            if (holder in old) == (sign > 0):
                continue  # nothing changes (as `hold`)
            pool = pools.get(oid)
            if pool is None:
                pool = object_pool[oid]
            run = buckets.get((old, pool))
            if run is None:
                buckets[(old, pool)] = [oid]
            else:
                run.append(oid)
        for (old, pool), run in buckets.items():
            self._hold_same(run, old, pool, holder, sign)

    def _hold_same(self, run: list, old, pool: str, holder, sign: int) -> None:
        """`hold` for objects of one pool that all had holder set `old`."""
        new = old | {holder} if sign > 0 else old - {holder}
        self.memo.derive_wide(old, new, holder, sign)
        xget = self.replica_exceptions.get
        live = held = host_only = demotable = 0
        dups = []
        for oid in run:  # presence classes, as `count_object` reads them (`replica_presence`)
            x = xget(oid)
            if x is None:
                live += 1
                held += 1
                demotable += 1
                continue
            d, h = x[0], x[1]
            if d == 2:
                held += 1
                if h == 2:
                    dups.append(oid)
                else:
                    live += 1
            elif h == 2:
                host_only += 1
            if d and not h:
                demotable += 1
        listed_old = any(t[0] == "ckpt" for t in old)
        listed_new = any(t[0] == "ckpt" for t in new)
        for hs, s, listed in ((old, -1, listed_old), (new, 1, listed_new)):
            if not listed:
                continue  # held by waiters only: not a candidate (RCL-1)
            w = self.group(pool, hs)
            if s > 0:
                w[0].update(run)
            else:
                w[0].difference_update(run)
            w[1] += s * live
            if host_only:
                n = self.host_only.get(hs, 0) + s * host_only
                if n:
                    self.host_only[hs] = n
                else:
                    del self.host_only[hs]
                self.host_dirty.add(hs)
        if listed_old != listed_new:  # the objects join or leave the listed ones (a listed set stays listed)
            s = 1 if listed_new else -1
            self.held_delta[pool] = self.held_delta.get(pool, 0) + s * held
            if dups:
                xo = self.order(pool, DUPLICATES)
                for oid in dups:
                    xo = xo.add((oid,)) if s > 0 else xo.remove((oid,))
                self.put_order(pool, DUPLICATES, xo)
        if demotable and holder[0] == "ckpt":
            self.count_demotable(pool, holder[1], sign * demotable)
        holder_sets, object_pool = self.holder_sets.mut(), self.object_pool.mut()
        if new:
            for oid in run:
                holder_sets[oid] = new
            if not old:
                for oid in run:
                    object_pool[oid] = pool
        else:
            for oid in run:
                del holder_sets[oid]
                del object_pool[oid]
        if holder[0] == "ckpt":
            walk_same(self, run, old, pool, holder[1], sign)

    def presence(self, oid: int, x0, x1) -> None:
        """The ledger moved oid's replicas (exception x0 -> x1)."""
        hs = self.holder_sets.get(oid)
        if hs is not None:
            pool = self.object_pool[oid]
            self.count_object(oid, hs, x0, pool, -1)
            self.count_object(oid, hs, x1, pool, +1)
            d0, h0, _ = replica_presence(x0)
            d1, h1, _ = replica_presence(x1)
            if bool(d0 and not h0) != bool(d1 and not h1):  # it enters or leaves its listers' reach
                for t in hs:
                    if t[0] == "ckpt" and (pool, t[1]) in self.demotions:
                        self.dirty_demotion_keys.add((pool, t[1]))
        self.billing.move(oid, x0, x1)

    def sync_replicas(self, xrep) -> None:
        """Every object whose replica exception differs between the index and `xrep`."""
        for oid, x0, x1 in ptrie.diff(self.replica_exceptions, xrep):
            self.presence(oid, x0, x1)
        self.replica_exceptions = xrep

    # -- points and owners whose facts changed --
    def dirty_cid(self, cid: int) -> None:
        self.dirty_cids.add(cid)
        vi = self.index
        h = ("ckpt", cid)
        for pool in vi.pools:
            for hs in vi.groups_by_point.get((pool, cid), ()):
                self.dirty_groups.add((pool, hs))
                self.dirty_group_points.add((pool, hs))
            for hs in vi.wide_groups.get(pool, ()):
                if h in hs:
                    self.dirty_groups.add((pool, hs))
                    self.dirty_group_points.add((pool, hs))
            if (pool, cid) in self.demotions:
                self.dirty_demotions.add((pool, cid))
                self.dirty_demotion_keys.add((pool, cid))

    def dirty_owner(self, owner) -> None:
        _, _, points = owner_status(self.cache, owner)
        for p in points:
            self.dirty_cid(p)
        self.billing.rebill(owner, self.cache, self.replica_exceptions)
