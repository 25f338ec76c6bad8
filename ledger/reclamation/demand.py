"""Demand evidence and tiers (HEAT-1..4, RD-9), which reclamation prices content by. The demand
summary keeps at most 256 items (`SUMMARY_ITEMS`) for save-opportunity positions (RD-9: exact
position key, frontier, the requests that really observed it, the time it became repeated demand;
the least recently observed item goes when full); it holds no State/KV and never counts as a hit
(HEAT-3). Observations come only from a successful cross-request adoption of a non-zero source
(`observe_adoption`, HEAT-2) and a new prefill commit crossing a candidate position, once per
request and position (`observe_prefill`, HEAT-2); two different requests make repeated demand even
when no copy existed, and queries, waits, saves, migrations, completions and a request's own
Snapshot/Replay produce none (HEAT-3, WAIT-1). `beyond_target` / `rebalance_tiers`: the reuse
segment, newest real demand first, billed by unique physical footprint per pool against 3/4 of
the pool (HEAT-4, RD-5), older owners demoted to normal (a tier demotion, RD-4); a single newest
owner may exceed the target. Tier decides reclamation order only, so the segment is evaluated
where reclamation looks at it (a quote) instead of on every bind: a bind stays cheap however large
the cache. Every tier or demand change re-keys the victim index (`index_sync.change`).
"""
from __future__ import annotations

from typing import Hashable, Iterable

from ledger import prefix_index as px
from ledger.cache_state import SUMMARY_ITEMS, ActiveUse, CacheState, SummaryItem, Tier
from ledger.identity import InputIdentity
from ledger.reclamation.index_build import beyond_target as index_beyond_target
from ledger.reclamation.index_sync import change, sync
from ledger.reclamation.pricing import beyond_target_reference
from ledger.state import LedgerState


def position_key(ident: InputIdentity) -> tuple:
    """Exact key of a position: frontier, last block digest, the tail tokens, media, execution."""
    n = len(ident.tokens)
    k = len(ident.blocks)
    return (n, ident.blocks[-1] if k else b"", ident.tokens[k * 64:], ident.media, ident.execution)


def _observe(cache: CacheState, ident: InputIdentity, request: Hashable, now: int,
             repeated: bool = False) -> tuple[CacheState, int]:
    """Record one real observation; returns the new cache and the item's repeated-demand time.
    `repeated`: the observation itself proves repeated demand (a cross-request adoption)."""
    key = position_key(ident)
    summary = cache.summary
    item = summary.get(key)
    if item is None:
        if len(summary) >= SUMMARY_ITEMS:  # RD-9: drop the least recently observed
            least = min(i.seen for i in summary.values())  # ties by key text, formatted only for ties
            oldest = min((i for i in summary.values() if i.seen == least), key=lambda i: repr(i.key))
            summary = summary.delete(oldest.key)
        item = SummaryItem(key, len(ident.tokens), frozenset((request,)), now if repeated else 0, now)
    elif repeated:
        item = item._replace(requests=frozenset(list(item.requests)[-1:]) | {request}, demand_time=now, seen=now)
    elif request in item.requests:
        item = item._replace(seen=now)
    else:  # HEAT-2: a second request's real observation proves repeated demand
        keep = frozenset(list(item.requests)[-1:]) | {request}
        item = item._replace(requests=keep, demand_time=now, seen=now)
    return cache._replace(summary=summary.set(key, item)), item.demand_time


def demand_time_at(cache: CacheState, ident: InputIdentity) -> int:
    """The position's own repeated-demand time (RCL-9), 0 if none."""
    item = cache.summary.get(position_key(ident))
    return item.demand_time if item is not None else 0


def observe_prefill(cache: CacheState, request: Hashable, ident: InputIdentity, lo: int, hi: int,
                    candidates: Iterable[int]) -> CacheState:
    """HEAT-2: a new prefill commit covering (lo, hi] crossed these candidate positions.

    Compute demand is recorded once per request and position (the request's `observed` set);
    Replay of a paused request is not new prefill and must not be reported (PAUSE-5)."""
    use = cache.active.get(request)
    seen = use.observed if use is not None else frozenset()
    now = cache.clock + 1
    changed = False
    for f in sorted(set(candidates)):
        if lo < f <= hi and f not in seen and 0 < f <= len(ident.tokens):
            cache, t = _observe(cache, ident.prefix(f), request, now)
            seen = seen | {f}
            changed = True
            if t == now:
                cache = _promote_points_at(cache, ident.prefix(f), now)
    if not changed:
        return cache
    if use is not None:
        cache = cache._replace(active=cache.active.set(request, use._replace(observed=seen)))
    return cache._replace(clock=now)


def _promote_points_at(cache: CacheState, ident: InputIdentity, now: int) -> CacheState:
    """A checkpoint already kept at a position that just became repeated demand carries that
    demand time as its own (RCL-9)."""
    for cid in tuple(px.same(cache.index, ident)):
        c = cache.checkpoints[cid]
        if c.identity == ident:
            cache = cache._replace(checkpoints=cache.checkpoints.set(cid, c._replace(demand_time=now)))
    return cache


def observe_adoption(cache: CacheState, request: Hashable, cid: int, now: int, *, own: bool) -> CacheState:
    """HEAT-1/2: a real adoption of checkpoint `cid` by `request` at time `now`.

    Cross-request adoption of a non-zero source records repeated demand at that exact position
    and resets the adopted owner's pair; a request's own snapshot (`own`) records nothing."""
    c = cache.checkpoints.get(cid)
    if c is None or own or c.frontier == 0:
        return cache
    cache, _ = _observe(cache, c.identity, request, now, repeated=True)
    cache = cache._replace(checkpoints=cache.checkpoints.set(cid, c._replace(demand_time=now)))
    kind, key = c.owner
    if kind == "shared":  # HEAT-1: shared use updates the shared entry alone
        e = cache.shared[key]
        cache = cache._replace(shared=cache.shared.set(key, e._replace(tier=Tier.REUSE, demand_time=now,
                                                                      proven_frontier=c.frontier)))
        cache = _rekey(cache, (c.owner,))
    return cache


def _rekey(cache: CacheState, owners) -> CacheState:
    """The victim order and reuse footprint follow the owners' new tier and demand (RCL-3/4, HEAT-4)."""
    if cache.victims is None:
        return cache
    return cache._replace(victims=change(cache.victims, cache, owners=owners))


def inherit_pair(record, source_frontier: int, now: int, *, consume: bool):
    """HEAT-1, RD-6: a Consume resets the owner's pair from this source; a Fork from the
    parent updates the parent only if the source covers the parent's proven position."""
    if consume or source_frontier >= record.proven_frontier:
        return record._replace(tier=Tier.REUSE, demand_time=now, proven_frontier=source_frontier)
    return record


def beyond_target(state: LedgerState, cache: CacheState) -> frozenset:
    """HEAT-4, RD-5: the reuse-tier owners that fall outside the reuse segment: walking owners
    newest real demand first and billing each one's unique physical footprint per pool (an
    object shared with newer owners is billed once), the first owner that would push a pool past
    3/4 of its capacity and every older one. The single newest owner may exceed the target.

    Read from the cache's incrementally billed segment (the victim index: per-chunk footprint
    sums, no walk); `pricing.beyond_target_reference` recomputes it."""
    if cache.victims is not None:
        return index_beyond_target(sync(cache.victims, state, cache), state)[0]
    return beyond_target_reference(state, cache)


def demote_tiers(cache: CacheState, owners) -> CacheState:
    """RD-4: a tier demotion (reuse -> normal); nothing moves."""
    done = []
    for kind, key in owners:
        if kind == "rec" and key in cache.records:
            cache = cache._replace(records=cache.records.set(key, cache.records[key]._replace(tier=Tier.NORMAL)))
            done.append((kind, key))
        elif kind == "shared" and key in cache.shared:
            cache = cache._replace(shared=cache.shared.set(key, cache.shared[key]._replace(tier=Tier.NORMAL)))
            done.append((kind, key))
    return _rekey(cache, done) if done else cache


def rebalance_tiers(state: LedgerState, cache: CacheState) -> CacheState:
    """HEAT-4: demote the reuse-tier owners beyond the soft target. Tiers only matter to
    reclamation, so quotes evaluate this themselves (and `plan_reclaim` records it); an engine
    may also call it when idle."""
    return demote_tiers(cache, beyond_target(state, cache))


def active_use(cache: CacheState, request: Hashable) -> ActiveUse | None:
    return cache.active.get(request)
