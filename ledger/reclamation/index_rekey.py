"""Closing a batch of index changes, part two, and the whole close (`finish_batch`): after the groups
(index_groups.py), the demotion candidates whose count or key moved are re-keyed (RCL-6: tier,
demand, reach past the pages that cannot move, `lead`), the Host order follows the holder sets
whose Host-only count or point facts moved (HOST-1/2), and the next persistent `VictimIndex` is
assembled from the working copies: the pools' orders, the special and wide sets, the HEAT-4
segment the batch re-billed, and the same memo (one lineage).
"""
from __future__ import annotations

from ledger.reclamation.index import (DEMOTE_NORMAL, DEMOTE_REUSE, DUPLICATES, REUSE, LazyMap, PoolOrder,
                                      VictimIndex)
from ledger.reclamation.index_groups import GroupsDraft, close_groups
from ledger.reclamation.index_keys import demotion_key, host_key, kept_lead, pages_of, past_moved, pool_objects, reach
from ledger.state import KV_PAGES


def finish_batch(batch) -> VictimIndex:
    """The new (persistent) index from an `IndexBatch` that heard all its changes."""
    draft = close_groups(batch)
    rekey_demotions(batch)
    carry_leads(batch)
    host_items, host_reuse, host_order = rekey_host_order(batch, draft)
    vi = batch.index
    return VictimIndex(vi.pools, batch.replica_exceptions, batch.holder_sets.finish(), batch.object_pool.finish(),
                       draft.groups.finish(), draft.groups_by_point.finish(),
                       _set_map(vi.wide_groups, draft.wide), _set_map(vi.special_groups, draft.special),
                       _orders(batch), batch.demotions.finish(), draft.point_loss.finish(), batch.listers.finish(),
                       batch.billing.finish(), batch.host_only.finish(), host_items, host_order, host_reuse,
                       wide_objects=batch.wide_objects.finish(), memo=vi.memo)


def lead_now(batch, k, c) -> int:
    """`lead` of point c in pool k[0] on the version this change makes: on from the kept
    one when the point only lost Device-only objects here (a lower bound), else from its
    first page."""
    got = None if k in batch.gained else kept_lead(batch.index, k, c)
    return past_moved(c, k[0], batch.replica_exceptions, got[0] if got else 0)


def carry_leads(batch) -> None:
    """A point that only lost Device-only objects in this change keeps its `lead` as a
    lower bound: what came before its first Device-only page still does not move."""
    memo = batch.memo
    if memo is None or not memo.leads:
        return
    leads, base = memo.leads, batch.index.demotions
    for k in batch.dirty_demotions:
        if k in batch.gained:
            continue
        got = leads.get(k)
        if got is None or got[0] is not base.get(k):
            continue
        new = batch.demotions.get(k)
        if new is not None:
            leads[k] = (new, got[1], got[2], False)


def rekey_demotions(batch) -> None:
    """Demotion candidates whose count moved: re-keyed when their key may have moved, dropped
    when no Device-only object is left (RCL-6)."""
    cache, demotions = batch.cache, batch.demotions
    pricing = batch.pricing if cache is not None else None
    leads = batch.memo.leads if batch.memo is not None else None
    for k in batch.dirty_demotions:
        cur = demotions.get(k)
        if cur is None:
            continue
        n, stored = cur
        if n > 0 and stored is not None and k not in batch.dirty_demotion_keys:
            continue  # only its count moved (its key is the point's and its owner's)
        want = lead = None
        if n > 0 and k[1] in cache.checkpoints:
            c = cache.checkpoints[k[1]]
            if any(p == k[0] for p, _ in c.kv):  # reach does not depend on the order: read
                lead = lead_now(batch, k, c)  # the walk past the lead, which cannot move
                objs = pages_of(c, k[0], KV_PAGES, lead)
            else:
                objs = pool_objects(c, k[0], batch.object_pool)
            want = demotion_key(cache, pricing, k[1], reach(k[1], objs, batch.listers, batch.replica_exceptions))
        if want != stored:
            pool = k[0]
            if stored is not None:
                batch.put_order(pool, stored[0], batch.order(pool, stored[0]).remove(stored[1]))
            if want is not None:
                batch.put_order(pool, want[0], batch.order(pool, want[0]).add(want[1]))
        if n <= 0:
            del demotions[k]
        else:
            demotions[k] = new = (n, want)
            if lead is not None and leads is not None:
                leads[k] = (new, c.kv, lead, True)


def rekey_host_order(batch, draft: GroupsDraft) -> tuple:
    """5b. The Host order (HOST-1/2): holder sets whose Host-only count or point facts moved.
    Returns the new host items, host reuse sets and Host order."""
    vi, cache, groups = batch.index, batch.cache, draft.groups
    host_items, host_reuse, host_only = LazyMap(vi.host_items), LazyMap(vi.host_reuse), batch.host_only
    removed, added = [], []
    facts_moved = {k[1] for k in batch.dirty_group_points}  # loss, tier, demand or special status
    for hs in (batch.host_dirty | facts_moved) if cache is not None else ():
        old = host_items.get(hs)
        if hs not in facts_moved and (old is not None) == (host_only.get(hs, 0) > 0):
            continue  # only its count moved: the item holds no count
        new = None
        if host_only.get(hs, 0) > 0 and not any(groups.get((p, hs)) is not None and groups[(p, hs)].special
                                                 for p in vi.pools):
            new = host_key(cache, batch.pricing, batch.memo, hs, draft.point_loss)
        if new == old:
            continue
        if old is not None:
            removed.append(old[0])
        if new is not None:
            added.append(new[0])
            host_items[hs] = new
        else:
            del host_items[hs]
        if new is not None and new[2]:
            host_reuse[hs] = None
        elif hs in host_reuse:
            del host_reuse[hs]
    host_order = vi.host_order.update(removed, added) if removed or added else vi.host_order
    return host_items.finish(), host_reuse.finish(), host_order


def _orders(batch):
    """6. The pools' orders with the batch's changed orders and held counts."""
    orders = batch.index.orders
    if not (batch.order_work or batch.held_delta):
        return orders
    for pool in set(batch.order_work) | set(batch.held_delta):
        po = orders[pool]
        normal, reuse, demote_normal, demote_reuse, duplicates = \
            po.normal, po.reuse, po.demote_normal, po.demote_reuse, po.duplicates
        for name, o in batch.order_work.get(pool, {}).items():
            if name.__class__ is tuple:
                bucket = name[1]
                normal = normal.set(bucket, o) if len(o) else (normal.delete(bucket) if bucket in normal else normal)
            elif name == REUSE:
                reuse = o
            elif name == DEMOTE_NORMAL:
                demote_normal = o
            elif name == DEMOTE_REUSE:
                demote_reuse = o
            elif name == DUPLICATES:
                duplicates = o
        orders = orders.set(pool, PoolOrder(normal, reuse, demote_normal, demote_reuse, duplicates,
                                            po.held + batch.held_delta.get(pool, 0)))
    return orders


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
