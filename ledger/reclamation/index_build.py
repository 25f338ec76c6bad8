"""The victim index from first principles, and what it answers: `build(state, cache)` counts every
group, order, demotion candidate, Host entry and the HEAT-4 segment from the cache and the
ledger's objects (the first edit of a cache, a bulk edit, and `check_cache`, which `compare`s it
with the kept index); `beyond_target` reads the reuse-tier owners past the soft target from the
kept segment's chunk sums (HEAT-4, RD-5), as `pricing.beyond_target_reference` recounts them.
"""
from __future__ import annotations

import immutables

from ledger.cache_state import SOFT_TARGET, Tier
from ledger.psorted import from_sorted
from ledger.reclamation.index import (BIG, DEMOTE_NORMAL, DEMOTE_REUSE, DUPLICATES, FARTHEST_REACHES, FOOTPRINT_SUMS,
                                      LEAST_LOSS, NO_HOLDERS, REUSE, Group, IndexMemo, PoolOrder, ReuseSegment,
                                      VictimIndex, walk_key)
from ledger.reclamation.index_keys import (add_presence, ahead_map, demotion_key, footprint_objects, group_key,
                                           host_key, is_special, pool_objects, reach, replica_presence, single_loss)
from ledger.reclamation.pricing import stored_tier_pricing


def _holder_sets(cache) -> dict:
    """oid -> set of its cache holders (checkpoints and waiters)."""
    out: dict = {}
    for cid, c in cache.checkpoints.items():
        h = ("ckpt", cid)
        for oid in c.object_ids():
            out.setdefault(oid, set()).add(h)
    for req, wr in cache.waiters.items():
        h = ("wait", req)
        for oid in wr.objects:
            out.setdefault(oid, set()).add(h)
    return out


def _listers(cache, holder_sets: dict, object_pool: dict) -> dict:
    """oid -> (walk key, cid, objects ahead) of the points listing it, for objects with two or more."""
    listers, aheads = {}, {}
    for oid, hs in holder_sets.items():
        cids = [t[1] for t in hs if t[0] == "ckpt"]
        if len(cids) >= 2:
            pool = object_pool[oid]
            ent = []
            for c in cids:
                m = aheads.get((c, pool))
                if m is None:
                    m = aheads[(c, pool)] = ahead_map(cache.checkpoints[c], pool)
                ent.append((walk_key(c), c, m[oid]))
            listers[oid] = tuple(sorted(ent))
    return listers


def _segment(cache, objects, object_pool: dict, xrep, pools: tuple) -> ReuseSegment:
    """HEAT-4: owners newest real demand first, each object billed to the first that holds it."""
    pool_index = {p: i for i, p in enumerate(pools)}
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
        fp = footprint_objects(cache, points)
        fps[o] = fp
        vec = [0] * (len(pools) + 1)
        for oid in fp:
            if oid in billed:
                continue
            pool = objects[oid].pool if oid in objects else object_pool.get(oid)
            billed[oid] = (o, pool)
            add_presence(vec, pool_index, pool, xrep.get(oid))
        items.append(sig + (tuple(vec),))
    return ReuseSegment(immutables.Map({it[1]: it for it in items}), from_sorted(items, FOOTPRINT_SUMS),
                        immutables.Map({o: f for o, f in fps.items() if f}), immutables.Map(billed))


class _Counts:
    """The per-object counts of one build: groups' members and live counts, duplicates, held
    objects, Host-only counts and Device-only counts per point."""

    def __init__(self, state, holder_sets: dict, pools: tuple):
        objects, xrep = state.objects, state.xrep
        self.object_pool, self.members, self.live = {}, {}, {}
        self.duplicates = {p: [] for p in pools}
        self.held = dict.fromkeys(pools, 0)
        self.host_only, self.demotable = {}, {}
        for oid, hs in holder_sets.items():
            hs = frozenset(hs)
            holder_sets[oid] = hs
            pool = objects[oid].pool
            self.object_pool[oid] = pool
            if not any(t[0] == "ckpt" for t in hs):
                continue
            d, h, _ = replica_presence(xrep.get(oid))
            key = (pool, hs)
            self.members.setdefault(key, set()).add(oid)
            self.live[key] = self.live.get(key, 0) + (d == 2 and h != 2)
            if d == 2:
                self.held[pool] += 1
                if h == 2:
                    self.duplicates[pool].append((oid,))
            if h == 2 and d != 2:
                self.host_only[hs] = self.host_only.get(hs, 0) + 1
            if d and not h:
                for t in hs:
                    if t[0] == "ckpt":
                        self.demotable[(pool, t[1])] = self.demotable.get((pool, t[1]), 0) + 1


def build(state, cache) -> VictimIndex:
    """The whole index recomputed from the cache and the ledger's objects (check_cache, bulk)."""
    pools = tuple(p.pool_id for p in state.config.pools)
    memo = IndexMemo()
    holder_sets = _holder_sets(cache)
    counts = _Counts(state, holder_sets, pools)
    object_pool, members, live = counts.object_pool, counts.members, counts.live
    pricing = stored_tier_pricing(cache)
    point_loss = {cid: single_loss(cache, pricing, cid) for cid in cache.checkpoints.keys()}
    listers = _listers(cache, holder_sets, object_pool)
    by_point: dict = {}
    wide: dict = {}
    for (pool, hs) in members:
        if memo.width(hs) > BIG:
            wide.setdefault(pool, set()).add(hs)
            continue
        for t in hs:
            if t[0] == "ckpt":
                by_point.setdefault((pool, t[1]), set()).add(hs)
    batch_facts: dict = {}
    spec = {key: is_special(cache, key[1]) for key in members}
    groups = {}
    lists: dict = {p: {REUSE: [], DEMOTE_NORMAL: [], DEMOTE_REUSE: []} for p in pools}
    special: dict = {}
    for key, ms in members.items():
        pool, hs = key
        if spec[key]:
            special.setdefault(pool, set()).add(hs)
            groups[key] = Group(frozenset(ms), live[key], 0, (), NO_HOLDERS, True)
            continue
        frees = 0
        if memo.width(hs) <= BIG:  # the live members of every group within it (its own included)
            seen = set()
            for t in hs:
                for s in by_point.get((pool, t[1]), ()):
                    if s not in seen:
                        seen.add(s)
                        if s <= hs and not spec[(pool, s)]:
                            frees += live[(pool, s)]
        items, hot = group_key(cache, pricing, memo, hs, live[key], frees, point_loss, batch_facts)
        for name, it in items:
            lists[pool].setdefault(name, []).append(it)
        groups[key] = Group(frozenset(ms), live[key], frees, items, hot, False)
    demotions = {}
    for k, n in counts.demotable.items():
        c = cache.checkpoints[k[1]]
        want = demotion_key(cache, pricing, k[1], reach(k[1], pool_objects(c, k[0], object_pool), listers, state.xrep))
        demotions[k] = (n, want)
        if want is not None:
            lists[k[0]][want[0]].append(want[1])
    orders = {}
    for p in pools:
        ls = lists[p]
        buckets = {name[1]: from_sorted(sorted(v)) for name, v in ls.items() if isinstance(name, tuple) and v}
        orders[p] = PoolOrder(immutables.Map(buckets), from_sorted(sorted(ls[REUSE]), LEAST_LOSS),
                              from_sorted(sorted(ls[DEMOTE_NORMAL]), FARTHEST_REACHES),
                              from_sorted(sorted(ls[DEMOTE_REUSE]), FARTHEST_REACHES),
                              from_sorted(sorted(counts.duplicates[p])), counts.held[p])
    host_items = {hs: host_key(cache, pricing, memo, hs, point_loss) for hs in counts.host_only
                  if not is_special(cache, hs)}
    segment = _segment(cache, state.objects, object_pool, state.xrep, pools)
    return VictimIndex(pools, state.xrep, immutables.Map(holder_sets), immutables.Map(object_pool),
                       immutables.Map(groups), immutables.Map({k: frozenset(v) for k, v in by_point.items()}),
                       immutables.Map({p: frozenset(v) for p, v in wide.items() if v}),
                       immutables.Map({p: frozenset(v) for p, v in special.items() if v}), immutables.Map(orders),
                       immutables.Map(demotions), immutables.Map(point_loss), immutables.Map(listers),
                       segment, immutables.Map(counts.host_only), immutables.Map(host_items),
                       from_sorted(sorted(it[0] for it in host_items.values())),
                       immutables.Map({hs: None for hs, it in host_items.items() if it[2]}),
                       wide_objects=immutables.Map({o: object_pool[o] for o, w in listers.items() if len(w) > BIG}),
                       memo=memo)


_COMPARED = ("holder_sets", "object_pool", "groups_by_point", "wide_groups", "special_groups", "demotions",
             "point_loss", "listers", "host_only", "host_items", "host_reuse", "wide_objects")


def compare(got: VictimIndex, want: VictimIndex) -> list[str]:
    """What differs between a kept index and one built from first principles."""
    errs = []
    if got.pools != want.pools:
        errs.append(f"victim index pools {got.pools} != {want.pools}")
    for name in _COMPARED:
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
            if name == "normal":
                x = {k: v for k, v in x.items() if len(v)}
                y = {k: v for k, v in y.items() if len(v)}
            if x != y:
                errs.append(f"victim order {p!r}.{name}: kept {x!r} != ranked from scratch {y!r}")
    if got.host_order != want.host_order:
        errs.append(f"Host victim order: kept {list(got.host_order)[:4]} != ranked from scratch "
                    f"{list(want.host_order)[:4]}")
    seg_got, seg_want = got.segment, want.segment
    if seg_got.owners != seg_want.owners or seg_got.newest_first != seg_want.newest_first:
        errs.append(f"reuse segment differs: kept {list(seg_got.newest_first)[:4]} != "
                    f"{list(seg_want.newest_first)[:4]}")
    if seg_got.billed != seg_want.billed:
        keys = [k for k in set(seg_got.billed.keys()) | set(seg_want.billed.keys())
                if seg_got.billed.get(k) != seg_want.billed.get(k)]
        errs.append(f"reuse footprint billing differs at objects {sorted(keys)[:5]}")
    if seg_got.footprints != seg_want.footprints:
        errs.append("reuse footprints differ")
    return errs


def beyond_target(vi: VictimIndex, state) -> tuple[frozenset, int]:
    """HEAT-4, RD-5: the reuse-tier owners past the soft target (as
    `pricing.beyond_target_reference`) and how many owners are in the segment; chunk sums skip
    the owners that cannot cross."""
    seg = vi.segment.newest_first
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
