"""The victim index: the RCL-4/RD-8 victim order and the HEAT-4 reuse footprint as pure,
persistent data (the `victims` field of `CacheState`), so that a quote takes its k picks in
O(k log n) instead of walking every checkpoint. This module holds only the shapes — `VictimIndex`
and its parts (`Group`, `PoolOrder`, `ReuseSegment`), the per-chunk summaries its sorted orders
keep, `IndexMemo` (the memo one index lineage owns), `LazyMap` (a batch's working copy of one of
its maps) — and `empty`; the keys are computed in index_keys.py, the whole index from first
principles in index_build.py, and every later version from the previous one and the cache's
changes (a plan's diff) in index_batch.py, index_walk.py, index_billing.py, index_groups.py,
index_rekey.py and index_sync.py.
"""
from __future__ import annotations

from bisect import bisect_left
from typing import NamedTuple

import immutables

from ledger import ptrie
from ledger.psorted import PSorted

BIG = 8  # groups of more points are ranked by a bound (their points' own losses), exact at quote time
INF = 1 << 62  # a large group's frees bound: the gap always caps its useful amount
WIDE = 65  # frees buckets 1..64 exact; larger groups (and groups of more than BIG points) share one
EMPTY_MAP = immutables.Map()
NO_HOLDERS = frozenset()
EMPTY_ORDER = PSorted()

# The names of a pool's stored orders (`PoolOrder` fields); an item of the normal tier is filed
# under ("normal", bucket), the bucket being the units its group frees (1..64, WIDE).
NORMAL, REUSE, DEMOTE_NORMAL, DEMOTE_REUSE, DUPLICATES = "normal", "reuse", "demote_normal", "demote_reuse", \
    "duplicates"


class ChunkSummary:
    """A per-chunk summary of PSorted items: `of(chunk)`, and `add(summary, item)` for an item
    joining the chunk (no recount)."""

    __slots__ = ("of", "add", "__name__")

    def __init__(self, of, add, name):
        self.of, self.add, self.__name__ = of, add, name

    def __call__(self, chunk):
        return self.of(chunk)


def _footprint_sums_of(chunk):
    width = len(chunk[0][2])
    return tuple(sum(it[2][k] for it in chunk) for k in range(width))


LEAST_LOSS = ChunkSummary(lambda c: min(it[2] for it in c), lambda a, it: a if a <= it[2] else it[2], "least loss")
FARTHEST_REACHES = ChunkSummary(
    lambda c: (max(it[2] for it in c), max(it[3] for it in c)),
    lambda a, it: (a[0] if a[0] >= it[2] else it[2], a[1] if a[1] >= it[3] else it[3]), "farthest reaches")
FOOTPRINT_SUMS = ChunkSummary(_footprint_sums_of, lambda a, it: tuple(x + y for x, y in zip(a, it[2])),
                              "footprint sums")


class Group(NamedTuple):
    """The objects of one pool held by exactly one set of cache holders (`("ckpt", cid)`,
    `("wait", request)`), as RCL-1 groups them: one deletion action per holder set."""

    members: frozenset  # object ids of the pool held by exactly this holder set
    live: int  # members with a complete Device replica and no complete Host one
    frees: int  # live members of every group within this holder set (ordinary groups)
    items: tuple  # ((order name, item), ...) this group keeps in the pool order
    hot: frozenset  # RCL-3: owners that protect it as hot content (none beyond the target)
    special: bool  # a waiter, a pause snapshot or a waiter's own point holds it (WAIT-2, PAUSE-4, SCH-4)


class PoolOrder(NamedTuple):
    """The stored orders of one Device pool, each ascending by a lower bound of the RCL-4/RD-8 key
    parts that do not depend on the gap. Normal-tier groups sit in buckets by the units they free
    (for a gap g the useful amount of bucket f is min(f, g), one divisor per bucket, so each bucket
    is already in ratio order and a quote merges the buckets); a group of more than BIG points
    keeps a bound only (the sum of its points' own losses, frees capped by the gap). Demotion
    candidates (RCL-6) carry their `reach`: below that gap their objects surely go to the groups of
    the points listing them first in walk order."""

    normal: immutables.Map  # normal tier, by frees: bucket (1..64, WIDE) -> PSorted (loss, demand, cids, frees)
    reuse: PSorted  # reuse tier: (demand, cids, loss)
    demote_normal: PSorted  # demotion candidates, normal: (demand, cid, reach, wide reach)
    demote_reuse: PSorted  # demotion candidates, reuse: (demand, cid, reach, wide reach)
    duplicates: PSorted  # listed objects with complete Device and Host replicas (HOST-1/RCL-6): (oid,)
    held: int  # listed objects with a complete Device replica (no quote can free more)


class ReuseSegment(NamedTuple):
    """HEAT-4: the reuse-tier owners newest real demand first, each object billed once to the
    newest owner holding it, each owner's billed footprint per pool and Host bytes, with per-chunk
    sums, so the first owner past 3/4 of a pool is found without a walk."""

    owners: immutables.Map  # reuse-tier owner -> its item (-demand, owner, footprint vector)
    newest_first: PSorted  # the segment's items, newest real demand first
    footprints: immutables.Map  # owner -> frozenset of its objects
    billed: immutables.Map  # oid -> (owner billed, pool)


class IndexMemo:
    """What one index lineage remembers between its versions, owned by the index (so by the cache
    state that holds it: two caches never share one).

    `wide_sets`: facts of holder sets wider than BIG (a page every history shares: thousands of
    holders), so that a change adding or removing one holder costs no walk over the others. Each
    entry is (points, sorted cids, parent set, holder, sign): derived from the set it was made from
    by one holder (`derive_wide`), or counted once. Bounded: cleared past `WIDE_SETS_MAX`.
    `leads`: (pool, cid) -> (demotion entry, the point's kv, lead, exact?), the cache of
    `index_keys.lead`, valid while the entry is the very object a version holds."""

    __slots__ = ("wide_sets", "leads")
    WIDE_SETS_MAX = 4096

    def __init__(self):
        self.wide_sets: dict = {}
        self.leads: dict = {}

    def __eq__(self, other) -> bool:  # a memo is no part of what an index holds
        return isinstance(other, IndexMemo)

    def __hash__(self) -> int:
        return 0

    def wide_facts(self, hs) -> tuple:
        got = self.wide_sets.get(hs)
        if got is None:
            cids = tuple(sorted(h[1] for h in hs if h[0] == "ckpt"))
            got = self._remember(hs, (len(cids), cids, None, None, 0))
        return got

    def _remember(self, hs, facts: tuple) -> tuple:
        if len(self.wide_sets) >= self.WIDE_SETS_MAX:
            self.wide_sets.clear()
        self.wide_sets[hs] = facts
        return facts

    def width(self, hs) -> int:
        """How many points a holder set has (its waiters aside); exact only when it matters (> BIG)."""
        n = len(hs)
        return n if n <= BIG else self.wide_facts(hs)[0]

    def point_ids(self, hs) -> tuple:
        """The sorted checkpoint ids of a holder set."""
        if len(hs) > BIG:
            return self.wide_facts(hs)[1]
        return tuple(sorted(h[1] for h in hs if h[0] == "ckpt"))

    def derive_wide(self, old, new, holder, sign: int) -> None:
        """`new` is `old` with `holder` added (sign > 0) or removed: its points from old's."""
        if len(old) <= BIG or len(new) <= BIG or new in self.wide_sets:
            return
        n, cids = self.wide_facts(old)[:2]
        if holder[0] == "ckpt":
            i = bisect_left(cids, holder[1])
            if sign > 0:
                n, cids = n + 1, cids[:i] + (holder[1],) + cids[i:]
            else:
                n, cids = n - 1, cids[:i] + cids[i + 1:]
        self._remember(new, (n, cids, old, holder, sign))

    def wide_parent(self, hs):
        """(parent set, holder, sign) if `hs` was derived from a set by one holder, else None."""
        got = self.wide_sets.get(hs)
        return got[2:] if got is not None and got[2] is not None else None


class VictimIndex(NamedTuple):
    """Per Device pool, what a reclamation walk finds (all persistent: every version of the cache
    keeps its own). *Ordinary* groups (only indexed points: records' and shared entries') are
    ranked in `orders`; groups with a waiter, a pause snapshot or a point kept only by a waiter
    depend on the applicant and are few: listed in `special_groups`, ranked by the quote itself.
    Leases, pins, active writers, the applicant's protected objects and unknown holders are
    checked only when a quote takes an entry: such an entry yields less (its true key is larger
    than the stored one, never smaller) or nothing. `build` recounts it all; `check_cache` compares."""

    pools: tuple  # Device pool ids (config order); footprint vectors: pools + Host
    replica_exceptions: ptrie.Trie  # the ledger's replica exceptions (`LedgerState.xrep`) this index reflects
    holder_sets: immutables.Map  # oid -> frozenset of cache holders
    object_pool: immutables.Map  # oid -> its pool
    groups: immutables.Map  # (pool, holder set) -> Group
    groups_by_point: immutables.Map  # (pool, cid) -> frozenset of the holder sets with that point (up to BIG)
    wide_groups: immutables.Map  # pool -> frozenset of the holder sets of more than BIG points
    special_groups: immutables.Map  # pool -> frozenset of special holder sets
    orders: immutables.Map  # pool -> PoolOrder
    demotions: immutables.Map  # (pool, cid) -> (count of Device-only objects, (order name, item) | None)
    point_loss: immutables.Map  # cid -> its loss deleted alone (RCL-5): large groups' loss bound
    listers: immutables.Map  # oid -> the points listing it, in demotion walk order (when two or more)
    segment: ReuseSegment
    # Host gaps (HOST-1/2): ordinary holder sets with Host-only listed objects (any pool)
    host_only: immutables.Map = EMPTY_MAP  # holder set -> its listed objects with a complete Host replica only
    host_items: immutables.Map = EMPTY_MAP  # holder set -> (order item, hot owners, has a reuse-tier owner)
    host_order: PSorted = EMPTY_ORDER  # (stored tier, loss, demand, cids): a bound of the HOST-2 rank
    host_reuse: immutables.Map = EMPTY_MAP  # holder sets with a reuse-tier owner (a quote's HEAT-4 read)
    pending: tuple = ()  # cache changes not yet applied: (holders, cids, owners, pools) batches (`sync`)
    wide_objects: immutables.Map = EMPTY_MAP  # oid -> pool: shared objects listed by more than BIG points
    memo: IndexMemo | None = None  # what this lineage of versions remembers (wide sets, leads)


class LazyMap:
    """A working copy of a persistent map for one batch: read from its base until the first write
    makes a mutation of it; `finish()` is the new persistent map (the base itself if unwritten)."""

    __slots__ = ("base", "mutation")

    def __init__(self, base):
        self.base, self.mutation = base, None

    def get(self, k, d=None):
        return (self.base if self.mutation is None else self.mutation).get(k, d)

    def __contains__(self, k) -> bool:
        return k in (self.base if self.mutation is None else self.mutation)

    def __getitem__(self, k):
        return (self.base if self.mutation is None else self.mutation)[k]

    def __setitem__(self, k, v) -> None:
        if self.mutation is None:
            self.mutation = self.base.mutate()
        self.mutation[k] = v

    def __delitem__(self, k) -> None:
        if self.mutation is None:
            self.mutation = self.base.mutate()
        del self.mutation[k]

    def mut(self):
        """The mutation itself, for a loop that writes many keys (a context's pages)."""
        if self.mutation is None:
            self.mutation = self.base.mutate()
        return self.mutation

    def finish(self):
        return self.base if self.mutation is None else self.mutation.finish()


def empty_order() -> PoolOrder:
    return PoolOrder(EMPTY_MAP, PSorted(LEAST_LOSS), PSorted(FARTHEST_REACHES), PSorted(FARTHEST_REACHES),
                     PSorted(), 0)


def empty(state) -> VictimIndex:
    pools = tuple(p.pool_id for p in state.config.pools)
    orders = immutables.Map({p: empty_order() for p in pools})
    return VictimIndex(pools, state.xrep, EMPTY_MAP, EMPTY_MAP, EMPTY_MAP, EMPTY_MAP, EMPTY_MAP, EMPTY_MAP, orders,
                       EMPTY_MAP, EMPTY_MAP, EMPTY_MAP, ReuseSegment(EMPTY_MAP, PSorted(FOOTPRINT_SUMS), EMPTY_MAP,
                                                                     EMPTY_MAP), memo=IndexMemo())


def walk_key(cid: int) -> int:
    """The order demotions walk checkpoints in (RCL-6): a page several points hold joins the
    group of the first that still has room. It is creation order, oldest point first: relative,
    so a cache cleared and filled again walks exactly as a fresh one does (a schedule does not
    depend on how many ids came before)."""
    return cid
