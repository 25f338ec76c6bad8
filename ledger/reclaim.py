"""Reclamation and admission (RCL-1..12, HOST-1..3, WAIT-2, RD-8).

`quote(state, cache, gap, applicant)` is read-only (RCL-2): it enumerates a finite set of
physical actions from the real holders of the objects in the scarce pool (RCL-1) — delete a
group of checkpoints (every optional holder of the content together), drop a duplicate
replica, or demote a Device page group / StateImage to Host (RD-4: a Host demotion) — with each
action's real holder set, the amount of the gap it frees (unique objects, shared references
never counted twice), its recovery-token loss against the surviving fallback (RCL-5) and its
retention tier (RCL-3). It keeps the actions this applicant may take (RCL-8/10/11, WAIT-2),
ranks them (RCL-4, RD-8; HOST-2 for the arena) and selects a set that closes the gap, or admits
nothing. `plan_reclaim` turns a quote made on the very same states into a plan (stale: re-quote);
the plan's ops re-check every object's version at commit (RCL-2, RCL-5).

`quote` takes its picks from the cache's persistent victim order (ledger/victims.py, through
ledger/victim_select.py): the same selection in O(k log n) for k picks. `quote_reference` is the
full enumeration below (`_enumerate`, `_quote`), kept as the reference the tests compare with;
`quote_facts` shares one decision's facts between its quotes (RCL-2).
"""
from __future__ import annotations

from typing import NamedTuple

from ledger import arena as host
from ledger import prefix_index as px
from ledger.cache_edit import CacheResult, Edit, aliases
from ledger.cache_state import CacheState, Checkpoint, PointKind, Tier, indexed
from ledger.errors import InvalidRequest
from ledger.objects import plan_drop_replica
from ledger.plan import Refusal
from ledger.state import DEVICE, HOST, HOST_MEDIUM, KV_PAGES, LedgerState, TxnKind
from ledger.transactions import TransferRequest, plan_begin_transfer
from ledger.victims import walk_key  # noqa: F401  (the demotion walk's order; tests import it here)


MAX_VICTIM_DEMOTIONS = 8  # demotions needing Host victims quoted per Device quote (RCL-5, bounded)


class ApplicantKind:
    NECESSARY = "necessary"  # admitted execution (RCL-8): any optional content, in order
    CAPTURE = "capture"  # an optional new capture (RCL-10/11, SAVE-5)
    WRITEBACK = "writeback"  # Host write-back of existing content (RCL-10, RCL-12)
    SNAPSHOT = "snapshot"  # a pause Snapshot (RCL-10): optional cache, then later tickets' snapshots


class Applicant(NamedTuple):
    kind: str
    budget: int = 0  # RCL-11: fixed added recovery coverage of a capture without own demand
    demand_time: int = 0  # RCL-9: the candidate position's own repeated demand time (0: none)
    tier: int = Tier.NORMAL  # the owner's tier (RCL-10: bounds what a cold capture may replace)
    ticket: int | None = None  # the applicant's original ticket (WAIT-2 / pause snapshots)
    revoke_waiters: bool = False  # WAIT-2, SCH-4: only when ordinary reclamation is not enough
    fresh: bool = False  # fresh admission: revokes only younger waiters, never a paused one
    demote: bool = True  # consider Host demotions (RCL-6)


class Gap(NamedTuple):
    """The currently scarce resource: units of a Device pool, or bytes of the Host arena."""

    pool: str  # a Device pool id, or HOST
    amount: int  # units, or bytes
    allocations: tuple = ()  # HOST: the allocations that must place first-fit (HOST-1)


class Action(NamedTuple):
    kind: str  # "delete" | "drop_replica" | "demote"
    cids: tuple  # checkpoints deleted (delete) or whose content is demoted
    objects: tuple  # objects whose bytes in the gap's pool are freed (unique)
    frees: int  # amount of the gap freed (units or bytes)
    offsets: tuple  # HOST: arena offsets freed (HOST-1 pre-check)
    loss: int  # recovery tokens lost against the surviving fallback (RCL-5)
    tier: int  # REUSE when it touches hot content (RCL-3)
    demand_time: int
    holders: frozenset  # the real holder set (RCL-1)
    waiters: tuple  # waiting references it revokes (WAIT-2)
    medium: str = DEVICE  # drop_replica: which replica
    host_victims: tuple = ()  # demote: Host actions fixed before sorting (RCL-5)
    revokes: tuple = ()  # tickets of the waiters / pause snapshots it revokes (WAIT-2, SCH-4)


class Quote(NamedTuple):
    gap: Gap
    applicant: Applicant
    ranking: object  # `.actions` / `.excluded`; a quote through the victim order computes them on demand
    chosen: tuple  # the selected subset, in order
    freed: int
    loss: int
    admitted: bool
    base: LedgerState
    cache: CacheState
    cold: frozenset = frozenset()  # HEAT-4: owners this quote treated as normal (recorded on commit)

    @property
    def actions(self) -> tuple:
        """Every admissible action, ranked (RCL-4). A quote taken through the victim order
        stops after its picks; reading this enumerates them all (`quote_reference`)."""
        return self.ranking.actions

    @property
    def excluded(self) -> int:
        """Actions this applicant may not take."""
        return self.ranking.excluded


class Ranking(NamedTuple):
    actions: tuple
    excluded: int


class LazyRanking:
    """The full ranked action list of a quote, enumerated only when someone reads it."""

    __slots__ = ("args", "_got")

    def __init__(self, *args):
        self.args = args
        self._got = None

    def _get(self) -> Ranking:
        if self._got is None:
            state, cache, gap, applicant, protect, keep = self.args
            facts = _Facts(state, cache)
            q = _quote(state, cache, gap, applicant, protect, facts, keep)
            self._got = q.ranking
        return self._got

    @property
    def actions(self) -> tuple:
        return self._get().actions

    @property
    def excluded(self) -> int:
        return self._get().excluded


# -- facts ------------------------------------------------------------------------------
class _Facts:
    """Facts shared by every candidate of one quote (RCL-2): fallbacks, protections."""

    def __init__(self, state: LedgerState, cache: CacheState, cold_source=None):
        self.state, self.cache = state, cache
        self._cold = None
        self._cold_source = cold_source  # the victim order's segment (a quote through it), else recounted
        self.memo = None  # the Host evaluations the quotes on these states share (victim_select.HostMemo)

    @property
    def cold(self) -> frozenset:
        """HEAT-4: reuse-tier owners beyond the soft target: normal for this quote (computed once,
        only when a reuse-tier owner is met; `Quote.cold` records whether it was)."""
        if self._cold is None:
            if self._cold_source is not None:
                self._cold = self._cold_source
            else:
                from ledger.evidence import beyond_target_reference

                self._cold = beyond_target_reference(self.state, self.cache)
        return self._cold

    def fallback(self, c: Checkpoint, gone: frozenset) -> int:
        """RCL-5: the deepest surviving point that is an exact prefix of c (aliases deleted
        together are not each other's fallback)."""
        cache = self.cache
        fb, cps = cache.fallback, cache.checkpoints
        if indexed(c) and len(px.same(cache.index, c.identity)) > 1 \
                and any(a != c.cid and a not in gone for a in aliases(cache, c)):
            return c.frontier  # a surviving alias at the same position: nothing is lost
        f = fb.get(c.cid, 0)
        while f:  # the next deepest prefix: a surviving alias of f, else f's own fallback
            if f not in gone or any(a not in gone for a in aliases(cache, cps[f])):
                return cps[f].frontier
            f = fb.get(f, 0)
        return 0

    def tier(self, cids) -> tuple[int, int]:
        """RCL-3: a deletion touching hot content is REUSE tier; its demand time is the latest."""
        tier, demand = Tier.NORMAL, 0
        cps = self.cache.checkpoints
        for c in cids:
            h, t = self.hot(cps[c], cids)
            if h:
                tier = Tier.REUSE
            if t > demand:
                demand = t
        return tier, demand

    def loss(self, cids: frozenset) -> int:
        """RCL-5: lost coverage of a deleted group, nested points of one history counted once."""
        if len(cids) == 1:  # the common case, inline: a lone point with no alias
            (cid,) = cids
            cache = self.cache
            c = cache.checkpoints[cid]
            n = len(c.identity.tokens)
            if len(px.same(cache.index, c.identity)) > 1 or c.owner[0] not in ("rec", "shared"):
                return n - self.fallback(c, cids)
            f = cache.fallback.get(cid, 0)
            return n - (len(cache.checkpoints[f].identity.tokens) if f else 0)
        pts = sorted((self.cache.checkpoints[c] for c in cids), key=lambda c: -c.frontier)
        tops: list = []  # (top, intervals)
        for c in pts:
            iv = (self.fallback(c, cids), c.frontier)
            for t in tops:
                if c.identity.is_prefix_of(t[0].identity):
                    t[1].append(iv)
                    break
            else:
                tops.append((c, [iv]))
        total = 0
        for _, ivs in tops:
            ivs.sort()
            lo, hi = ivs[0]
            for a, b in ivs[1:]:
                if a > hi:
                    total += hi - lo
                    lo, hi = a, b
                else:
                    hi = max(hi, b)
            total += hi - lo
        return total

    def hot(self, c: Checkpoint, gone: frozenset) -> tuple[bool, int]:
        """RCL-3: is c hot content, and its owner's demand time."""
        kind, key = c.owner
        if kind == "shared":
            e = self.cache.shared.get(key)
            if e is None or e.tier != Tier.REUSE or c.owner in self.cold:
                return False, (e.demand_time if e else 0)
            return True, e.demand_time
        if kind != "rec":
            return False, 0
        r = self.cache.records.get(key)
        if r is None:
            return False, 0
        if r.tier != Tier.REUSE or c.owner in self.cold:
            return False, r.demand_time
        if c.frontier < r.proven_frontier:
            return False, r.demand_time  # too shallow to be the proven position
        for pid in r.points():  # a surviving earlier point of the owner still covering it
            if pid in gone or pid == c.cid:
                continue
            p = self.cache.checkpoints[pid]
            if r.proven_frontier <= p.frontier <= c.frontier and p.identity.is_prefix_of(c.identity):
                return False, r.demand_time
        return True, r.demand_time


def _optional_holder(h, cache: CacheState, applicant: Applicant, revoked: list) -> bool:
    """May this holder's reference be dropped for this applicant? (RCL-8, WAIT-2, PAUSE-4)"""
    if h[0] == "ckpt":
        c = cache.checkpoints.get(h[1])
        if c is None:
            return False
        if c.owner[0] == "wait":  # a point only a waiter keeps goes only with that waiter
            return _optional_holder(("wait", c.owner[1]), cache, applicant, revoked)
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


def _holders_ok(o, cache: CacheState, applicant: Applicant):
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
                if not _optional_holder(h, cache, applicant, r):
                    return None
                if r:
                    revoked = (revoked or ()) + tuple(r)
            cids.append(h[1])
        elif h[0] == "wait":
            r: list = []
            if not _optional_holder(h, cache, applicant, r):
                return None
            revoked = (revoked or ()) + tuple(r)
        else:
            return None  # seq holders (active writers) and anything unknown are never victims
    return cids, revoked or ()


def _enumerate(state: LedgerState, cache: CacheState, gap: Gap, applicant: Applicant, protect: frozenset,
               facts: _Facts, keep_content: frozenset = frozenset(), candidates=None) -> tuple[list, int]:
    """RCL-1: the finite action set for this gap, from the objects' real holders (`candidates`:
    the objects to look at, by default every checkpoint's in the gap's pool or on Host)."""
    actions, excluded = [], 0
    on_host = gap.pool == HOST
    groups: dict = {}  # (frozenset(cids), revoked waiters) -> [objects]
    multi = False
    objects = state.objects
    cps = cache.checkpoints
    for oid in (_candidate_objects(state, cache, gap) if candidates is None else candidates):
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
        got = _holders_ok(o, cache, applicant)
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
                h, t = facts.hot(c, cids)
            actions.append(Action("delete", tuple(cids), (o.object_id,), o.host.nbytes if on_host else 1,
                                  (o.host.location,) if on_host else (), facts.loss(cids),
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
        tier, demand = facts.tier(cids)
        if len(freed) == 1:
            (o,) = freed.values()
            holders, ids = o.holders, (o.object_id,)
            offsets = (o.host.location,) if on_host else ()
        else:
            holders = frozenset(h for o in freed.values() for h in o.holders)
            ids = tuple(sorted(freed))
            offsets = tuple(sorted(o.host.location for o in freed.values())) if on_host else ()
        revokes = deletion_revokes(cache, cids, waiters) if waiters or snapshots else ()
        actions.append(Action("delete", tuple(sorted(cids)), ids, amount, offsets, facts.loss(cids), tier, demand,
                              holders, waiters, DEVICE, (), revokes))
    if not on_host and applicant.demote and state.transaction is None:
        actions.extend(_demotions(state, cache, gap, applicant, protect, facts))
    return actions, excluded


def _candidate_objects(state: LedgerState, cache: CacheState, gap: Gap):
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


def _may_migrate(h, cache: CacheState, applicant: Applicant) -> bool:
    """WAIT-2: waiting protection permits Device/Host migration; other holders as for deletion."""
    if h[0] == "wait":
        return True
    if h[0] == "ckpt":
        c = cache.checkpoints.get(h[1])
        return c is not None and (c.owner[0] == "wait" or _optional_holder(h, cache, applicant, []))
    return False


def _demotions(state, cache, gap, applicant, protect, facts) -> list:
    """RCL-5/6: Device -> Host demotions of content with no Host replica yet. A KV demotion is a
    bounded page group of one checkpoint's pages (the deepest first), never State and KV
    together; its Host victims are fixed before sorting and its loss is theirs."""
    out, pending = [], []
    spec = state.pool(gap.pool).spec
    seen: set = set()
    want = gap.amount
    unit = spec.unit_bytes
    from ledger import extents as ex
    free_units = sum(length // unit for _, length in ex.iter_extents(state.arena.free))  # HOST-1 pre-check, once
    mover = applicant._replace(fresh=False)  # WAIT-2: moving a pause snapshot to Host revokes nothing
    for c in sorted(cache.checkpoints.values(), key=lambda c: walk_key(c.cid)):
        oids = [c.state] if spec.kind != KV_PAGES else [o for p, pages in c.kv if p == gap.pool for o in reversed(pages)]
        group = []
        for oid in oids:
            o = state.objects[oid]
            if oid in seen or oid in protect or o.pool != gap.pool or o.device is None or o.host is not None:
                continue
            if o.leases or o.pins or not all(_may_migrate(h, cache, mover) for h in o.holders):
                continue  # active writers and readers limit movement (RCL-1); waiters allow it (WAIT-2)
            group.append(oid)
            if len(group) >= want:
                break
        if not group:
            continue
        seen.update(group)
        hot, demand = facts.hot(c, frozenset())
        tier = Tier.REUSE if hot else Tier.NORMAL
        holders = frozenset(h for oid in group for h in state.objects[oid].holders)
        if free_units >= len(group):  # each page (or the StateImage block) places first-fit as is
            out.append(Action("demote", (c.cid,), tuple(group), len(group), (), 0, tier, demand, holders, (),
                              DEVICE, ()))
        else:
            pending.append((tier, demand, c, group, holders))
    # Demotions that need Host victims: those are fixed before sorting (RCL-5) by a Host quote
    # with the kept content's own rights (RCL-10 write-back, RCL-12); quoted for the oldest
    # few candidates only, which keeps the action set finite and the quote bounded.
    pending.sort(key=lambda x: (x[0], x[1], x[2].cid))
    for tier, demand, c, group, holders in pending[:MAX_VICTIM_DEMOTIONS]:
        need, wb = demotion_writeback(spec, c, group, tier, applicant, facts)
        q = _quote(state, cache, Gap(HOST, need.size, (need,)), wb, protect | set(group), facts)
        if not q.admitted:
            continue
        victims = tuple(v._replace(objects=_all_freed(state, cache, v)) for v in q.chosen)
        cids, waiters = _removes(victims)
        if _freed(state, cache, group, cids, waiters):
            continue  # RCL-5/RCL-7: the victims together would free the very pages being demoted
        out.append(Action("demote", (c.cid,), tuple(group), len(group), (), q.loss, tier, demand, holders, (),
                          DEVICE, victims))
    return out


def _all_freed(state: LedgerState, cache: CacheState, a: Action) -> tuple:
    """Every object (any pool or medium) a deletion would free or a replica drop would touch:
    a Host victim must not free what the same batch moves (RCL-5, RCL-7)."""
    if a.kind != "delete":
        return a.objects
    cps = cache.checkpoints
    mine = {oid for cid in a.cids if cid in cps for oid in cps[cid].object_ids()}
    return tuple(sorted(set(a.objects) | set(_freed(state, cache, mine, a.cids, a.waiters))))


def _freed(state: LedgerState, cache: CacheState, oids, cids, waiters) -> list:
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


def _removes(actions) -> tuple[set, set]:
    """The checkpoints and waiters these actions' deletions (Host victims included) remove."""
    cids, waiters = set(), set()
    for a in actions:
        for d in (a,) + tuple(a.host_victims):
            if d.kind == "delete":
                cids.update(d.cids)
                waiters.update(d.waiters)
    return cids, waiters


def _moves(a: Action) -> list:
    """The objects an action moves: a replica drop or a demotion, and its Host victims' drops."""
    out = [] if a.kind == "delete" else list(a.objects)
    out.extend(o for v in a.host_victims if v.kind != "delete" for o in v.objects)
    return out


class _Batch:
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
        cids, waiters = _removes((a,))
        if cids or waiters:
            cids, waiters = self.cids | cids, self.waiters | waiters
        else:
            cids, waiters = self.cids, self.waiters
        moves = _moves(a)
        if moves and _freed(self.state, self.cache, moves, cids, waiters):
            return None  # it would move what the batch deletes
        hit = _freed(self.state, self.cache, self.moved, cids, waiters) if cids is not self.cids else []
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
        cids, waiters = _removes((a,))
        self.cids |= cids
        self.waiters |= waiters
        for o in _moves(a):
            self.moved[o] = a
        chosen.append(a)


def _admissible(a: Action, ap: Applicant) -> bool:
    """RCL-10: the admission table (the cumulative budget is checked during selection)."""
    if a.kind == "drop_replica":
        return True  # HOST-1 / RCL-6: a safe duplicate, nothing recoverable is lost
    if ap.kind == ApplicantKind.NECESSARY or ap.kind == ApplicantKind.SNAPSHOT:
        return True  # RCL-8 / pause Snapshot: optional cache in order
    if ap.demand_time:  # own repeated demand: normal content, or reuse content older than it
        return a.tier == Tier.NORMAL or a.demand_time < ap.demand_time
    return a.tier <= ap.tier  # the owner's tier bounds what a cold capture may replace


def demotion_writeback(spec, c: Checkpoint, group, tier: int, applicant: Applicant, facts) -> tuple:
    """The Host allocation a demotion of `group` needs, and the write-back applicant that quotes
    Host victims for it with the kept content's own rights (RCL-10, RCL-12)."""
    unit = spec.unit_bytes
    need = host.HostAllocation(unit * len(group), len(group)) if spec.kind == KV_PAGES else host.HostAllocation(unit)
    wb = Applicant(ApplicantKind.WRITEBACK, budget=facts.loss(frozenset((c.cid,))),
                   demand_time=c.demand_time, tier=tier, demote=False)
    if applicant.kind in (ApplicantKind.CAPTURE, ApplicantKind.WRITEBACK):
        # RCL-12: Host victims must satisfy both the migration source's and the outer optional
        # write's rights, and the outer write's remaining budget.
        both = min(wb.demand_time, applicant.demand_time) if wb.demand_time and applicant.demand_time else 0
        budget = wb.budget if applicant.demand_time else min(wb.budget, applicant.budget)
        wb = wb._replace(budget=budget, demand_time=both, tier=min(wb.tier, applicant.tier))
    return need, wb


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


def _rank_key(a: Action, gap_amount: int):
    """RCL-4, RD-8: normal before reuse; normal by loss / useful freed amount (capped at the
    gap), ties older demand first; reuse by demand time, oldest first."""
    useful = min(a.frees, gap_amount) or 1
    # WAIT-2 / SCH-4: ordinary reclamation first; revocations last, the youngest first.
    if a.revokes:
        r0, r1 = 1, -min(a.revokes)
    else:
        r0 = r1 = 0
    if a.tier == Tier.NORMAL:
        return (r0, r1, 0, a.loss / useful, a.demand_time, a.kind != "drop_replica", a.cids, a.objects)
    return (r0, r1, 1, a.demand_time, 0, True, a.cids, a.objects)


def _quote(state, cache, gap, applicant, protect, facts, keep_content=frozenset()) -> Quote:
    actions, excluded = _enumerate(state, cache, gap, applicant, frozenset(protect), facts, keep_content)
    ok = []
    for a in actions:
        if _admissible(a, applicant):
            ok.append(a)
        else:
            excluded += 1
    if gap.pool == HOST:
        return _select_host(state, cache, gap, applicant, ok, excluded)
    ok.sort(key=lambda a: _rank_key(a, gap.amount))
    chosen = select_device(state, cache, gap, applicant, ok)
    ranking = Ranking(tuple(ok), excluded)
    if chosen is None:
        return Quote(gap, applicant, ranking, (), 0, 0, False, state, cache)
    freed = len({o for a in chosen for o in a.objects})
    return Quote(gap, applicant, ranking, tuple(chosen), freed, sum(a.loss for a in chosen), True, state, cache)


def select_device(state, cache, gap, applicant, ranked, on_take=None) -> list | None:
    """RCL-4..7, RCL-11, HOST-1: take ranked admissible actions until the Device gap closes;
    None when it does not. `ranked` may be lazy: nothing after the closing pick is read.
    `on_take(loss)` hears the cumulative loss after each pick (a lazy ranking may skip what the
    remaining RCL-11 budget excludes anyway)."""
    chosen, freed_ids, loss = [], set(), 0
    budgeted = applicant.kind in (ApplicantKind.CAPTURE, ApplicantKind.WRITEBACK) and not applicant.demand_time
    touched: set = set()  # objects a chosen replica drop, demotion or Host victim already moves
    demote_allocs: list = []  # RCL-7: the batch's Host destinations, placed together
    host_offsets: list = []
    batch_closed = False
    unit = state.pool(gap.pool).spec.unit_bytes
    batch = _Batch(state, cache)
    for a in ranked:
        if len(freed_ids) >= gap.amount:
            break
        new = set(a.objects) - freed_ids
        if not new:
            continue  # RCL-7: adds nothing (judged by physical identity)
        if budgeted and loss + a.loss >= applicant.budget and a.loss > 0:
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
    return _drop_unneeded_device(chosen, gap.amount)


def _drop_unneeded_device(chosen: list, amount: int) -> list:
    for a in reversed(list(chosen)):
        rest = [b for b in chosen if b is not a]
        if len({o for b in rest for o in b.objects}) >= amount:
            chosen = rest
    return chosen


def _select_host(state, cache, gap, applicant, ok, excluded, order=None, memo=None) -> Quote:
    """HOST-1/2: duplicates first; then actions that make the request fit before those that
    only add bytes; benefit capped by the byte gap (or the largest allocation when bytes
    suffice but nothing fits); drop what is no longer needed; nothing if it cannot fit.
    `order(rank, cap)`, when given, yields the admissible actions in `rank` order instead of
    `ok` (the victim order's lazy walk, ledger/victim_select.py); `memo`, when given, keeps the
    figures of actions alone on this arena for the quotes on the same states
    (`victim_select.HostMemo`)."""
    arena = state.arena
    allocs = list(gap.allocations) or [host.HostAllocation(gap.amount)]
    need = sum(a.size for a in allocs)
    fits_after = host.FitQuery(arena, allocs)  # HOST-1: one placement query, asked per freeing set
    if fits_after(()):
        return Quote(gap, applicant, Ranking(tuple(ok or ()), excluded), (), 0, 0, True, state, cache)
    byte_gap = max(0, need - arena.free_bytes)
    cap = byte_gap or max(a.size for a in allocs)
    budgeted = applicant.kind in (ApplicantKind.CAPTURE, ApplicantKind.WRITEBACK) and not applicant.demand_time

    def key(a):  # the rank but for "fits alone", which is placed in front by `_fits_first`
        useful = min(a.frees, cap) or 1
        base = _rank_key(a, cap)
        return (a.kind != "drop_replica", base[:2]), (base[2], a.loss / useful, base[3:])

    ordered = sorted(ok, key=key) if order is None else order(key, cap)

    # One allocation (a block, or a KV page group HOST-3 may halve) fits by a figure `host.Freeing`
    # keeps as frees grow: the largest extent holds the block, or the extents hold the group's pages.
    one = allocs[0] if len(allocs) == 1 else None
    page = one.size // one.pieces if one is not None and one.pieces > 1 else 0
    if page:
        base = memo.figure(("page count", page), lambda: host.page_count(arena, page)) if memo is not None \
            else host.page_count(arena, page)
    else:
        base = None

    def enough(largest: int, pages: int) -> bool:
        return pages >= one.pieces if page else largest >= need

    def figure(name, measure, a):  # a figure of action `a` alone, kept per states by the memo
        return memo.alone(a, name, measure) if memo is not None else measure(a)

    def alone(a) -> tuple[int, int]:
        g = host.Freeing(arena, a.offsets, page, base)
        return g.largest, g.pages

    def host_bytes(a) -> int:
        return sum(map(arena.used.__getitem__, a.offsets))

    def fits(a):  # "fits alone": no at once when the freed bytes cannot cover the gap
        if one is None:
            return figure(tuple(allocs), lambda b: fits_after(b.offsets), a)
        if need > arena.free_bytes + figure("bytes", host_bytes, a):
            return False
        return enough(*figure(("freed", page), alone, a))
    ranked = _fits_first(ordered, key, fits)
    chosen, offsets, loss = [], {}, 0
    # HOST-1: the request cannot fit before the freed bytes cover it (what the placement query
    # answers first), so the query is asked only from then on
    used, short = arena.used, need - arena.free_bytes
    grown = host.Freeing(arena, (), page, base) if one is not None else None  # kept as picks free more
    batch = _Batch(state, cache)
    for a in ranked:
        new = [o for o in a.offsets if o not in offsets]
        if not new:
            continue  # its bytes already leave with a chosen action (no double counting, HOST-2)
        if budgeted and a.loss > 0 and loss + a.loss >= applicant.budget:
            continue  # RCL-11
        got = batch.check(a)
        if got is None:
            continue  # RCL-5/RCL-7: never drop a replica of what the chosen deletions free
        a, subsumed = got
        batch.take(a, subsumed, chosen)
        offsets.update(dict.fromkeys(new))
        short -= sum(map(used.__getitem__, new))
        loss += a.loss
        if grown is not None:
            grown.add(new)
            if enough(grown.largest, grown.pages):
                break
        elif short <= 0 and fits_after(list(offsets)):
            break
    else:  # HOST-2: delete nothing
        return Quote(gap, applicant, ranked.ranking(excluded), (), 0, 0, False, state, cache)
    # HOST-2: drop actions no longer needed, the last chosen first. Shared offsets are freed once:
    # `times` counts the chosen actions freeing each, so the bytes left without an action are known
    # before any placement test; a block keeps the allocations in the extents that hold it (an
    # action freeing none of them goes as it is).
    holding = grown.beyond(need) if one is not None and not page else None
    times: dict = {}
    for b in chosen:
        for o in b.offsets:
            times[o] = times.get(o, 0) + 1
    have = sum(map(used.__getitem__, times))
    # page groups: the frees of the actions kept so far, so a drop that would leave too few
    # pages is refused from a bound (`pages_without`) before the extents are built again
    cur = None
    if page:
        cur = grown if times.keys() == offsets.keys() else host.Freeing(arena, list(times), page, base)
    for a in reversed(list(chosen)):
        own = [o for o in a.offsets if times[o] == 1]
        left_bytes = have - sum(map(used.__getitem__, own))
        if need - arena.free_bytes > left_bytes:
            continue  # the rest cannot cover the request
        rest = [b for b in chosen if b is not a]
        if holding is not None and holding.isdisjoint(a.offsets):
            pass  # the extents that hold the block stay as they are
        else:
            left = list({o: None for b in rest for o in b.offsets})
            if one is None:
                if not fits_after(left):
                    continue
            else:
                if cur is not None and cur.pages_without(own) < one.pieces:
                    continue
                again = host.Freeing(arena, left, page, base)
                if not enough(again.largest, again.pages):
                    continue
                if holding is not None:
                    holding = again.beyond(need)
                if cur is not None:
                    cur = again
        chosen, have = rest, left_bytes
        for o in a.offsets:
            times[o] -= 1
    freed = sum(arena.used[o] for o in {o: None for b in chosen for o in b.offsets})
    return Quote(gap, applicant, ranked.ranking(excluded), tuple(chosen), freed, sum(a.loss for a in chosen),
                 True, state, cache)


class _fits_first:
    """HOST-2's order over actions sorted by every other part of the rank: within each class
    (duplicates, then deletions by revocation rung) the actions that let the request fit alone
    come first. "Fits alone" is a first-fit placement test on the arena, the costly part of a
    Host quote, so it is evaluated only for the actions the selection reads: a fitting action
    is yielded as soon as it is met (nothing unread in its class can rank before it), the others
    wait until their class is exhausted. `ranking()` completes the full order on demand."""

    def __init__(self, ordered, key, fits):
        self.ordered, self.key, self.fits = ordered, key, fits  # `ordered`: any iterable, read once
        self.out: list = []  # the order as far as it was read
        self._gen = self._walk()

    def _walk(self):
        key, out, cls, later = self.key, self.out, None, []
        for a in self.ordered:
            c = key(a)[0]
            if c != cls:
                out.extend(later)
                yield from later
                cls, later = c, []
            if self.fits(a):
                out.append(a)
                yield a
            else:
                later.append(a)
        out.extend(later)
        yield from later

    def __iter__(self):
        yield from self.out
        yield from self._gen

    def ranking(self, excluded: int) -> "_LazyHostRanking":
        return _LazyHostRanking(self, excluded)


class _LazyHostRanking:
    """`Ranking` of a Host quote, completed (every placement test run) only when read."""

    def __init__(self, order: _fits_first, excluded: int):
        self._order, self.excluded = order, excluded

    @property
    def actions(self) -> tuple:
        for _ in self._order._gen:
            pass
        return tuple(self._order.out)


def _check_args(state, gap, applicant) -> None:
    if not isinstance(gap, Gap) or not isinstance(applicant, Applicant):
        raise InvalidRequest("quote needs a Gap and an Applicant")
    if gap.pool != HOST:
        state.pool(gap.pool)
    if type(gap.amount) is not int or gap.amount <= 0:
        raise InvalidRequest(f"gap amount must be a positive int, got {gap.amount!r}")


def quote(state: LedgerState, cache: CacheState, gap: Gap, applicant: Applicant, protect=(),
          keep_content=()) -> Quote:
    """A read-only reclamation quote for one typed gap (RCL-2): takes no reference or lease.

    `protect`: objects the applicant uses (its own source, RCL-8): never touched. `keep_content`:
    objects whose content must stay but whose duplicate Device (or Host) replica may go — the
    StateImage a Fork will read from Host (BIND-5).

    Taken through the cache's victim order (ledger/victims.py, ledger/victim_select.py): the
    same selection as `quote_reference`, in O(k log n) for k picks; `Quote.actions` (every
    admissible action, ranked) is enumerated only when read."""
    _check_args(state, gap, applicant)
    if cache.victims is None:
        return quote_reference(state, cache, gap, applicant, protect, keep_content)
    from ledger.victim_select import quote_fast

    return quote_fast(state, cache, gap, applicant, frozenset(protect), frozenset(keep_content))


def quote_facts(state: LedgerState, cache: CacheState):
    """Facts shared by several quotes on the same states (RCL-2): `f = quote_facts(state, cache)`,
    then `f.quote(gap, applicant, protect, keep_content)` per scarce pool and for the revoking
    re-quote; `f.valid_for(state, cache)` says whether they still apply. Each quote equals
    `quote(state, cache, ...)`."""
    from ledger.victim_select import QuoteFacts

    return QuoteFacts(state, cache)


def quote_reference(state: LedgerState, cache: CacheState, gap: Gap, applicant: Applicant, protect=(),
                    keep_content=()) -> Quote:
    """`quote` by full enumeration: every candidate object, every action, one sort (RCL-1..12)."""
    _check_args(state, gap, applicant)
    facts = _Facts(state, cache)
    q = _quote(state, cache, gap, applicant, frozenset(protect), facts, frozenset(keep_content))
    if not q.admitted and applicant.demote and gap.pool != HOST:
        # The greedy selection can let cheap demotions block the deletion that alone closes
        # the gap (a chosen move excludes deleting a holder of what it moves, RCL-5/RCL-7):
        # before giving up, select again from deletions and duplicate drops only (RCL-1: the
        # action set is finite, and a complete admissible set must not be missed).
        q2 = _quote(state, cache, gap, applicant._replace(demote=False), frozenset(protect), facts,
                    frozenset(keep_content))
        if q2.admitted:
            q = q2._replace(applicant=applicant)
    return q._replace(cold=facts._cold or frozenset())


def gap_order(shortfall_pools) -> list:
    """RCL-4, RD-8: handle State first, then Main KV, then backend KV, then the Host arena."""
    def k(pool):
        return (pool == HOST, not pool.startswith("state"), pool != "main_kv", pool)
    return sorted(shortfall_pools, key=k)


def safely_removable(state: LedgerState, cache: CacheState, c: Checkpoint) -> bool:
    """REC-9: a point may be replaced only if no waiter or reader protects it."""
    for oid in c.object_ids():
        o = state.objects.get(oid)
        if o is None or o.leases or any(h[0] == "wait" for h in o.holders):
            return False
    return True


def apply_quote(e: Edit, q: Quote) -> None:
    """Apply a quote's chosen actions to an Edit (deletions, duplicate drops, then one batched
    demotion transaction, RCL-7). Waiters revoked here must reselect (WAIT-2)."""
    if q.cold:
        from ledger.evidence import demote_tiers

        e.cache = demote_tiers(e.cache, q.cold)  # HEAT-4, RD-4: the tier demotions the quote used
    demote, groups = [], []
    for a in q.chosen:
        for hv in a.host_victims:
            _apply_one(e, hv)
        if a.kind == "demote":
            demote.extend(a.objects)
            groups.append(a.objects)
        else:
            _apply_one(e, a)
    # RCL-6/RCL-7: re-validate what moves before the transfer starts: an object this plan's
    # deletions freed (or that is no longer a Device-only replica) leaves the batch, never raises.
    stale = [oid for oid in demote if not _demotable(e.state, oid)]
    if stale:
        e.note("demotion_stale", tuple(stale))
        demote = [oid for oid in demote if oid not in stale]
        groups = [g for g in (tuple(o for o in g if o not in stale) for g in groups) if g]
    if demote and e.state.transaction is None:
        # RCL-7: one transaction for the batch; if its reservation fails, the single groups.
        for objs in [tuple(demote)] + (groups if len(groups) > 1 else []):
            got = plan_begin_transfer(e.state, TransferRequest(TxnKind.DEMOTION, ("reclaim",), objs, HOST_MEDIUM,
                                                               drop_source=True))
            if not isinstance(got, Refusal):
                e.add(got)
                e.note("demotion", got.proof.generation, objs)
                break
            e.note("demotion_refused", got.reason, objs)


def _demotable(state: LedgerState, oid: int) -> bool:
    """Still alive and held, with a complete Device replica and no Host one (RCL-6)."""
    o = state.objects.get(oid)
    return o is not None and bool(o.holders) and o.device is not None and o.device.complete and o.host is None


def _apply_one(e: Edit, a: Action) -> None:
    for req in a.waiters:
        if req in e.cache.waiters:
            e.end_wait(req)  # WAIT-2: the request must reselect
            e.note("revoked_wait", req)
    if a.kind == "drop_replica":
        for oid in a.objects:
            o = e.state.objects.get(oid)
            other = None if o is None else (o.host if a.medium == DEVICE else o.device)
            if o is None or o.replica(a.medium) is None or other is None or not other.complete:
                e.note("drop_stale", oid)  # RCL-5/RCL-7: freed by this plan's deletions: nothing to drop
                continue
            got = e.add(plan_drop_replica(e.state, oid, a.medium))
            if isinstance(got, Refusal):
                e.note("drop_refused", oid, got.reason)  # the stale part is refused, the rest applies
        return
    for cid in a.cids:
        c = e.cache.checkpoints.get(cid)
        if c is None:
            continue
        if c.kind == PointKind.SNAPSHOT:  # PAUSE-4: the paused request turns to Replay
            req = c.owner[1]
            use = e.cache.active.get(req)
            if use is not None:
                e.set(active=e.cache.active.set(req, use._replace(snapshot=None)))
        e.drop_point(cid)
        e.note("deleted", cid)


def plan_reclaim(state: LedgerState, cache: CacheState, q: Quote) -> CacheResult | Refusal:
    """Commit a quote's victim set (RCL-2: a quote is void once anything changed)."""
    if q.base is not state or q.cache is not cache:
        return Refusal("stale_quote", None, "resources changed since the quote; quote again (RCL-2)")
    if not q.admitted:
        return Refusal("not_admitted", None, f"no admissible action set closes the gap {q.gap}")
    e = Edit(state, cache)
    apply_quote(e, q)
    victims = tuple((a.kind, a.cids, a.objects) for a in q.chosen)
    return e.finish("reclaim", note=f"gap {q.gap.pool} {q.gap.amount}, loss {q.loss}", victims=victims)


from ledger import victim_select as _victim_select  # noqa: E402,F401  (quote's fast path, loaded with the module)
