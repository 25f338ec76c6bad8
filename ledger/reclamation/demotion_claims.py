"""Which objects a checkpoint's demotion group takes (RCL-6), decided as the reference decides it:
each point's own Device-only objects in demotion order (`index_keys.pages_of`, past its `lead`),
up to the gap, skipping what a point earlier in `walk_key` order took — a page several points
hold joins the first one's group that still has room. `DemotionClaims` computes a point's group on
demand, and the groups of the earlier points it depends on first (an explicit stack, so a long
chain of sharing points never recurses deeply), remembering who claimed each shared object.
"""
from __future__ import annotations

from ledger.reclamation.candidates import may_migrate
from ledger.reclamation.index import walk_key
from ledger.reclamation.index_keys import lead, pages_of
from ledger.state import KV_PAGES


class DemotionClaims:
    """Which of a checkpoint's Device-only objects its demotion group takes (RCL-6): its own in
    demotion order, up to the gap, skipping what a checkpoint earlier in `walk_key` order took.
    An object joins at most one group; `claimer` remembers whose, `settled` how far along its
    listers (in walk order) that is known. `sources`: the quote's `DemotionSources` (its states,
    index, pool, gap amount, applicant and protected objects)."""

    def __init__(self, sources):
        self.sources = sources
        self.groups: dict = {}  # cid -> its demotion group (object ids)
        self.eligible_objects: dict = {}  # oid -> may it move to Host for this applicant
        self.claimer: dict = {}  # oid -> (walk key, cid) of the checkpoint whose group took it
        self.settled: dict = {}  # oid -> how many of its listers are known not to take it
        self.depth = 0
        # WAIT-2: moving a pause snapshot to Host revokes nothing
        self.mover = sources.applicant._replace(fresh=False)

    def eligible(self, oid) -> bool:
        """May this object move to Host in a demotion (RCL-1, RCL-6, WAIT-2)?"""
        got = self.eligible_objects.get(oid)
        if got is not None:
            return got
        src = self.sources
        if oid in src.protect:  # RCL-8, asked before the object is read: a session's points share
            self.eligible_objects[oid] = False  # the protected prefix of the request being admitted
            return False
        o = src.state.objects[oid]
        ok = not (o.pool != src.pool or o.device is None or o.host is not None or o.leases or o.pins)
        if ok:
            hs = src.index.holder_sets.get(oid)
            holders = o.holders
            if hs is not None and holders is not hs and holders != hs:
                ok = False  # an active writer or a holder the cache does not know limits movement
            else:
                g = src.index.groups.get((src.pool, hs)) if hs is not None else None
                if g is None or g.special:  # waiters, snapshots, waiters' points: by the rules
                    cache, mover = src.cache, self.mover
                    ok = all(may_migrate(h, cache, mover) for h in holders)
        self.eligible_objects[oid] = ok
        return ok

    def group(self, cid) -> list:
        """The demotion group of point cid (the objects it would move), computed once."""
        groups = self.groups
        if cid in groups:
            return groups[cid]
        stack = [cid]
        while stack:
            top = stack[-1]
            if top in groups:
                stack.pop()
                continue
            need = self.claim(top)
            if need is not None:
                stack.append(need)
            else:
                stack.pop()
        return groups[cid]

    def taken_before(self, oid, cid, me):
        """True/False whether a checkpoint before `cid` (walk key `me`) took `oid`; or the
        checkpoint whose group must be known first."""
        c = self.claimer.get(oid)
        if c is not None:
            return c[0] < me
        listers = self.sources.index.listers[oid]
        i = self.settled.get(oid, 0)
        groups = self.groups
        n = len(listers)
        amount = self.sources.amount
        while i < n:
            k, p, ahead = listers[i]
            if k >= me:
                return False
            g = groups.get(p)
            if g is None:
                # p reaches oid with room whatever it took before (fewer objects ahead of it in
                # p's demotion order than the gap): no earlier point took it, so p does
                if ahead < amount:
                    self.claimer[oid] = (k, p)
                    return True
                if self.depth >= 48:
                    return p  # a long chain: the caller's stack computes it first
                self.depth += 1
                try:
                    g = self.group(p)
                finally:
                    self.depth -= 1
            i += 1
            self.settled[oid] = i
            if oid in g:
                self.claimer[oid] = (k, p)
                return True
        return False

    def claim(self, cid):
        """Compute point cid's group (None), or return the checkpoint whose group must be known
        first (a shared object it lists may have gone to that one)."""
        src = self.sources
        c = src.cache.checkpoints[cid]
        out = []
        want = src.amount
        me = walk_key(cid)
        listers, eligible = src.index.listers, self.eligible_objects
        skip = lead(src.index, c, src.pool) if src.kind == KV_PAGES else 0  # moved to Host before
        for oid in pages_of(c, src.pool, src.kind, skip):
            ok = eligible.get(oid)
            if ok is False:
                continue  # known not to move (the cheaper test first: points share their prefix)
            w = listers.get(oid)
            if w is not None and w[0][1] != cid and w[0][2] < want:
                continue  # its first point in walk order takes it with room to spare (or nobody may)
            if ok is None and not self.eligible(oid):
                continue
            if w is not None:  # shared: did a checkpoint earlier in walk order take it?
                got = self.taken_before(oid, cid, me)
                if got is True:
                    continue
                if got is not False:
                    return got  # compute that checkpoint's group first
            out.append(oid)
            if len(out) >= want:
                break
        self.groups[cid] = out
        claimer = self.claimer
        for oid in out:
            if oid not in claimer:
                claimer[oid] = (me, cid)
        return None
