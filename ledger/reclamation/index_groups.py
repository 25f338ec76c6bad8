"""Closing a batch of index changes, part one: the groups (RCL-1, RCL-3..5). From the batch's
working counts, `close_groups` brings each point's own loss up to date (the bound of groups wider
than BIG), applies the groups' new members (creating and dropping groups and their entries in the
point and wide lists), settles which groups are special (WAIT-2, PAUSE-4, SCH-4), moves every
ordinary group's `frees` by its subgroups' changes, and re-keys the groups whose items moved in
their pool orders. A wide group made from a kept one by a few holders inherits its flag and bound
through the index memo's derivations, without a walk over its thousands of points.
"""
from __future__ import annotations

from ledger.reclamation.index import BIG, INF, NO_HOLDERS, NORMAL, WIDE, Group, LazyMap
from ledger.reclamation.index_keys import group_key, is_special, single_loss, special_holder


class GroupsDraft:
    """The groups of the index being closed: working copies of `groups`, `groups_by_point` and
    `point_loss`, the changed pools' special and wide holder sets, each point's change of loss
    (`loss_delta`) and the groups counted from scratch (`fresh`)."""

    def __init__(self, batch):
        vi = batch.index
        self.batch = batch
        self.groups = LazyMap(vi.groups)
        self.groups_by_point = LazyMap(vi.groups_by_point)
        self.point_loss = LazyMap(vi.point_loss)
        self.special: dict = {}  # pool -> set of special holder sets (pools changed only)
        self.wide: dict = {}  # pool -> set of holder sets wider than BIG (pools changed only)
        self.loss_delta: dict = {}
        self.fresh: set = set()

    def special_set(self, pool) -> set:
        got = self.special.get(pool)
        if got is None:
            got = self.special[pool] = set(self.batch.index.special_groups.get(pool, NO_HOLDERS))
        return got

    def wide_set(self, pool) -> set:
        got = self.wide.get(pool)
        if got is None:
            got = self.wide[pool] = set(self.batch.index.wide_groups.get(pool, NO_HOLDERS))
        return got


def close_groups(batch) -> GroupsDraft:
    draft = GroupsDraft(batch)
    update_point_losses(batch, draft)
    created, deltas = apply_members(batch, draft)
    settle_special(batch, draft, created)
    move_frees(batch, draft, created, deltas)
    rekey_groups(batch, draft)
    return draft


def update_point_losses(batch, draft: GroupsDraft) -> None:
    """1. The points' own losses (RCL-5), for the large groups' bounds."""
    cache, point_loss = batch.cache, draft.point_loss
    if batch.dirty_cids and cache is not None:
        pricing = batch.pricing
        for cid in batch.dirty_cids:
            old, new = point_loss.get(cid), single_loss(cache, pricing, cid)
            if old != new:
                draft.loss_delta[cid] = (new or 0) - (old or 0)
                if new is None:
                    del point_loss[cid]
                else:
                    point_loss[cid] = new


def _unlist_point_sets(draft: GroupsDraft, pool, hs) -> None:
    by_point = draft.groups_by_point
    for h in hs:
        if h[0] == "ckpt":
            k = (pool, h[1])
            left = by_point.get(k, NO_HOLDERS) - {hs}
            if left:
                by_point[k] = left
            else:
                del by_point[k]


def apply_members(batch, draft: GroupsDraft) -> tuple[list, list]:
    """2. Groups whose members changed: dropped, created or updated. Returns the groups created
    and the live-count changes of ordinary groups ((pool, holder set), delta)."""
    groups, by_point, memo = draft.groups, draft.groups_by_point, batch.memo
    created, deltas = [], []
    for key, (members, live, old_live) in batch.group_work.items():
        pool, hs = key
        g = groups.get(key)
        wide = memo.width(hs) > BIG
        if not members:
            if g is not None:
                batch.drop_items(pool, g.items)
                if g.special:
                    draft.special_set(pool).discard(hs)
                del groups[key]
                if wide:
                    draft.wide_set(pool).discard(hs)
                else:
                    _unlist_point_sets(draft, pool, hs)
                    if not g.special and old_live:
                        deltas.append((key, -old_live))
            batch.dirty_groups.discard(key)
            continue
        if g is None:
            groups[key] = Group(frozenset(members), live, 0, (), NO_HOLDERS, False)
            if wide:
                draft.wide_set(pool).add(hs)
            else:
                for h in hs:
                    if h[0] == "ckpt":
                        k = (pool, h[1])
                        by_point[k] = by_point.get(k, NO_HOLDERS) | {hs}
            created.append(key)
            batch.dirty_groups.add(key)
        else:
            groups[key] = g._replace(members=frozenset(members), live=live)
            if live != old_live:
                if not g.special and not wide:
                    deltas.append((key, live - old_live))
                batch.dirty_groups.add(key)
    return created, deltas


def settle_special(batch, draft: GroupsDraft, created: list) -> None:
    """3. Special status (a point kept only by a waiter makes every group with it special)."""
    groups, cache, memo = draft.groups, batch.cache, batch.memo
    fresh = draft.fresh
    fresh.update(created)
    for key in batch.dirty_groups:
        if key not in fresh and key not in batch.dirty_group_points:
            continue  # only its counts moved: same holders, same points
        g = groups.get(key)
        if g is None:
            continue
        pool, hs = key
        derived = wide_special(batch, pool, hs) if key in fresh else None
        if derived is not None:
            special_now = derived
        elif key in fresh or memo.width(hs) <= BIG:
            special_now = is_special(cache, hs)
        else:  # a large group: only its changed points can have become special
            special_now = g.special or any(special_holder(cache, ("ckpt", c)) for c in batch.dirty_cids
                                           if ("ckpt", c) in hs)
        if special_now != g.special or (special_now and key in fresh):
            (draft.special_set(pool).add if special_now else draft.special_set(pool).discard)(hs)
            groups[key] = g._replace(special=special_now, frees=0)
            if not special_now:
                fresh.add(key)  # counted from scratch below


def move_frees(batch, draft: GroupsDraft, created: list, deltas: list) -> None:
    """4. Frees: existing ordinary groups move by their subgroups' deltas; new ones are counted."""
    groups, by_point, fresh, memo = draft.groups, draft.groups_by_point, draft.fresh, batch.memo
    for key in created:
        g = groups[key]
        if not g.special and g.live and memo.width(key[1]) <= BIG:
            deltas.append((key, g.live))
    for (pool, hs), d in deltas:
        for s in supersets(by_point, pool, hs) + [hs]:
            k = (pool, s)
            if k in fresh:
                continue
            g = groups.get(k)
            if g is None or g.special:
                continue
            groups[k] = g._replace(frees=g.frees + d)
            batch.dirty_groups.add(k)
    for key in fresh:
        g = groups.get(key)
        if g is not None and not g.special and memo.width(key[1]) <= BIG:
            groups[key] = g._replace(frees=count_frees(groups, by_point, key[0], key[1]))


def rekey_groups(batch, draft: GroupsDraft) -> None:
    """5. Re-key the dirty groups: their items in the pool orders and their hot owners."""
    cache, groups, memo = batch.cache, draft.groups, batch.memo
    point_loss, loss_delta, fresh = draft.point_loss, draft.loss_delta, draft.fresh
    pricing = batch.pricing if cache is not None else None
    batch_facts: dict = {}  # holder set -> its points' facts, shared by its pools and the Host order
    for key in batch.dirty_groups:
        g = groups.get(key)
        if g is None:
            continue
        pool, hs = key
        if g.special:
            items, hot = (), NO_HOLDERS
        elif len(g.items) == 1 and g.items[0][0] == (NORMAL, WIDE) and g.items[0][1][3] == INF and g.live \
                and key not in fresh:
            name, (bound, demand, cids, inf) = g.items[0]  # a large group: its bound moves by its points' changes
            bound += sum(loss_delta.get(c, 0) for c in batch.dirty_cids if ("ckpt", c) in hs)
            items, hot = ((name, (bound, demand, cids, inf)),), NO_HOLDERS
        else:
            bound = wide_bound(batch, pool, hs, point_loss, loss_delta) if key in fresh and g.live else None
            if bound is not None:  # a large group made from one the index kept, by a few holders
                items, hot = (((NORMAL, WIDE), (bound, 0, memo.point_ids(hs), INF)),), NO_HOLDERS
            else:
                items, hot = group_key(cache, pricing, memo, hs, g.live, g.frees, point_loss, batch_facts)
        if items != g.items:
            batch.drop_items(pool, g.items)
            for name, it in items:
                batch.put_order(pool, name, batch.order(pool, name).add(it))
        if items != g.items or hot != g.hot:
            groups[key] = g._replace(items=items, hot=hot)


# -- wide groups made from kept ones ------------------------------------------------------------
def wide_chain(batch, pool: str, hs):
    """A holder set wider than BIG made in this change from one the index keeps, by adding
    or removing a few holders: (that kept set, its group, [(holder, sign), ...]), else None."""
    steps = []
    cur = hs
    memo = batch.memo
    for _ in range(16):
        par = memo.wide_parent(cur)
        if par is None:
            return None
        cur, h, sign = par
        steps.append((h, sign))
        g = batch.index.groups.get((pool, cur))
        if g is not None:
            return (cur, g, steps) if memo.width(cur) > BIG else None
    return None


def wide_special(batch, pool: str, hs):
    """Is a new wide holder set special (WAIT-2, PAUSE-4), from the kept set it was made
    from: that one's flag, the holders added, and the points whose facts moved. None: count
    it (a special holder left, or no kept ancestor)."""
    got = wide_chain(batch, pool, hs) if batch.memo.width(hs) > BIG else None
    if got is None:
        return None
    _, g, steps = got
    if g.special and any(sign < 0 for _, sign in steps):
        return None
    cache = batch.cache
    return (g.special or any(sign > 0 and special_holder(cache, h) for h, sign in steps)
            or any(special_holder(cache, ("ckpt", c)) for c in batch.dirty_cids if ("ckpt", c) in hs))


def wide_bound(batch, pool: str, hs, point_loss, loss_delta):
    """The loss bound of a new wide group (the sum of its points' own losses, RCL-5) from
    the kept group it was made from: its bound, the moved losses of its points, the points
    added or removed. None: compute it."""
    got = wide_chain(batch, pool, hs) if batch.memo.width(hs) > BIG else None
    if got is None:
        return None
    ancestor, g, steps = got
    if g.special or len(g.items) != 1 or g.items[0][0] != (NORMAL, WIDE):
        return None
    bound = g.items[0][1][0] + sum(loss_delta.get(c, 0) for c in batch.dirty_cids if ("ckpt", c) in ancestor)
    for h, sign in steps:
        if h[0] == "ckpt":
            bound += sign * (point_loss.get(h[1]) or 0)
    return bound


def supersets(by_point, pool, hs) -> list:
    """Groups (up to BIG points) strictly containing holder set `hs`."""
    best = None
    for h in hs:
        if h[0] == "ckpt":
            s = by_point.get((pool, h[1]), NO_HOLDERS)
            if best is None or len(s) < len(best):
                best = s
    return [s for s in (best or ()) if s != hs and s > hs]


def count_frees(groups, by_point, pool, hs) -> int:
    """Live members of every group whose holder set lies within `hs` (its own included)."""
    seen, total = set(), 0
    for h in hs:
        if h[0] != "ckpt":
            continue
        for s in by_point.get((pool, h[1]), ()):
            if s in seen:
                continue
            seen.add(s)
            if s <= hs:
                g = groups.get((pool, s))
                if g is not None and not g.special:
                    total += g.live
    return total
