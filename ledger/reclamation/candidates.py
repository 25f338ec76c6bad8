"""The finite action set of a reclamation, enumerated from the objects' real holders (RCL-1, RCL-8,
WAIT-2, PAUSE-4, HOST-1): which holders an applicant may drop (`optional_holder`, `holders_ok`,
`may_migrate`), and `enumerate_actions`, every deletion of a group of checkpoints (with what it
frees: its objects and its subgroups'), and every duplicate-replica drop, for one gap — the
reference's walk over every candidate object, and the exact evaluation a quote through the victim
index runs on the few groups it reaches. Demotions (RCL-6) are added by the reference quote.
"""
from __future__ import annotations

from ledger.cache_state import CacheState, PointKind, Tier
from ledger.reclamation.pricing import LossPricing
from ledger.reclamation.terms import Action, Applicant, ApplicantKind, Gap
from ledger.state import DEVICE, HOST, HOST_MEDIUM, KV_PAGES, LedgerState


def optional_holder(h, cache: CacheState, applicant: Applicant, revoked: list) -> bool:
    """May this holder's reference be dropped for this applicant? (RCL-8, WAIT-2, PAUSE-4)"""
    if h[0] == "ckpt":
        c = cache.checkpoints.get(h[1])
        if c is None:
            return False
        if c.owner[0] == "wait":  # a point only a waiter keeps goes only with that waiter
            return optional_holder(("wait", c.owner[1]), cache, applicant, revoked)
        if c.kind == PointKind.SNAPSHOT:
            if applicant.kind == ApplicantKind.NECESSARY and applicant.revoke_waiters:
                # SCH-4: pause snapshots are revoked on the same rung as waiters; WAIT-2: never
                # by fresh admission
                return not applicant.fresh
            if applicant.kind == ApplicantKind.SNAPSHOT and applicant.ticket is not None:
                use = cache.active.get(c.owner[1])
                return use is not None and use.publication_order > applicant.ticket
            return False
        return True
    if h[0] == "wait":
        w = cache.waiters.get(h[1])
        if w is None or not applicant.revoke_waiters:
            return False  # WAIT-2: optional writes never delete what a waiter holds
        if applicant.kind not in (ApplicantKind.NECESSARY,):
            return False
        if applicant.fresh and (w.paused or applicant.ticket is None or w.ticket <= applicant.ticket):
            return False  # WAIT-2: fresh admission revokes only younger, never paused, waiters
        revoked.append(h[1])
        return True
    return False  # seq holders (active writers) and anything unknown are never victims


def holders_ok(o, cache: CacheState, applicant: Applicant):
    """The checkpoint ids holding o and the waiters revoked, or None when a holder may not be
    dropped for this applicant (RCL-8, WAIT-2, PAUSE-4). Plain checkpoint holders are the
    common case and are checked inline."""
    cps = cache.checkpoints
    cids, revoked = [], None
    for h in o.holders:
        if h[0] == "ckpt":
            c = cps.get(h[1])
            if c is None:
                return None
            if c.kind == PointKind.SNAPSHOT or c.owner[0] == "wait":
                r: list = []
                if not optional_holder(h, cache, applicant, r):
                    return None
                if r:
                    revoked = (revoked or ()) + tuple(r)
            cids.append(h[1])
        elif h[0] == "wait":
            r: list = []
            if not optional_holder(h, cache, applicant, r):
                return None
            revoked = (revoked or ()) + tuple(r)
        else:
            return None  # seq holders (active writers) and anything unknown are never victims
    return cids, revoked or ()


def may_migrate(h, cache: CacheState, applicant: Applicant) -> bool:
    """WAIT-2: waiting protection permits Device/Host migration; other holders as for deletion."""
    if h[0] == "wait":
        return True
    if h[0] == "ckpt":
        c = cache.checkpoints.get(h[1])
        return c is not None and (c.owner[0] == "wait" or optional_holder(h, cache, applicant, []))
    return False


def freed_holders(freed: dict) -> tuple[frozenset, tuple]:
    """The real holder set (RCL-1) and the sorted object ids of what one deletion frees."""
    if len(freed) == 1:
        (o,) = freed.values()
        return o.holders, (o.object_id,)
    return frozenset(h for o in freed.values() for h in o.holders), tuple(sorted(freed))


def deletion_revokes(cache: CacheState, cids, waiters) -> tuple:
    """WAIT-2, SCH-4: tickets of the waiters and pause snapshots a deletion revokes."""
    cps = cache.checkpoints
    return (tuple(cache.waiters[r].ticket for r in waiters if r in cache.waiters)
            + tuple(cache.active[cps[c].owner[1]].publication_order for c in cids
                    if cps[c].kind == PointKind.SNAPSHOT and cps[c].owner[1] in cache.active))


def candidate_objects(state: LedgerState, cache: CacheState, gap: Gap):
    """RCL-1: only objects some checkpoint holds can be victims (an object held by nothing
    optional never is); walk the checkpoints' objects of the gap's pool, each once."""
    seen = set()
    if gap.pool == HOST:
        for c in cache.checkpoints.values():
            for oid in c.object_ids():
                if oid not in seen:
                    seen.add(oid)
                    yield oid
        return
    kind = state.pool(gap.pool).spec.kind
    for c in cache.checkpoints.values():
        if kind != KV_PAGES:
            oids = (c.state,)
        else:
            oids = next((pages for p, pages in c.kv if p == gap.pool), ())
        for oid in oids:
            if oid not in seen:
                seen.add(oid)
                yield oid


def enumerate_actions(state: LedgerState, cache: CacheState, gap: Gap, applicant: Applicant, protect: frozenset,
                      pricing: LossPricing, keep_content: frozenset = frozenset(),
                      candidates=None) -> tuple[list, int]:
    """RCL-1: the deletions and duplicate drops for this gap, from the objects' real holders
    (`candidates`: the objects to look at, by default every checkpoint's in the gap's pool or on
    Host), and how many candidates this applicant may not take."""
    actions: list = []
    if candidates is None:
        candidates = candidate_objects(state, cache, gap)
    groups, excluded, multi = _group_objects(state, cache, gap, applicant, protect, keep_content, candidates,
                                             actions)
    _deletions(cache, gap, pricing, groups, multi, actions)
    return actions, excluded


def _group_objects(state, cache, gap, applicant, protect, keep_content, candidates, actions) -> tuple:
    """The candidates by (checkpoint ids, revoked waiters) of their holders; duplicate replicas
    go to `actions` as drops at once. Returns (groups, excluded, whether a group has several points)."""
    excluded = 0
    on_host = gap.pool == HOST
    groups: dict = {}  # (frozenset(cids), revoked waiters) -> [objects]
    multi = False
    objects = state.objects
    cps = cache.checkpoints
    for oid in candidates:
        o = objects.get(oid)
        if o is None:
            continue
        if on_host:
            if o.host is None or not o.host.complete:
                continue
        elif o.pool != gap.pool or o.device is None or not o.device.complete:
            continue
        if o.leases or (not on_host and o.pins):
            continue  # TXN-1: readers and pins keep the replica
        if not on_host and any(h[0] == "seq" for h in o.holders):
            continue  # an active request computes on this Device unit: never a victim (SAVE-5, RCL-8)
        if oid in protect and oid not in keep_content:
            continue  # RCL-8: the applicant's own source is kept where it is
        other = o.device if on_host else o.host
        if other is not None and other.complete:  # HOST-1 / RCL-6: a safe duplicate replica
            # (for `keep_content`, e.g. the StateImage a Fork reads: its content stays; BIND-5
            # hands the Device slot to the new active identity and keeps the old one on Host)
            actions.append(Action("drop_replica", (), (oid,), o.host.nbytes if on_host else 1,
                                  (o.host.location,) if on_host else (), 0, Tier.NORMAL, 0, o.holders, (),
                                  HOST_MEDIUM if on_host else DEVICE))
            continue
        if oid in protect or oid in keep_content:
            continue  # RCL-8: the applicant's own source is kept
        hs = o.holders
        if len(hs) == 1:  # the common case, inline: one plain checkpoint holds it
            (h,) = hs
            if h[0] == "ckpt":
                c = cps.get(h[1])
                if c is not None and c.kind != PointKind.SNAPSHOT and c.owner[0] != "wait":
                    key = (frozenset((h[1],)), ())
                    objs = groups.get(key)
                    if objs is None:
                        groups[key] = [o]
                    else:
                        objs.append(o)
                    continue
        got = holders_ok(o, cache, applicant)
        if got is None:
            excluded += 1
            continue
        cids, revoked = got
        if not cids:
            continue
        if len(cids) > 1:
            multi = True
        key = (frozenset(cids), tuple(sorted(revoked, key=repr)) if revoked else ())
        objs = groups.get(key)
        if objs is None:
            groups[key] = [o]
        else:
            objs.append(o)
    return groups, excluded, multi


def _deletions(cache, gap, pricing: LossPricing, groups: dict, multi: bool, actions: list) -> None:
    """One deletion per group: what it frees (its objects and its subgroups'), its loss and tier."""
    on_host = gap.pool == HOST
    cps = cache.checkpoints
    snapshots = any(u.snapshot for u in cache.active.values())
    records = cache.records
    member_groups: dict = {}
    if multi:
        for key in groups:
            for c in key[0]:
                member_groups.setdefault(c, []).append(key)
    for key, objs in groups.items():
        cids, waiters = key
        if len(objs) == 1 and len(cids) == 1 and not waiters and not snapshots:  # the common case, inline
            o = objs[0]
            c = cps[next(iter(cids))]
            kind, okey = c.owner
            r = records.get(okey) if kind == "rec" else None
            if r is not None and r.tier != Tier.REUSE:
                h, t = False, r.demand_time  # RCL-3: a normal-tier owner protects nothing
            else:
                h, t = pricing.hot(c, cids)
            actions.append(Action("delete", tuple(cids), (o.object_id,), o.host.nbytes if on_host else 1,
                                  (o.host.location,) if on_host else (), pricing.loss(cids),
                                  Tier.REUSE if h else Tier.NORMAL, t, o.holders, ()))
            continue
        freed = {o.object_id: o for o in objs}
        if len(cids) > 1:  # everything this group's deletion frees: its objects and its subgroups'
            for c in cids:
                for k2 in member_groups.get(c, ()):
                    if k2 != key and k2[0] <= cids and set(k2[1]) <= set(waiters):
                        for o in groups[k2]:
                            freed[o.object_id] = o
        amount = sum(o.host.nbytes for o in freed.values()) if on_host else len(freed)
        if amount <= 0:
            continue  # RCL-1: frees none of the scarce resource
        tier, demand = pricing.tier(cids)
        if len(freed) == 1:
            (o,) = freed.values()
            holders, ids = o.holders, (o.object_id,)
            offsets = (o.host.location,) if on_host else ()
        else:
            holders = frozenset(h for o in freed.values() for h in o.holders)
            ids = tuple(sorted(freed))
            offsets = tuple(sorted(o.host.location for o in freed.values())) if on_host else ()
        revokes = deletion_revokes(cache, cids, waiters) if waiters or snapshots else ()
        actions.append(Action("delete", tuple(sorted(cids)), ids, amount, offsets, pricing.loss(cids), tier, demand,
                              holders, waiters, DEVICE, (), revokes))
