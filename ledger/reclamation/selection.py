"""Selecting a victim set from ranked actions for a Device gap (RCL-4..7, RCL-11, HOST-1): take
admissible actions in rank order until the gap closes, never combining a move (demotion, duplicate
drop) with the deletion of the moved content (`ActionBatch`, judged by the cumulative holders the
chosen deletions remove, RCL-5/RCL-7), never exceeding a budgeted applicant's loss budget, placing
every demotion's Host destinations together; then drop what is no longer needed. The ranked
actions may come lazily (the victim index's merge): nothing after the closing pick is read.
"""
from __future__ import annotations

from ledger import arena as host
from ledger.cache_state import CacheState
from ledger.reclamation.terms import Action, budgeted
from ledger.state import LedgerState


def freed_whole(state: LedgerState, cache: CacheState, oids, cids, waiters) -> list:
    """RCL-5/RCL-7: the objects among `oids` that deleting the checkpoints `cids` and revoking
    `waiters` frees whole, judged by physical identity: every holder goes (a point another
    waiter still references stays for it, WAIT-1) and no lease or pin keeps the object."""
    if not cids and not waiters:
        return []
    gone = {("wait", r) for r in waiters}
    kept = {w.cid for w in cache.waiters.values() if w.request not in waiters}
    gone.update(("ckpt", c) for c in cids if c not in kept)
    out = []
    for oid in oids:
        o = state.objects.get(oid)
        if o is not None and o.holders <= gone and not o.leases and not o.pins:
            out.append(oid)
    return out


def all_freed(state: LedgerState, cache: CacheState, a: Action) -> tuple:
    """Every object (any pool or medium) a deletion would free or a replica drop would touch:
    a Host victim must not free what the same batch moves (RCL-5, RCL-7)."""
    if a.kind != "delete":
        return a.objects
    cps = cache.checkpoints
    mine = {oid for cid in a.cids if cid in cps for oid in cps[cid].object_ids()}
    return tuple(sorted(set(a.objects) | set(freed_whole(state, cache, mine, a.cids, a.waiters))))


def removed_by(actions) -> tuple[set, set]:
    """The checkpoints and waiters these actions' deletions (Host victims included) remove."""
    cids, waiters = set(), set()
    for a in actions:
        for d in (a,) + tuple(a.host_victims):
            if d.kind == "delete":
                cids.update(d.cids)
                waiters.update(d.waiters)
    return cids, waiters


def moved_by(a: Action) -> list:
    """The objects an action moves: a replica drop or a demotion, and its Host victims' drops."""
    out = [] if a.kind == "delete" else list(a.objects)
    out.extend(o for v in a.host_victims if v.kind != "delete" for o in v.objects)
    return out


class ActionBatch:
    """RCL-5/RCL-7: a quote never combines a move (demotion, duplicate-replica drop) with the
    deletion of the moved content. Judged by the cumulative holders the chosen deletions
    remove, not action by action: two deletions (or a Host victim and a Device deletion) that
    each leave a moved page one holder may together free it."""

    def __init__(self, state: LedgerState, cache: CacheState):
        self.state, self.cache = state, cache
        self.cids: set = set()
        self.waiters: set = set()
        self.moved: dict = {}  # object id -> the chosen action that moves it

    def check(self, a: Action):
        """`(a, subsumed)` when a may join the batch, else None. A deletion that frees whole an
        object whose duplicate replica a chosen drop frees takes that drop over (`subsumed`):
        the deletion frees the object, the drop goes."""
        cids, waiters = removed_by((a,))
        if cids or waiters:
            cids, waiters = self.cids | cids, self.waiters | waiters
        else:
            cids, waiters = self.cids, self.waiters
        moves = moved_by(a)
        if moves and freed_whole(self.state, self.cache, moves, cids, waiters):
            return None  # it would move what the batch deletes
        hit = freed_whole(self.state, self.cache, self.moved, cids, waiters) if cids is not self.cids else []
        if not hit:
            return a, ()
        if a.kind != "delete" or any(self.moved[o].kind != "drop_replica" for o in hit):
            return None  # it would delete what a chosen demotion moves
        subsumed = {id(self.moved[o]): self.moved[o] for o in hit}
        objs = set(a.objects) | set(hit)
        offs = dict.fromkeys(a.offsets)
        offs.update((o, None) for d in subsumed.values() for o in d.offsets)
        return a._replace(objects=tuple(sorted(objs)), offsets=tuple(offs)), tuple(subsumed.values())

    def take(self, a: Action, subsumed: tuple, chosen: list) -> None:
        if subsumed:
            chosen[:] = [b for b in chosen if all(b is not d for d in subsumed)]
        for d in subsumed:
            for o in d.objects:
                self.moved.pop(o, None)
        cids, waiters = removed_by((a,))
        self.cids |= cids
        self.waiters |= waiters
        for o in moved_by(a):
            self.moved[o] = a
        chosen.append(a)


def select_device(state, cache, gap, applicant, ranked, on_take=None) -> list | None:
    """RCL-4..7, RCL-11, HOST-1: take ranked admissible actions until the Device gap closes;
    None when it does not. `ranked` may be lazy: nothing after the closing pick is read.
    `on_take(loss)` hears the cumulative loss after each pick (a lazy ranking may skip what the
    remaining RCL-11 budget excludes anyway)."""
    chosen, freed_ids, loss = [], set(), 0
    is_budgeted = budgeted(applicant)
    touched: set = set()  # objects a chosen replica drop, demotion or Host victim already moves
    demote_allocs: list = []  # RCL-7: the batch's Host destinations, placed together
    host_offsets: list = []
    batch_closed = False
    unit = state.pool(gap.pool).spec.unit_bytes
    batch = ActionBatch(state, cache)
    for a in ranked:
        if len(freed_ids) >= gap.amount:
            break
        new = set(a.objects) - freed_ids
        if not new:
            continue  # RCL-7: adds nothing (judged by physical identity)
        if is_budgeted and loss + a.loss >= applicant.budget and a.loss > 0:
            continue  # RCL-11: cumulative loss must stay below the fixed added coverage
        moves = set(a.objects) | {o for v in a.host_victims for o in v.objects}
        if a.kind != "delete" and moves & (touched | freed_ids):
            continue
        if a.kind == "delete" and set(a.objects) & touched:
            continue
        got = batch.check(a)
        if got is None:
            continue  # RCL-5/RCL-7: never move what the batch's deletions free
        a, subsumed = got
        if a.kind == "demote":
            if batch_closed:
                continue  # RCL-7: a migration needing Host victims ended the batch
            allocs = demote_allocs + [host.HostAllocation(unit) for _ in a.objects]
            offs = host_offsets + [o for v in a.host_victims for o in v.offsets]
            if not host.fits(state.arena, allocs, offs):
                continue  # HOST-1: the batch's destinations must place together
            demote_allocs, host_offsets = allocs, offs
            batch_closed = bool(a.host_victims)
        if a.kind != "delete":
            touched |= moves
        batch.take(a, subsumed, chosen)
        freed_ids |= new
        loss += a.loss
        if on_take is not None:
            on_take(loss)
        if len(freed_ids) >= gap.amount:
            break  # closed: a lazy ranking is not asked for its next action
    if len(freed_ids) < gap.amount:
        return None
    return _drop_unneeded(chosen, gap.amount)


def _drop_unneeded(chosen: list, amount: int) -> list:
    for a in reversed(list(chosen)):
        rest = [b for b in chosen if b is not a]
        if len({o for b in rest for o in b.objects}) >= amount:
            chosen = rest
    return chosen
