"""The victim order (RCL-4, RD-8) and the reuse segment's footprint (HEAT-4), kept incrementally.

A reclamation quote used to walk every checkpoint, build an action per object group, sort all
of them and stop after a few picks. `VictimIndex` (the `victims` field of `CacheState`) keeps
what that walk found, from the cache's own facts, so a quote takes its k actions in
O(k log n) (ledger/reclaim.py, `quote`); `quote_reference` keeps the full enumeration.

What is stored, per Device pool (all persistent: every version of the cache keeps its own):

* **Groups**: the objects of the pool grouped by their set of cache holders (`("ckpt", cid)`
  and `("wait", request)`), as RCL-1 groups them: one deletion action per holder set. A group
  counts its `live` members (a complete Device replica and no complete Host one, by the ledger's
  replica exceptions this index reflects) and `frees`, the live members of every group whose
  holder set lies within its own (what deleting all its holders frees). *Ordinary* groups (only
  indexed points: records' and shared entries') are ranked; groups with a waiter, a pause
  snapshot or a point kept only by a waiter depend on the applicant (WAIT-2, PAUSE-4, SCH-4)
  and are few: they are listed (`special`) and ranked by the quote itself.
* **The order** of ordinary groups with live members, by the RCL-4/RD-8 key parts that do not
  depend on the gap: normal-tier groups in buckets by the units they free (`n`: 1..64, and
  `WIDE` beyond), each bucket by loss — for a gap g the useful amount of bucket f is min(f, g)
  (RD-8), one divisor per bucket, so each bucket is already in ratio order and a quote merges
  the buckets — and reuse-tier groups in `r` by demand time. Their tier is the RCL-3
  protection with no owner beyond the soft target; a quote ranks the groups of owners beyond it
  (HEAT-4) as normal content itself. A group of more than `BIG` points (a page many histories
  share) keeps a bound only (the sum of its points' own losses, `sl`; frees capped by the
  gap): cheap to keep, and the quote computes its exact key if it ever reaches it.
* **Demotion candidates** (`dn`/`dr`, RCL-6): checkpoints with Device-only content in the
  pool, by demand time, each with its `reach` (below that gap its objects surely go to the
  groups of points listing them first in walk order, `walk`: such candidates are skipped);
  **duplicate replicas** (`x`, HOST-1/RCL-6): listed objects whose Device
  and Host replicas are both complete; `held`: listed objects with a complete Device replica
  (no quote can free more).
* **The Host order** (HOST-1/2, all pools): `hlive` counts per holder set the listed objects
  whose only complete replica is on Host; `hord` ranks the ordinary sets with any by (stored
  tier, the sum of their points' own losses, demand), a lower bound of the HOST-2 rank;
  `hitems` keeps each set's item and hot owners, `hreuse` the sets with a reuse-tier owner.
* **The reuse segment** (`heat`): the reuse-tier owners newest real demand first, each object
  billed once to the newest owner holding it, each owner's billed footprint per pool and Host
  bytes, with per-chunk sums, so the first owner past 3/4 of a pool is found without a walk.

What re-keys on which change (`_Work`): a point added or dropped changes the holder sets of its
objects (their groups move, the groups' and their supersets' `frees` move), and re-keys the
groups of the points whose fallback moved (`Edit._link`/`_unlink` name them) and of its
aliases (RCL-5 loss); a record or shared entry that changes re-keys the groups and demotion
candidates of its points (RCL-3 tier, demand time) and re-bills its footprint (HEAT-4); a
replica that moves between Device and Host (`LedgerState.xrep`, diffed by `sync`) changes the
live counts, duplicates, demotion candidates and footprint of that object only.

What is checked only when a quote takes an entry (lazily): leases, pins, active writers (`seq`
holders), the applicant's protected objects, holders the cache does not know, and the waiters
and snapshots of special groups. An entry whose objects are so protected yields less (its true
key is then larger than the stored one, never smaller) or nothing, and is skipped.

`build(state, cache)` computes all of it from first principles; `check_cache` compares.
"""
from __future__ import annotations

from bisect import bisect_left
from itertools import chain, islice
from typing import NamedTuple

import immutables

from ledger import ptrie
from ledger.cache_state import SOFT_TARGET, PointKind, Tier
from ledger.psorted import PSorted, from_sorted
from ledger.state import HOST, KV_PAGES

BIG = 8  # groups of more points are ranked by a bound (their points' own losses), exact at quote time
INF = 1 << 62  # a large group's frees bound: the gap always caps its useful amount
_EMPTY = immutables.Map()
_NONE = frozenset()
_EMPTY_SORTED = PSorted()


class _Agg:
    """A per-chunk summary of PSorted items: `of(chunk)`, and `add(summary, item)` for an item
    joining the chunk (no recount)."""

    __slots__ = ("of", "add", "__name__")

    def __init__(self, of, add, name):
        self.of, self.add, self.__name__ = of, add, name

    def __call__(self, chunk):
        return self.of(chunk)


def _seg_of(chunk):
    n = len(chunk[0][2])
    return tuple(sum(it[2][k] for it in chunk) for k in range(n))


_agg_r = _Agg(lambda c: min(it[2] for it in c), lambda a, it: a if a <= it[2] else it[2], "least loss")
_agg_d = _Agg(lambda c: (max(it[2] for it in c), max(it[3] for it in c)),
              lambda a, it: (a[0] if a[0] >= it[2] else it[2], a[1] if a[1] >= it[3] else it[3]), "farthest reaches")
_agg_seg = _Agg(_seg_of, lambda a, it: tuple(x + y for x, y in zip(a, it[2])), "footprint sums")


class Group(NamedTuple):
    members: frozenset  # object ids of the pool held by exactly this holder set
    live: int  # members with a complete Device replica and no complete Host one
    frees: int  # live members of every group within this holder set (ordinary groups)
    items: tuple  # ((order name, item), ...) this group keeps in the pool order
    hot: frozenset  # RCL-3: owners that protect it as hot content (none beyond the target)
    special: bool  # a waiter, a pause snapshot or a waiter's own point holds it


WIDE = 65  # frees buckets 1..64 exact; larger groups (and groups of more than BIG points) share one


class PoolOrder(NamedTuple):
    n: immutables.Map  # normal tier, by frees: bucket (1..64, WIDE) -> (loss, demand, cids, frees)
    r: PSorted  # reuse: (demand, cids, loss)
    dn: PSorted  # demotion candidates, normal: (demand, cid, reach, wide reach)
    dr: PSorted  # demotion candidates, reuse: (demand, cid, reach, wide reach)
    x: PSorted  # duplicate replicas: (oid,)
    held: int  # listed objects with a complete Device replica


class Heat(NamedTuple):
    owners: immutables.Map  # reuse-tier owner -> its segment item (-demand, owner, footprint vector)
    seg: PSorted  # the segment, newest real demand first
    fp: immutables.Map  # owner -> frozenset of its objects
    billed: immutables.Map  # oid -> (owner billed, pool)


class VictimIndex(NamedTuple):
    pools: tuple  # Device pool ids (config order); footprint vectors: pools + Host
    xrep: ptrie.Trie  # the ledger's replica exceptions this index reflects
    oh: immutables.Map  # oid -> frozenset of cache holders
    opool: immutables.Map  # oid -> its pool
    groups: immutables.Map  # (pool, holder set) -> Group
    gidx: immutables.Map  # (pool, cid) -> frozenset of the holder sets with that point (groups up to BIG)
    big: immutables.Map  # pool -> frozenset of the holder sets of more than BIG points
    special: immutables.Map  # pool -> frozenset of special holder sets
    orders: immutables.Map  # pool -> PoolOrder
    dem: immutables.Map  # (pool, cid) -> (count of Device-only objects, (order name, item) | None)
    sl: immutables.Map  # cid -> its loss deleted alone (RCL-5): large groups' loss bound
    walk: immutables.Map  # oid -> the points listing it in demotion walk order (when two or more)
    heat: Heat
    # Host gaps (HOST-1/2): ordinary holder sets with Host-only listed objects (any pool)
    hlive: immutables.Map = _EMPTY  # holder set -> its listed objects with a complete Host replica only
    hitems: immutables.Map = _EMPTY  # holder set -> (order item, hot owners, has a reuse-tier owner)
    hord: PSorted = _EMPTY_SORTED  # (stored tier, loss, demand, cids): a bound of the Host rank
    hreuse: immutables.Map = _EMPTY  # holder sets with a reuse-tier owner (a quote's HEAT-4 read)
    pending: tuple = ()  # cache changes not yet applied: (holders, cids, owners, pools) batches (`sync`)
    wide: immutables.Map = _EMPTY  # oid -> pool: shared objects listed by more than BIG points
    leads: dict | None = None  # (pool, cid) -> (dem entry, point's kv, lead, exact?): `lead`'s cache, shared by versions


def _empty_order() -> PoolOrder:
    return PoolOrder(_EMPTY, PSorted(_agg_r), PSorted(_agg_d), PSorted(_agg_d), PSorted(), 0)


def empty(state) -> VictimIndex:
    pools = tuple(p.pool_id for p in state.config.pools)
    orders = immutables.Map({p: _empty_order() for p in pools})
    return VictimIndex(pools, state.xrep, _EMPTY, _EMPTY, _EMPTY, _EMPTY, _EMPTY, _EMPTY, orders, _EMPTY,
                       _EMPTY, _EMPTY, Heat(_EMPTY, PSorted(_agg_seg), _EMPTY, _EMPTY), leads={})


def walk_key(cid: int) -> int:
    """The order demotions walk checkpoints in (RCL-6): a page several points hold joins the
    group of the first that still has room. It is creation order, oldest point first: relative,
    so a cache cleared and filled again walks exactly as a fresh one does (a schedule does not
    depend on how many ids came before)."""
    return cid


# -- facts shared by the incremental and the from-scratch paths ---------------------------
def _pres(x):
    """(device, host, Host bytes) from a replica exception (None: one complete Device replica)."""
    return (2, 0, 0) if x is None else x


_FACTS = []  # reclaim._Facts, looked up once (reclaim imports this module)


def _facts(cache):
    if not _FACTS:
        from ledger.reclaim import _Facts

        _FACTS.append(_Facts)
    f = _FACTS[0](None, cache)
    f._cold = frozenset()  # the stored tier: no owner beyond the soft target (HEAT-4 is the quote's)
    return f


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


def single_loss(cache, facts, cid: int):
    return facts.loss(frozenset((cid,))) if cid in cache.checkpoints else None


def _cids(hs) -> tuple:
    if len(hs) > BIG:
        return _wide_facts(hs)[1]
    return tuple(sorted(h[1] for h in hs if h[0] == "ckpt"))


# Facts of holder sets wider than BIG (a page every history shares: thousands of holders), so
# that a change adding or removing one holder costs no walk over the others. Each entry is
# (points, sorted cids, parent set, holder, sign): derived from the set it was made from by one
# holder (`derive_wide`), or counted once. Bounded: cleared when it grows past _WIDE_MEMO_MAX.
_WIDE_MEMO: dict = {}
_WIDE_MEMO_MAX = 4096


def _wide_facts(hs) -> tuple:
    got = _WIDE_MEMO.get(hs)
    if got is None:
        cids = tuple(sorted(h[1] for h in hs if h[0] == "ckpt"))
        got = _remember(hs, (len(cids), cids, None, None, 0))
    return got


def _remember(hs, facts: tuple) -> tuple:
    if len(_WIDE_MEMO) >= _WIDE_MEMO_MAX:
        _WIDE_MEMO.clear()
    _WIDE_MEMO[hs] = facts
    return facts


def derive_wide(old, new, holder, sign: int) -> None:
    """`new` is `old` with `holder` added (sign > 0) or removed: its points from old's."""
    if len(old) <= BIG or len(new) <= BIG or new in _WIDE_MEMO:
        return
    n, cids = _wide_facts(old)[:2]
    if holder[0] == "ckpt":
        i = bisect_left(cids, holder[1])
        if sign > 0:
            n, cids = n + 1, cids[:i] + (holder[1],) + cids[i:]
        else:
            n, cids = n - 1, cids[:i] + cids[i + 1:]
    _remember(new, (n, cids, old, holder, sign))


def wide_parent(hs):
    """(parent set, holder, sign) if `hs` was derived from a set by one holder, else None."""
    got = _WIDE_MEMO.get(hs)
    return got[2:] if got is not None and got[2] is not None else None


def _hot_demand(cache, facts, cids) -> tuple[frozenset, int]:
    """RCL-3: the owners protecting these points as hot content, and their latest demand."""
    gone = frozenset(cids)
    cps = cache.checkpoints
    hot, demand = set(), 0
    for cid in cids:
        c = cps[cid]
        h, t = facts.hot(c, gone)
        if h:
            hot.add(c.owner)
        if t > demand:
            demand = t
    return frozenset(hot), demand


def point_facts(cache, facts, hs, sl, memo=None) -> tuple:
    """(hot owners, demand, loss) of deleting an ordinary holder set of up to BIG points
    (RCL-3, RCL-5), shared by its pool orders and the Host order (`memo`: within one batch)."""
    if memo is not None:
        got = memo.get(hs)
        if got is not None:
            return got
    cids = _cids(hs)
    hot, demand = _hot_demand(cache, facts, cids)
    loss = sl[cids[0]] if sl is not None and len(cids) == 1 and sl.get(cids[0]) is not None \
        else facts.loss(frozenset(cids))
    got = (hot, demand, loss)
    if memo is not None:
        memo[hs] = got
    return got


def group_key(cache, facts, hs, live: int, frees: int, sl=None, memo=None) -> tuple[tuple, frozenset]:
    """The items an ordinary group keeps in its pool order, and its hot owners (RCL-3/4/5).

    A group of more than BIG points (a page many histories share) keeps a lower bound only,
    cheap to keep: normal tier, no demand, the sum of its points' own losses (RCL-5: nested
    points of one history lose disjoint intervals, other histories add theirs), frees capped by
    the gap; its exact key is computed when a quote reaches it."""
    if not live:
        return (), _NONE
    cids = _cids(hs)
    if len(cids) > BIG:
        return ((("n", WIDE), (sum(sl[c] for c in cids), 0, cids, INF)),), _NONE
    hot, demand, loss = point_facts(cache, facts, hs, sl, memo)
    if hot:
        return (("r", (demand, cids, loss)),), hot
    return ((("n", min(frees, WIDE)), (loss, demand, cids, frees)),), _NONE


def host_key(cache, facts, hs, sl) -> tuple:
    """The Host order item of an ordinary holder set, its hot owners and whether a point of it
    has a reuse-tier owner. The item is a lower bound of the HOST-2 rank of its deletion: the
    stored tier (no owner beyond the soft target; NORMAL for more than BIG points), the sum of
    its points' own losses (RCL-5: nested points of one history lose disjoint intervals, other
    histories add theirs; exact for one point), the demand; a quote divides the loss by the
    useful amount's cap and evaluates the entry exactly when it reaches it."""
    cids = _cids(hs)
    cps = cache.checkpoints
    reuse = any(owner_status(cache, cps[c].owner)[0] for c in cids)
    loss = sum(sl.get(c) or 0 for c in cids)
    if len(cids) > BIG:
        return (Tier.NORMAL, loss, 0, cids), _NONE, reuse
    hot, demand = _hot_demand(cache, facts, cids)
    return (Tier.REUSE if hot else Tier.NORMAL, loss, demand, cids), hot, reuse


def dem_key(cache, facts, cid: int, reaches: tuple) -> tuple:
    c = cache.checkpoints.get(cid)
    if c is None:
        return None
    h, t = facts.hot(c, _NONE)
    return ("dr" if h else "dn", (t, cid) + reaches)


def _device_only(x) -> bool:
    """A replica exception (or None) of an object a demotion may move: a Device replica, no
    Host one (RCL-6)."""
    return x is None or (x[0] and not x[1])


def reach(cid: int, objs, walk, xrep) -> tuple:
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
        w = walk.get(oid)
        if w is None or w[0][1] == cid:
            if _device_only(xget(oid)):
                return INF, -1
            continue  # a Host replica exists or no Device one: not demotable
        a = w[0][2]
        if len(w) > BIG:
            if a > wr and _device_only(xget(oid)):
                wr = a
        elif a > r and _device_only(xget(oid)):
            r = a
    return r, wr


def pool_objects(c, pool: str, opool):
    """Point c's objects in `pool`: its KV pages there (as `pages_of` lists them), or its
    StateImage."""
    segs = [pages for p, pages in c.kv if p == pool]
    if segs:
        return segs[0] if len(segs) == 1 else [o for pages in segs for o in pages]
    return (c.state,) if opool.get(c.state) == pool else ()


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


def _footprint(cache, points) -> frozenset:
    cps = cache.checkpoints
    out = set()
    for p in points:
        c = cps.get(p)
        if c is not None:
            out.update(c.object_ids())
    return frozenset(out)


def _contrib(vec: list, pidx: dict, pool: str, x) -> None:
    d, h, hb = _pres(x)
    if d:
        vec[pidx[pool]] += 1
    if h:
        vec[-1] += hb


# -- incremental maintenance ----------------------------------------------------------------
class _Lazy:
    """A map read from its base until the first write makes a mutation of it."""

    __slots__ = ("base", "m")

    def __init__(self, base):
        self.base, self.m = base, None

    def get(self, k, d=None):
        return (self.base if self.m is None else self.m).get(k, d)

    def __contains__(self, k) -> bool:
        return k in (self.base if self.m is None else self.m)

    def __getitem__(self, k):
        return (self.base if self.m is None else self.m)[k]

    def __setitem__(self, k, v) -> None:
        if self.m is None:
            self.m = self.base.mutate()
        self.m[k] = v

    def __delitem__(self, k) -> None:
        if self.m is None:
            self.m = self.base.mutate()
        del self.m[k]

    def mut(self):
        """The mutation itself, for a loop that writes many keys (a context's pages)."""
        if self.m is None:
            self.m = self.base.mutate()
        return self.m

    def finish(self):
        return self.base if self.m is None else self.m.finish()


class _Work:
    """One batch of changes to a VictimIndex; `finish()` returns the new (persistent) index."""

    def __init__(self, vi: VictimIndex, cache):
        self.vi, self.cache = vi, cache
        self.xrep = vi.xrep
        self.oh = _Lazy(vi.oh)
        self.opool = _Lazy(vi.opool)
        self.dem = _Lazy(vi.dem)
        self.walk = _Lazy(vi.walk)
        self.wide = _Lazy(vi.wide)
        self.hl = _Lazy(vi.hlive)
        self.hdirty: set = set()  # holder sets whose Host-only count moved
        self._aheads: dict = {}
        self.gw: dict = {}  # (pool, hs) -> [members (set), live, old live]
        self.dirty_groups: set = set()
        self.dirty_points: set = set()  # groups with a point whose facts changed (special status, loss, tier)
        self.dirty_dem: set = set()  # demotion candidates whose count moved
        self.gained: set = set()  # ... one of whose objects became Device-only (`lead`)
        self.dirty_dem_key: set = set()  # ... whose key may have moved (tier, demand, reach)
        self.dcids: set = set()  # points whose own loss may have changed
        self.ord: dict = {}  # pool -> {name: PSorted}
        self.held: dict = {}
        self.pidx = {p: i for i, p in enumerate(vi.pools)}
        # heat overlays
        self.h_sig: dict = {}  # owner -> (-demand, owner) | None (left the segment)
        self.h_vec: dict = {}  # owner -> list
        self.h_fp: dict = {}  # owner -> frozenset
        self.billed = _Lazy(vi.heat.billed)
        self._facts = None

    @property
    def facts(self):
        if self._facts is None:
            self._facts = _facts(self.cache)
        return self._facts

    # -- orders --
    def _order(self, pool: str, name) -> PSorted:
        d = self.ord.get(pool)
        if d is None:
            d = self.ord[pool] = {}
        o = d.get(name)
        if o is None:
            po = self.vi.orders[pool]
            o = d[name] = po.n.get(name[1], _EMPTY_SORTED) if isinstance(name, tuple) else getattr(po, name)
        return o

    def _put(self, pool: str, name: str, o: PSorted) -> None:
        self.ord[pool][name] = o

    def _drop_items(self, pool, items) -> None:
        for name, it in items:
            self._put(pool, name, self._order(pool, name).remove(it))

    # -- objects --
    def _group(self, pool, hs):
        key = (pool, hs)
        w = self.gw.get(key)
        if w is None:
            g = self.vi.groups.get(key)
            w = self.gw[key] = [set(g.members), g.live, g.live] if g is not None else [set(), 0, 0]
        return w

    def _obj(self, oid: int, hs, x, pool: str, sign: int, dem: bool = True) -> None:
        d, h, _ = _pres(x)
        if not any(t[0] == "ckpt" for t in hs):
            return  # held by waiters only: not a candidate (RCL-1: checkpoints' objects)
        w = self._group(pool, hs)
        if sign > 0:
            w[0].add(oid)
        else:
            w[0].discard(oid)
        if d == 2 and h != 2:
            w[1] += sign
        if d == 2:
            self.held[pool] = self.held.get(pool, 0) + sign
            if h == 2:
                xo = self._order(pool, "x")
                self._put(pool, "x", xo.add((oid,)) if sign > 0 else xo.remove((oid,)))
        if h == 2 and d != 2:  # Host-only: what deleting its holders frees on Host (HOST-2)
            n = self.hl.get(hs, 0) + sign
            if n:
                self.hl[hs] = n
            else:
                del self.hl[hs]
            self.hdirty.add(hs)
        if dem and d and not h:
            for t in hs:
                if t[0] == "ckpt":
                    self._dem_count(pool, t[1], sign)

    def _dem_count(self, pool: str, cid: int, delta: int) -> None:
        k = (pool, cid)
        cur = self.dem.get(k)
        self.dem[k] = ((cur[0] if cur else 0) + delta, cur[1] if cur else None)
        self.dirty_dem.add(k)
        if delta > 0:
            self.gained.add(k)

    def hold(self, oid: int, holder, sign: int, pool: str | None = None) -> None:
        old = self.oh.get(oid, _NONE)
        new = old | {holder} if sign > 0 else old - {holder}
        if new == old:
            return
        derive_wide(old, new, holder, sign)
        if pool is None:
            pool = self.opool[oid]
        x = self.xrep.get(oid)
        # One holder joins or leaves: the others' demotion counts stay as they are, so only the
        # changed holder's moves (a page every history shares has thousands of holders).
        if old:
            self._obj(oid, old, x, pool, -1, dem=False)
        if new:
            self._obj(oid, new, x, pool, +1, dem=False)
        d, h, _ = _pres(x)
        if d and not h and holder[0] == "ckpt":
            self._dem_count(pool, holder[1], sign)
        if new:
            self.oh[oid] = new
            self.opool[oid] = pool
        else:
            del self.oh[oid]
            del self.opool[oid]
        if holder[0] == "ckpt":
            self._walk(oid, holder[1], sign)

    def hold_run(self, oids, holder, sign: int, pools) -> None:
        """`holder` joins (sign > 0) or leaves each of `oids`, as `hold` one by one would. The
        objects that had the same holder set (a context's pages) move between the same two
        groups, so the group, count and walk work is done once per holder set, and the new
        holder set is one object all of them share."""
        if len(set(oids)) != len(oids):  # an object twice: its second change sees the first
            for oid in oids:
                self.hold(oid, holder, sign, pools.get(oid))
            return
        oh, opool = self.oh, self.opool
        buckets: dict = {}
        for oid in oids:
            old = oh.get(oid, _NONE)
            if (holder in old) == (sign > 0):
                continue  # nothing changes (as `hold`)
            pool = pools.get(oid)
            if pool is None:
                pool = opool[oid]
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
        derive_wide(old, new, holder, sign)
        xget = self.xrep.get
        live = held = hl = dem = 0
        dups = []
        for oid in run:  # presence classes, as `_obj` reads them (`_pres`)
            x = xget(oid)
            if x is None:
                live += 1
                held += 1
                dem += 1
                continue
            d, h = x[0], x[1]
            if d == 2:
                held += 1
                if h == 2:
                    dups.append(oid)
                else:
                    live += 1
            elif h == 2:
                hl += 1
            if d and not h:
                dem += 1
        ck_old = any(t[0] == "ckpt" for t in old)
        ck_new = any(t[0] == "ckpt" for t in new)
        for hs, s, ck in ((old, -1, ck_old), (new, 1, ck_new)):
            if not ck:
                continue  # held by waiters only: not a candidate (RCL-1)
            w = self._group(pool, hs)
            if s > 0:
                w[0].update(run)
            else:
                w[0].difference_update(run)
            w[1] += s * live
            if hl:
                n = self.hl.get(hs, 0) + s * hl
                if n:
                    self.hl[hs] = n
                else:
                    del self.hl[hs]
                self.hdirty.add(hs)
        if ck_old != ck_new:  # the objects join or leave the listed ones (a listed set stays listed)
            s = 1 if ck_new else -1
            self.held[pool] = self.held.get(pool, 0) + s * held
            if dups:
                xo = self._order(pool, "x")
                for oid in dups:
                    xo = xo.add((oid,)) if s > 0 else xo.remove((oid,))
                self._put(pool, "x", xo)
        if dem and holder[0] == "ckpt":
            self._dem_count(pool, holder[1], sign * dem)
        oh, opool = self.oh.mut(), self.opool.mut()
        if new:
            for oid in run:
                oh[oid] = new
            if not old:
                for oid in run:
                    opool[oid] = pool
        else:
            for oid in run:
                del oh[oid]
                del opool[oid]
        if holder[0] == "ckpt":
            self._walk_same(run, old, pool, holder[1], sign)

    def _walk_same(self, run: list, old, pool: str, cid: int, sign: int) -> None:
        """`_walk` for objects that all had holder set `old`: they have the same listing points,
        so the new point's place in their walk order and what it moves are found once."""
        was = _cids(old)
        n = len(was)
        walk = self.walk
        if n < 2:  # no walk entry yet: one appears when a second point lists them
            if sign < 0 or n < 1:
                return
            keys = sorted((walk_key(c), c) for c in was + (cid,))
            for oid in run:
                walk[oid] = tuple(k + (self._ahead(k[1], oid, pool),) for k in keys)
            self._first_moved(run[0], list(was) + [cid])
            return
        k = (walk_key(cid), cid)
        i = bisect_left(sorted((walk_key(c), c) for c in was), k)
        m = n + 1 if sign > 0 else n - 1
        walk = walk.mut()
        for oid in run:
            cur = walk.get(oid)
            if cur is None or len(cur) != n:  # not the listing `old` names: one by one
                self._walk(oid, cid, sign)
                continue
            if sign > 0:
                new = cur[:i] + (k + (self._ahead(cid, oid, pool),),) + cur[i:]
            else:
                new = cur[:i] + cur[i + 1:]
            if m >= 2:
                walk[oid] = new
            else:
                del walk[oid]
            if (m > BIG) != (n > BIG):
                if m > BIG:
                    self.wide[oid] = pool
                else:
                    del self.wide[oid]
        if (m > BIG) != (n > BIG) or m < 2 or i == 0:  # the first listing point moved
            self._first_moved(run[0], list(was) + [cid])

    def _walk(self, oid: int, cid: int, sign: int) -> None:
        """Keep the listing points of a shared object in demotion walk order (RCL-6): a tuple of
        (walk key, cid, objects ahead of it in that point's demotion order), kept for objects
        with two or more."""
        cur = self.walk.get(oid)
        if cur is None:  # fewer than two before this change: count them after it
            cids = [h[1] for h in self.oh.get(oid, ()) if h[0] == "ckpt"]
            if len(cids) >= 2:  # one point became two: the first of them may not be the old one
                pool = self.opool[oid]
                self.walk[oid] = tuple(sorted((walk_key(c), c, self._ahead(c, oid, pool)) for c in cids))
                self._first_moved(oid, cids)
            return
        k = (walk_key(cid), cid)
        i = bisect_left(cur, k)
        here = i < len(cur) and cur[i][:2] == k
        if sign > 0:
            new = cur if here else cur[:i] + (k + (self._ahead(cid, oid, self.opool[oid]),),) + cur[i:]
        else:
            new = cur[:i] + cur[i + 1:] if here else cur
        if len(new) >= 2:
            self.walk[oid] = new
        else:
            del self.walk[oid]
        if (len(new) > BIG) != (len(cur) > BIG):  # its listers count it in the other reach now
            if len(new) > BIG:
                self.wide[oid] = self.opool[oid]
            else:
                del self.wide[oid]
            self._first_moved(oid, [e[1] for e in cur] + [cid])
        elif not new or len(new) < 2 or new[0] != cur[0]:
            self._first_moved(oid, [e[1] for e in cur] + [cid])

    def _first_moved(self, oid: int, cids) -> None:
        """The first point listing a shared object changed: its listers' reach (RCL-6) moves."""
        pool = self.opool.get(oid)
        if pool is None:
            for c in cids:
                for p in self.vi.pools:
                    if (p, c) in self.dem:
                        self.dirty_dem.add((p, c))
                        self.dirty_dem_key.add((p, c))
            return
        for c in cids:
            if (pool, c) in self.dem:
                self.dirty_dem.add((pool, c))
                self.dirty_dem_key.add((pool, c))

    def _ahead(self, cid: int, oid: int, pool: str) -> int:
        m = self._aheads.get((cid, pool))
        if m is None:
            m = self._aheads[(cid, pool)] = ahead_map(self.cache.checkpoints[cid], pool)
        return m[oid]

    def presence(self, oid: int, x0, x1) -> None:
        hs = self.oh.get(oid)
        if hs is not None:
            pool = self.opool[oid]
            self._obj(oid, hs, x0, pool, -1)
            self._obj(oid, hs, x1, pool, +1)
            d0, h0, _ = _pres(x0)
            d1, h1, _ = _pres(x1)
            if bool(d0 and not h0) != bool(d1 and not h1):  # it enters or leaves its listers' reach
                for t in hs:
                    if t[0] == "ckpt" and (pool, t[1]) in self.dem:
                        self.dirty_dem_key.add((pool, t[1]))
        b = self.billed.get(oid)
        if b is not None:
            vec = self._vec(b[0])
            neg = [0] * len(vec)
            _contrib(neg, self.pidx, b[1], x0)
            pos = [0] * len(vec)
            _contrib(pos, self.pidx, b[1], x1)
            for k in range(len(vec)):
                vec[k] += pos[k] - neg[k]

    def sync(self, xrep) -> None:
        for oid, x0, x1 in ptrie.diff(self.xrep, xrep):
            self.presence(oid, x0, x1)
        self.xrep = xrep

    def _lead_now(self, k, c) -> int:
        """`lead` of point c in pool k[0] on the version this change makes: on from the kept
        one when the point only lost Device-only objects here (a lower bound), else from its
        first page."""
        got = None if k in self.gained else _kept_lead(self.vi, k, c)
        return _past_moved(c, k[0], self.xrep, got[0] if got else 0)

    def _carry_leads(self) -> None:
        """A point that only lost Device-only objects in this change keeps its `lead` as a
        lower bound: what came before its first Device-only page still does not move."""
        leads, base = self.vi.leads, self.vi.dem
        if not leads:
            return
        for k in self.dirty_dem:
            if k in self.gained:
                continue
            got = leads.get(k)
            if got is None or got[0] is not base.get(k):
                continue
            new = self.dem.get(k)
            if new is not None:
                leads[k] = (new, got[1], got[2], False)

    # -- keys --
    def _wide_chain(self, pool: str, hs):
        """A holder set wider than BIG made in this change from one the index keeps, by adding
        or removing a few holders: (that kept group, [(holder, sign), ...]), else None."""
        steps = []
        cur = hs
        for _ in range(16):
            par = wide_parent(cur)
            if par is None:
                return None
            cur, h, sign = par
            steps.append((h, sign))
            g = self.vi.groups.get((pool, cur))
            if g is not None:
                return (cur, g, steps) if _width(cur) > BIG else None
        return None

    def _wide_special(self, pool: str, hs):
        """Is a new wide holder set special (WAIT-2, PAUSE-4), from the kept set it was made
        from: that one's flag, the holders added, and the points whose facts moved. None: count
        it (a special holder left, or no kept ancestor)."""
        got = self._wide_chain(pool, hs) if _width(hs) > BIG else None
        if got is None:
            return None
        _, g, steps = got
        if g.special and any(sign < 0 for _, sign in steps):
            return None
        cache = self.cache
        return (g.special or any(sign > 0 and special_holder(cache, h) for h, sign in steps)
                or any(special_holder(cache, ("ckpt", c)) for c in self.dcids if ("ckpt", c) in hs))

    def _wide_bound(self, pool: str, hs, sl, sl_delta):
        """The loss bound of a new wide group (the sum of its points' own losses, RCL-5) from
        the kept group it was made from: its bound, the moved losses of its points, the points
        added or removed. None: compute it."""
        got = self._wide_chain(pool, hs) if _width(hs) > BIG else None
        if got is None:
            return None
        anc, g, steps = got
        if g.special or len(g.items) != 1 or g.items[0][0] != ("n", WIDE):
            return None
        lb = g.items[0][1][0] + sum(sl_delta.get(c, 0) for c in self.dcids if ("ckpt", c) in anc)
        for h, sign in steps:
            if h[0] == "ckpt":
                lb += sign * (sl.get(h[1]) or 0)
        return lb

    def dirty_cid(self, cid: int) -> None:
        self.dcids.add(cid)
        vi = self.vi
        h = ("ckpt", cid)
        for pool in vi.pools:
            for hs in vi.gidx.get((pool, cid), ()):
                self.dirty_groups.add((pool, hs))
                self.dirty_points.add((pool, hs))
            for hs in vi.big.get(pool, ()):
                if h in hs:
                    self.dirty_groups.add((pool, hs))
                    self.dirty_points.add((pool, hs))
            if (pool, cid) in self.dem:
                self.dirty_dem.add((pool, cid))
                self.dirty_dem_key.add((pool, cid))

    def dirty_owner(self, owner) -> None:
        _, _, points = owner_status(self.cache, owner)
        for p in points:
            self.dirty_cid(p)
        self._heat_owner(owner)

    # -- heat (HEAT-4) --
    def _sig(self, owner):
        if owner in self.h_sig:
            return self.h_sig[owner]
        it = self.vi.heat.owners.get(owner)
        return None if it is None else it[:2]

    def _fp(self, owner):
        if owner in self.h_fp:
            return self.h_fp[owner]
        return self.vi.heat.fp.get(owner, _NONE)

    def _vec(self, owner) -> list:
        v = self.h_vec.get(owner)
        if v is None:
            it = self.vi.heat.owners.get(owner)
            v = self.h_vec[owner] = list(it[2]) if it is not None else [0] * (len(self.vi.pools) + 1)
            if owner not in self.h_sig:
                self.h_sig[owner] = None if it is None else it[:2]
        return v

    def _best(self, oid: int):
        """The newest reuse-tier owner whose footprint has oid (recounted)."""
        cps = self.cache.checkpoints
        best, bs = None, None
        for h in self.oh.get(oid, ()):
            if h[0] != "ckpt":
                continue
            c = cps.get(h[1])
            if c is None:
                continue
            o = c.owner
            s = self._sig(o)
            if s is not None and (bs is None or s < bs) and oid in self._fp(o):
                best, bs = o, s
        return best

    def _heat_owner(self, owner) -> None:
        if owner[0] not in ("rec", "shared"):
            return
        reuse, demand, points = owner_status(self.cache, owner)
        old_sig, old_fp = self._sig(owner), self._fp(owner)
        new_sig = (-demand, owner) if reuse else None
        new_fp = _footprint(self.cache, points) if reuse else _NONE
        if old_sig is None and new_sig is None:
            return
        self._vec(owner)
        self.h_sig[owner] = new_sig
        self.h_fp[owner] = new_fp
        newer = old_sig is not None and new_sig is not None and new_sig <= old_sig
        billed = self.billed
        for oid in old_fp | new_fp:
            cur = billed.get(oid)
            cur_o = cur[0] if cur is not None else None
            if cur_o is not None and cur_o != owner:
                nb = owner if (new_sig is not None and oid in new_fp and new_sig < self._sig(cur_o)) else cur_o
            elif cur_o == owner and newer and oid in new_fp:
                nb = owner
            elif cur_o is None and new_sig is not None and oid in new_fp:
                nb = owner  # billed to nobody: no other reuse-tier owner holds it
            else:
                nb = self._best(oid)
            if nb == cur_o:
                continue
            pool = cur[1] if cur is not None else self.opool.get(oid)
            x = self.xrep.get(oid)
            if cur_o is not None:
                v = self._vec(cur_o)
                neg = [0] * len(v)
                _contrib(neg, self.pidx, pool, x)
                for k in range(len(v)):
                    v[k] -= neg[k]
            if nb is None:
                del billed[oid]
            else:
                _contrib(self._vec(nb), self.pidx, pool, x)
                billed[oid] = (nb, pool)

    # -- closing --
    def finish(self) -> VictimIndex:
        vi = self.vi
        cache = self.cache
        groups = _Lazy(vi.groups)
        gidx = _Lazy(vi.gidx)
        special: dict = {}
        big: dict = {}

        def sp_set(pool):
            got = special.get(pool)
            if got is None:
                got = special[pool] = set(vi.special.get(pool, _NONE))
            return got

        def big_set(pool):
            got = big.get(pool)
            if got is None:
                got = big[pool] = set(vi.big.get(pool, _NONE))
            return got

        # 1. the points' own losses (RCL-5), for the large groups' bounds
        sl = _Lazy(vi.sl)
        sl_delta = {}
        if self.dcids and cache is not None:
            facts = self.facts
            for cid in self.dcids:
                old, new = sl.get(cid), single_loss(cache, facts, cid)
                if old != new:
                    sl_delta[cid] = (new or 0) - (old or 0)
                    if new is None:
                        del sl[cid]
                    else:
                        sl[cid] = new
        # 2. groups whose members changed
        created, deltas = [], []
        for key, (members, live, old_live) in self.gw.items():
            pool, hs = key
            g = groups.get(key)
            wide = _width(hs) > BIG
            if not members:
                if g is not None:
                    self._drop_items(pool, g.items)
                    if g.special:
                        sp_set(pool).discard(hs)
                    del groups[key]
                    if wide:
                        big_set(pool).discard(hs)
                    else:
                        for h in hs:
                            if h[0] == "ckpt":
                                k = (pool, h[1])
                                left = gidx.get(k, _NONE) - {hs}
                                if left:
                                    gidx[k] = left
                                else:
                                    del gidx[k]
                        if not g.special and old_live:
                            deltas.append((key, -old_live))
                self.dirty_groups.discard(key)
                continue
            if g is None:
                groups[key] = Group(frozenset(members), live, 0, (), _NONE, False)
                if wide:
                    big_set(pool).add(hs)
                else:
                    for h in hs:
                        if h[0] == "ckpt":
                            k = (pool, h[1])
                            gidx[k] = gidx.get(k, _NONE) | {hs}
                created.append(key)
                self.dirty_groups.add(key)
            else:
                groups[key] = g._replace(members=frozenset(members), live=live)
                if live != old_live:
                    if not g.special and not wide:
                        deltas.append((key, live - old_live))
                    self.dirty_groups.add(key)
        # 3. special status (a point kept only by a waiter makes every group with it special)
        fresh = set(created)
        for key in self.dirty_groups:
            if key not in fresh and key not in self.dirty_points:
                continue  # only its counts moved: same holders, same points
            g = groups.get(key)
            if g is None:
                continue
            pool, hs = key
            derived = self._wide_special(pool, hs) if key in fresh else None
            if derived is not None:
                sp_now = derived
            elif key in fresh or _width(hs) <= BIG:
                sp_now = is_special(cache, hs)
            else:  # a large group: only its changed points can have become special
                sp_now = g.special or any(special_holder(cache, ("ckpt", c)) for c in self.dcids
                                          if ("ckpt", c) in hs)
            if sp_now != g.special or (sp_now and key in fresh):
                (sp_set(pool).add if sp_now else sp_set(pool).discard)(hs)
                groups[key] = g._replace(special=sp_now, frees=0)
                if not sp_now:
                    fresh.add(key)  # counted from scratch below
        # 4. frees: existing ordinary groups move by their subgroups' deltas; new ones are counted
        for key in created:
            g = groups[key]
            if not g.special and g.live and _width(key[1]) <= BIG:
                deltas.append((key, g.live))
        for (pool, hs), d in deltas:
            for s in _supersets(gidx, pool, hs) + [hs]:
                k = (pool, s)
                if k in fresh:
                    continue
                g = groups.get(k)
                if g is None or g.special:
                    continue
                groups[k] = g._replace(frees=g.frees + d)
                self.dirty_groups.add(k)
        for key in fresh:
            g = groups.get(key)
            if g is not None and not g.special and _width(key[1]) <= BIG:
                groups[key] = g._replace(frees=_frees(groups, gidx, key[0], key[1]))
        # 5. re-key
        facts = self.facts if cache is not None else None
        kmemo: dict = {}  # holder set -> its points' facts, shared by its pools and the Host order
        for key in self.dirty_groups:
            g = groups.get(key)
            if g is None:
                continue
            pool, hs = key
            if g.special:
                items, hot = (), _NONE
            elif len(g.items) == 1 and g.items[0][0] == ("n", WIDE) and g.items[0][1][3] == INF and g.live \
                    and key not in fresh:
                name, (lb, z, cids, inf) = g.items[0]  # a large group: its bound moves by its points' changes
                lb += sum(sl_delta.get(c, 0) for c in self.dcids if ("ckpt", c) in hs)
                items, hot = ((name, (lb, z, cids, inf)),), _NONE
            else:
                lb = self._wide_bound(pool, hs, sl, sl_delta) if key in fresh and g.live else None
                if lb is not None:  # a large group made from one the index kept, by a few holders
                    items, hot = ((("n", WIDE), (lb, 0, _cids(hs), INF)),), _NONE
                else:
                    items, hot = group_key(cache, facts, hs, g.live, g.frees, sl, kmemo)
            if items != g.items:
                self._drop_items(pool, g.items)
                for name, it in items:
                    self._put(pool, name, self._order(pool, name).add(it))
            if items != g.items or hot != g.hot:
                groups[key] = g._replace(items=items, hot=hot)
        for k in self.dirty_dem:
            cur = self.dem.get(k)
            if cur is None:
                continue
            n, stored = cur
            if n > 0 and stored is not None and k not in self.dirty_dem_key:
                continue  # only its count moved (its key is the point's and its owner's)
            want = lead = None
            if n > 0 and k[1] in cache.checkpoints:
                c = cache.checkpoints[k[1]]
                if any(p == k[0] for p, _ in c.kv):  # reach does not depend on the order: read
                    lead = self._lead_now(k, c)  # the walk past the lead, which cannot move
                    objs = pages_of(c, k[0], KV_PAGES, lead)
                else:
                    objs = pool_objects(c, k[0], self.opool)
                want = dem_key(cache, facts, k[1], reach(k[1], objs, self.walk, self.xrep))
            if want != stored:
                pool = k[0]
                if stored is not None:
                    self._put(pool, stored[0], self._order(pool, stored[0]).remove(stored[1]))
                if want is not None:
                    self._put(pool, want[0], self._order(pool, want[0]).add(want[1]))
            if n <= 0:
                del self.dem[k]
            else:
                self.dem[k] = new = (n, want)
                if lead is not None and self.vi.leads is not None:
                    self.vi.leads[k] = (new, c.kv, lead, True)
        self._carry_leads()
        # 5b. the Host order: holder sets whose Host-only count or point facts moved
        hitems, hreuse, hl = _Lazy(vi.hitems), _Lazy(vi.hreuse), self.hl
        h_rm, h_add = [], []
        facts_moved = {k[1] for k in self.dirty_points}  # loss, tier, demand or special status
        for hs in (self.hdirty | facts_moved) if cache is not None else ():
            old = hitems.get(hs)
            if hs not in facts_moved and (old is not None) == (hl.get(hs, 0) > 0):
                continue  # only its count moved: the item holds no count
            new = None
            if hl.get(hs, 0) > 0 and not any(groups.get((p, hs)) is not None and groups[(p, hs)].special
                                              for p in vi.pools):
                new = host_key(cache, facts, hs, sl)
            if new == old:
                continue
            if old is not None:
                h_rm.append(old[0])
            if new is not None:
                h_add.append(new[0])
                hitems[hs] = new
            else:
                del hitems[hs]
            if new is not None and new[2]:
                hreuse[hs] = None
            elif hs in hreuse:
                del hreuse[hs]
        hord = vi.hord.update(h_rm, h_add) if h_rm or h_add else vi.hord
        # 6. assemble
        orders = vi.orders
        if self.ord or self.held:
            for pool in set(self.ord) | set(self.held):
                po = orders[pool]
                n, r, dn, dr, x = po.n, po.r, po.dn, po.dr, po.x
                for name, o in self.ord.get(pool, {}).items():
                    if name.__class__ is tuple:
                        n = n.set(name[1], o) if len(o) else (n.delete(name[1]) if name[1] in n else n)
                    elif name == "r":
                        r = o
                    elif name == "dn":
                        dn = o
                    elif name == "dr":
                        dr = o
                    else:
                        x = o
                orders = orders.set(pool, PoolOrder(n, r, dn, dr, x, po.held + self.held.get(pool, 0)))
        sp_map = _set_map(vi.special, special)
        big_map = _set_map(vi.big, big)
        heat = vi.heat
        if self.h_vec or self.h_sig:
            owners = heat.owners.mutate()
            fp = heat.fp.mutate()
            seg_rm, seg_add = [], []
            for o in set(self.h_vec) | set(self.h_sig):
                old = heat.owners.get(o)
                sig = self._sig(o)
                vec = tuple(self.h_vec[o]) if o in self.h_vec else (old[2] if old else ())
                new = None if sig is None else sig + (vec,)
                if new == old:
                    continue
                if old is not None:
                    seg_rm.append(old)
                if new is not None:
                    seg_add.append(new)
                    owners[o] = new
                elif o in owners:
                    del owners[o]
            for o, f in self.h_fp.items():
                if f:
                    fp[o] = f
                elif o in fp:
                    del fp[o]
            heat = Heat(owners.finish(), heat.seg.update(seg_rm, seg_add), fp.finish(), self.billed.finish())
        else:
            heat = heat._replace(billed=self.billed.finish())
        return VictimIndex(vi.pools, self.xrep, self.oh.finish(), self.opool.finish(), groups.finish(),
                           gidx.finish(), big_map, sp_map, orders, self.dem.finish(),
                           sl.finish(), self.walk.finish(), heat, hl.finish(), hitems.finish(), hord, hreuse.finish(),
                           wide=self.wide.finish(), leads=vi.leads)


def _width(hs) -> int:
    """How many points a holder set has (its waiters aside); exact only when it matters (> BIG)."""
    n = len(hs)
    return n if n <= BIG else _wide_facts(hs)[0]


def _set_map(base, changed: dict):
    if not changed:
        return base
    m = base.mutate()
    for pool, s in changed.items():
        if s:
            m[pool] = frozenset(s)
        elif pool in m:
            del m[pool]
    return m.finish()


def _supersets(gidx, pool, hs) -> list:
    """Groups (up to BIG points) strictly containing holder set `hs`."""
    best = None
    for h in hs:
        if h[0] == "ckpt":
            s = gidx.get((pool, h[1]), _NONE)
            if best is None or len(s) < len(best):
                best = s
    return [s for s in (best or ()) if s != hs and s > hs]


def _frees(groups, gidx, pool, hs) -> int:
    """Live members of every group whose holder set lies within `hs` (its own included)."""
    seen, total = set(), 0
    for h in hs:
        if h[0] != "ckpt":
            continue
        for s in gidx.get((pool, h[1]), ()):
            if s in seen:
                continue
            seen.add(s)
            if s <= hs:
                g = groups.get((pool, s))
                if g is not None and not g.special:
                    total += g.live
    return total


# -- public maintenance API --------------------------------------------------------------
def change(vi: VictimIndex | None, cache, *, holders=(), cids=(), owners=(), pools=None) -> VictimIndex | None:
    """Queue one batch: `holders` = (oid, holder, +1|-1) cache-holder changes (the cache's own
    listing), `cids` = points whose fallback, aliases or owner changed, `owners` = records or
    shared entries that changed; `pools` maps new objects to their pool. Applied by `sync`, on
    the cache it is given then (one re-keying per policy operation, on its final facts)."""
    if vi is None or not (holders or cids or owners):
        return vi
    return vi._replace(pending=vi.pending + ((tuple(holders), tuple(cids), tuple(owners), dict(pools or {})),))


def sync(vi: VictimIndex | None, state, cache) -> VictimIndex | None:
    """The index for this cache and the ledger's current replicas: the queued cache changes,
    then the objects whose replica exceptions differ (`ptrie.diff`)."""
    if vi is None or (vi.xrep is state.xrep and not vi.pending):
        return vi
    w = _Work(vi, cache)
    if vi.pending:
        owners, cids = {}, {}
        for holders, cs, os_, pools in vi.pending:
            i, n = 0, len(holders)
            while i < n:  # runs of one holder change (a point's or a waiter's objects): at once
                _, h, sign = holders[i]
                j = i + 1
                while j < n and holders[j][1] == h and holders[j][2] == sign:
                    j += 1
                if j - i == 1:
                    w.hold(holders[i][0], h, sign, pools.get(holders[i][0]))
                else:
                    w.hold_run([e[0] for e in holders[i:j]], h, sign, pools)
                i = j
            owners.update(dict.fromkeys(os_))
            cids.update(dict.fromkeys(cs))
        for o in owners:
            w.dirty_owner(o)
        for c in cids:
            w.dirty_cid(c)
    w.sync(state.xrep)
    return w.finish()


# -- from first principles -------------------------------------------------------------------
def build(state, cache) -> VictimIndex:
    """The whole index recomputed from the cache and the ledger's objects (check_cache, bulk)."""
    pools = tuple(p.pool_id for p in state.config.pools)
    pidx = {p: i for i, p in enumerate(pools)}
    oh: dict = {}
    for cid, c in cache.checkpoints.items():
        h = ("ckpt", cid)
        for oid in c.object_ids():
            oh.setdefault(oid, set()).add(h)
    for req, wr in cache.waiters.items():
        h = ("wait", req)
        for oid in wr.objects:
            oh.setdefault(oid, set()).add(h)
    objects = state.objects
    xrep = state.xrep
    opool = {}
    members: dict = {}
    live: dict = {}
    xs: dict = {p: [] for p in pools}
    held = dict.fromkeys(pools, 0)
    hlive: dict = {}
    dem: dict = {}
    for oid, hs in oh.items():
        hs = frozenset(hs)
        oh[oid] = hs
        pool = objects[oid].pool
        opool[oid] = pool
        if not any(t[0] == "ckpt" for t in hs):
            continue
        d, h, _ = _pres(xrep.get(oid))
        key = (pool, hs)
        members.setdefault(key, set()).add(oid)
        live[key] = live.get(key, 0) + (d == 2 and h != 2)
        if d == 2:
            held[pool] += 1
            if h == 2:
                xs[pool].append((oid,))
        if h == 2 and d != 2:
            hlive[hs] = hlive.get(hs, 0) + 1
        if d and not h:
            for t in hs:
                if t[0] == "ckpt":
                    dem[(pool, t[1])] = dem.get((pool, t[1]), 0) + 1
    facts = _facts(cache)
    sl = {cid: single_loss(cache, facts, cid) for cid in cache.checkpoints.keys()}
    walk = {}
    aheads: dict = {}
    for oid, hs in oh.items():
        cids = [t[1] for t in hs if t[0] == "ckpt"]
        if len(cids) >= 2:
            pool = opool[oid]
            ent = []
            for c in cids:
                m = aheads.get((c, pool))
                if m is None:
                    m = aheads[(c, pool)] = ahead_map(cache.checkpoints[c], pool)
                ent.append((walk_key(c), c, m[oid]))
            walk[oid] = tuple(sorted(ent))
    gidx: dict = {}
    big: dict = {}
    for (pool, hs) in members:
        if _width(hs) > BIG:
            big.setdefault(pool, set()).add(hs)
            continue
        for t in hs:
            if t[0] == "ckpt":
                gidx.setdefault((pool, t[1]), set()).add(hs)
    kmemo: dict = {}
    spec = {key: is_special(cache, key[1]) for key in members}
    groups = {}
    lists: dict = {p: {"r": [], "dn": [], "dr": []} for p in pools}
    special: dict = {}
    for key, ms in members.items():
        pool, hs = key
        if spec[key]:
            special.setdefault(pool, set()).add(hs)
            groups[key] = Group(frozenset(ms), live[key], 0, (), _NONE, True)
            continue
        frees = 0
        if _width(hs) <= BIG:  # the live members of every group within it (its own included)
            seen = set()
            for t in hs:
                for s in gidx.get((pool, t[1]), ()):
                    if s not in seen:
                        seen.add(s)
                        if s <= hs and not spec[(pool, s)]:
                            frees += live[(pool, s)]
        items, hot = group_key(cache, facts, hs, live[key], frees, sl, kmemo)
        for name, it in items:
            lists[pool].setdefault(name, []).append(it)
        groups[key] = Group(frozenset(ms), live[key], frees, items, hot, False)
    dem_out = {}
    for k, n in dem.items():
        want = dem_key(cache, facts, k[1], reach(k[1], pool_objects(cache.checkpoints[k[1]], k[0], opool), walk, xrep))
        dem_out[k] = (n, want)
        if want is not None:
            lists[k[0]][want[0]].append(want[1])
    orders = {}
    for p in pools:
        ls = lists[p]
        buckets = {name[1]: from_sorted(sorted(v)) for name, v in ls.items() if isinstance(name, tuple) and v}
        orders[p] = PoolOrder(immutables.Map(buckets), from_sorted(sorted(ls["r"]), _agg_r),
                              from_sorted(sorted(ls["dn"]), _agg_d),
                              from_sorted(sorted(ls["dr"]), _agg_d), from_sorted(sorted(xs[p])), held[p])
    hitems = {hs: host_key(cache, facts, hs, sl) for hs in hlive if not is_special(cache, hs)}
    # HEAT-4: owners newest real demand first, each object billed to the first that holds it
    owners = []
    for r in cache.records.values():
        if r.tier == Tier.REUSE:
            owners.append(((-r.demand_time, ("rec", r.rid)), r.points()))
    for e in cache.shared.values():
        if e.tier == Tier.REUSE:
            owners.append(((-e.demand_time, ("shared", e.sid)), (e.point,)))
    owners.sort(key=lambda x: x[0])
    billed, fps, items = {}, {}, []
    for sig, points in owners:
        o = sig[1]
        fp = _footprint(cache, points)
        fps[o] = fp
        vec = [0] * (len(pools) + 1)
        for oid in fp:
            if oid in billed:
                continue
            pool = objects[oid].pool if oid in objects else opool.get(oid)
            billed[oid] = (o, pool)
            _contrib(vec, pidx, pool, xrep.get(oid))
        items.append(sig + (tuple(vec),))
    heat = Heat(immutables.Map({it[1]: it for it in items}), from_sorted(items, _agg_seg),
                immutables.Map({o: f for o, f in fps.items() if f}), immutables.Map(billed))
    return VictimIndex(pools, xrep, immutables.Map(oh), immutables.Map(opool), immutables.Map(groups),
                       immutables.Map({k: frozenset(v) for k, v in gidx.items()}),
                       immutables.Map({p: frozenset(v) for p, v in big.items() if v}),
                       immutables.Map({p: frozenset(v) for p, v in special.items() if v}), immutables.Map(orders),
                       immutables.Map(dem_out), immutables.Map(sl), immutables.Map(walk),
                       heat, immutables.Map(hlive), immutables.Map(hitems),
                       from_sorted(sorted(it[0] for it in hitems.values())),
                       immutables.Map({hs: None for hs, it in hitems.items() if it[2]}),
                       wide=immutables.Map({oid: opool[oid] for oid, w in walk.items() if len(w) > BIG}), leads={})


def compare(got: VictimIndex, want: VictimIndex) -> list[str]:
    """What differs between a kept index and one built from first principles."""
    errs = []
    if got.pools != want.pools:
        errs.append(f"victim index pools {got.pools} != {want.pools}")
    for name in ("oh", "opool", "gidx", "big", "special", "dem", "sl", "walk", "hlive", "hitems",
                 "hreuse", "wide"):
        a, b = getattr(got, name), getattr(want, name)
        if a != b:
            keys = sorted(map(repr, {k for k in set(a.keys()) | set(b.keys()) if a.get(k) != b.get(k)}))
            errs.append(f"victim index {name} differs at {keys[:5]}")
    if got.groups != want.groups:
        keys = [k for k in set(got.groups.keys()) | set(want.groups.keys()) if got.groups.get(k) != want.groups.get(k)]
        for k in sorted(keys, key=repr)[:5]:
            errs.append(f"victim group {k!r}: kept {got.groups.get(k)} != recounted {want.groups.get(k)}")
    for p in want.pools:
        a, b = got.orders.get(p), want.orders.get(p)
        if a is None:
            errs.append(f"victim order for pool {p!r} missing")
            continue
        for name in PoolOrder._fields:
            x, y = getattr(a, name), getattr(b, name)
            if name == "n":
                x = {k: v for k, v in x.items() if len(v)}
                y = {k: v for k, v in y.items() if len(v)}
            if x != y:
                errs.append(f"victim order {p!r}.{name}: kept {x!r} != ranked from scratch {y!r}")
    if got.hord != want.hord:
        errs.append(f"Host victim order: kept {list(got.hord)[:4]} != ranked from scratch {list(want.hord)[:4]}")
    if got.heat.owners != want.heat.owners or got.heat.seg != want.heat.seg:
        errs.append(f"reuse segment differs: kept {list(got.heat.seg)[:4]} != {list(want.heat.seg)[:4]}")
    if got.heat.billed != want.heat.billed:
        keys = [k for k in set(got.heat.billed.keys()) | set(want.heat.billed.keys())
                if got.heat.billed.get(k) != want.heat.billed.get(k)]
        errs.append(f"reuse footprint billing differs at objects {sorted(keys)[:5]}")
    if got.heat.fp != want.heat.fp:
        errs.append("reuse footprints differ")
    return errs


# -- queries -----------------------------------------------------------------------------------
def beyond_target(vi: VictimIndex, state) -> tuple[frozenset, int]:
    """HEAT-4, RD-5: the reuse-tier owners past the soft target (as `evidence.beyond_target`)
    and how many owners are in the segment; chunk sums skip the owners that cannot cross."""
    seg = vi.heat.seg
    if not seg.size:
        return frozenset(), 0
    num, den = SOFT_TARGET
    targets = [state.pools[p].spec.capacity * num // den for p in vi.pools] + [state.arena.capacity * num // den]
    n = len(targets)
    used = [0] * n
    i = 0
    cut = None
    for agg, chunk in seg.chunk_view():
        if all(used[k] + agg[k] <= targets[k] for k in range(n)):
            for k in range(n):
                used[k] += agg[k]
            i += len(chunk)
            continue
        for it in chunk:
            add = it[2]
            if i > 0 and any(add[k] and used[k] + add[k] > targets[k] for k in range(n)):
                cut = i
                break
            for k in range(n):
                used[k] += add[k]
            i += 1
        if cut is not None:
            break
    if cut is None:
        return frozenset(), seg.size
    out = []
    j = 0
    for it in seg:
        if j >= cut:
            out.append(it[1])
        j += 1
    return frozenset(out), cut


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

    Kept in `vi.leads` (one dict all versions of an index share) as (`dem` entry, the point's
    pages, lead, exact?), and read only while both are the very same objects: every change of
    one of the point's objects into or out of Device-only rewrites that entry (`_dem_count`,
    the re-key in `finish`), so versions sharing it agree on the point's Device-only pages, and
    a point's pages are one tuple for its life (`Checkpoint.kv`). A change that only took
    Device-only objects away carries the lead to the new entry as a lower bound
    (`_Work._carry_leads`): the walk goes on from there, past the pages just demoted."""
    key = (pool, c.cid)
    d = vi.dem.get(key)
    leads = vi.leads
    if d is None or leads is None:
        return 0
    got = _kept_lead(vi, key, c)
    if got is not None and got[1]:
        return got[0]
    n = _past_moved(c, pool, vi.xrep, got[0] if got else 0)
    if len(leads) > 2 * len(vi.dem) + 4096:  # points deleted since: drop what they left behind
        live = vi.dem
        for k in [k for k in leads if k not in live]:
            del leads[k]
    leads[key] = (d, c.kv, n, True)
    return n


def _kept_lead(vi: VictimIndex, key, c):
    """(lead, exact?) kept for point c on index version `vi`, else None."""
    got = vi.leads.get(key) if vi.leads is not None else None
    if got is None or got[0] is not vi.dem.get(key) or got[1] is not c.kv:
        return None
    return got[2], got[3]


def _past_moved(c, pool: str, xrep, n: int) -> int:
    """`n` (pages known not to move) plus the pages after them, in walk order, before point c's
    first Device-only one."""
    xget = xrep.get
    for oid in pages_of(c, pool, KV_PAGES, n):
        if _device_only(xget(oid)):
            break
        n += 1
    return n


__all__ = ["VictimIndex", "Group", "PoolOrder", "Heat", "empty", "build", "change", "sync", "compare",
           "beyond_target", "BIG", "HOST", "pages_of", "lead"]
