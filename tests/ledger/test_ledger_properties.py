"""Long random sequences of reserve / settle / allocate / share / lease / transfer / cancel /
release (hypothesis stateful testing).

After every step: check_integrity() holds (no pool over capacity, free + used = capacity,
reserved = sum of permits, arena extents tile without overlap, leases and transaction
consistent) and holder sets equal a plain-Python model. Refused joint reservations change
nothing and report the exact shortfall (RES-2). Stale plans either replay correctly or are
refused whole. At the end everything is released and every pool and the arena are empty.
"""
from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import ledger as L
from ledger.ops import SwapObject
from ledger_helpers import PAGE, SLOT, fresh

POOLS = (L.MAIN_KV, L.STATE_POOL, "backend_kv:mtp")
OWNERS = ("a", "b", "c", "d")
HOLDERS = ("r1", "r2", "r3", "shared")
idx = st.integers(0, 1 << 20)


def _pick(seq, i):
    seq = sorted(seq, key=repr)
    return seq[i % len(seq)] if seq else None


class LedgerMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.s = fresh(main=12, slots=3, backend=6, host=6 * PAGE + SLOT + SLOT // 2)
        self.holders: dict[int, set] = {}  # model: object -> holders
        self.permits: dict[int, object] = {}  # model: permit -> owner
        self.leases: dict[int, object] = {}  # model: lease -> owner (outside transactions)
        self.history: list[L.LedgerState] = []

    # -- helpers ----------------------------------------------------------------------------
    def commit(self, plan):
        assert isinstance(plan, L.Plan), plan
        self.history = (self.history + [self.s])[-6:]
        self.s = L.commit(self.s, plan)
        return plan

    def unchanged(self, before):
        assert self.s is before

    def live(self):
        return [o for o in self.s.objects.values() if o.holders]

    # -- RES ----------------------------------------------------------------------------------
    @rule(owner=st.sampled_from(OWNERS), main=st.integers(0, 6), slots=st.integers(0, 2),
          backend=st.integers(0, 4), recovery=st.booleans())
    def reserve(self, owner, main, slots, backend, recovery):
        kind = L.UnitKind.RECOVERY if recovery else L.UnitKind.PREFILL
        d = L.UnitDemand(owner, kind, {L.MAIN_KV: main, L.STATE_POOL: slots, "backend_kv:mtp": backend})
        avail = {p: self.s.pool(p).available for p in POOLS}
        before = self.s
        r = L.plan_unit_permit(self.s, d)
        if isinstance(r, L.Refusal):
            if r.reason == "recovery_permit_held":
                assert recovery and self.s.recovery_permit is not None
            else:  # RES-2: the exact shortfall of every short pool, and nothing reserved
                want = {p: n - avail[p] for p, n in d.amounts.items() if n > avail[p]}
                assert dict(r.shortfall.pools) == want
            self.unchanged(before)
            return
        self.commit(r)
        for p, n in d.amounts.items():
            assert self.s.pool(p).available == avail[p] - n
        self.permits[r.proof.permits[0]] = owner

    @rule(rows=st.lists(st.tuples(st.sampled_from(OWNERS), st.integers(0, 3)), min_size=1, max_size=5))
    def cycle(self, rows):
        p = L.plan_cycle_permits(self.s, [L.UnitDemand(o, L.UnitKind.DECODE, {L.MAIN_KV: n}) for o, n in rows])
        self.commit(p)
        for (owner, _), got in zip(rows, p.proof.rows):
            if not isinstance(got, L.Refusal):
                self.permits[got] = owner

    @precondition(lambda self: self.permits)
    @rule(i=idx)
    def settle(self, i):
        pid = _pick(self.permits, i)
        if self.s.transaction is not None and self.s.transaction.permit_id == pid:
            return
        self.commit(L.plan_settle(self.s, pid, self.permits.pop(pid)))

    # -- objects --------------------------------------------------------------------------------
    @rule(pool=st.sampled_from(POOLS), n=st.integers(1, 3), holder=st.sampled_from(HOLDERS), i=idx,
          from_permit=st.booleans())
    def allocate(self, pool, n, holder, i, from_permit):
        kw = {}
        if from_permit:
            ok = [pid for pid in self.permits if self.s.permits[pid].remaining.get(pool, 0) >= n]
            if ok:
                pid = _pick(ok, i)
                kw = {"permit_id": pid, "owner": self.permits[pid]}
        avail = self.s.pool(pool).available
        before = self.s
        r = L.plan_allocate(self.s, pool, n, holder, **kw)
        if isinstance(r, L.Refusal):
            assert not kw and dict(r.shortfall.pools) == {pool: n - avail}
            self.unchanged(before)
            return
        self.commit(r)
        for oid, _, _ in r.proof.allocated:
            self.holders[oid] = {holder}

    @precondition(lambda self: self.holders)
    @rule(i=idx, holder=st.sampled_from(HOLDERS))
    def share(self, i, holder):
        live = [oid for oid, h in self.holders.items() if h and holder not in h]
        if not live:
            return
        oid = _pick(live, i)
        self.commit(L.plan_add_holders(self.s, [oid], holder))
        self.holders[oid].add(holder)

    @precondition(lambda self: self.holders)
    @rule(i=idx, j=idx)
    def drop(self, i, j):
        held = [oid for oid, h in self.holders.items() if h]
        if not held:
            return
        oid = _pick(held, i)
        holder = _pick(self.holders[oid], j)
        o = self.s.objects[oid]
        p = self.commit(L.plan_drop_holders(self.s, [oid], holder))
        self.holders[oid].discard(holder)
        freed = not self.holders[oid] and not o.leases and not o.pins
        assert (p.proof.freed == (oid,)) == freed and (oid not in self.s.objects) == freed

    @precondition(lambda self: self.holders)
    @rule(i=idx, stranger=st.sampled_from(HOLDERS))
    def release_by_non_holder(self, i, stranger):
        held = [oid for oid, h in self.holders.items() if h and stranger not in h]
        if not held:
            return
        before = self.s
        with pytest.raises(L.NotAHolder):
            L.plan_drop_holders(self.s, [_pick(held, i)], stranger)
        self.unchanged(before)

    @rule(i=idx, medium=st.sampled_from((L.DEVICE, L.HOST_MEDIUM)),
          owner=st.sampled_from(OWNERS))
    def lease(self, i, medium, owner):
        ok = [o.object_id for o in self.live() if o.replica(medium) is not None and o.replica(medium).complete]
        if not ok:
            return
        p = self.commit(L.plan_lease(self.s, [_pick(ok, i)], medium, owner))
        self.leases[p.proof.leases[0]] = owner

    @precondition(lambda self: self.leases)
    @rule(i=idx, twice=st.booleans())
    def release_lease(self, i, twice):
        lid = _pick(self.leases, i)
        owner = self.leases.pop(lid)
        self.commit(L.plan_release_leases(self.s, [lid], owner))
        if twice:  # double release: typed error, nothing changes
            before = self.s
            with pytest.raises(L.UnknownLease):
                L.plan_release_leases(self.s, [lid], owner)
            self.unchanged(before)

    @rule(i=idx, medium=st.sampled_from((L.DEVICE, L.HOST_MEDIUM)))
    def drop_replica(self, i, medium):
        other = L.HOST_MEDIUM if medium == L.DEVICE else L.DEVICE
        ok = [o.object_id for o in self.s.objects.values()
              if o.replica(medium) is not None and o.replica(medium).complete
              and o.replica(other) is not None and o.replica(other).complete]
        if not ok:
            return
        r = L.plan_drop_replica(self.s, _pick(ok, i), medium)
        if isinstance(r, L.Refusal):
            assert r.reason == "protected"
            return
        self.commit(r)

    # -- TXN ----------------------------------------------------------------------------------
    @rule(picks=st.lists(idx, min_size=1, max_size=4, unique=True), to=st.sampled_from((L.DEVICE, L.HOST_MEDIUM)),
          drop=st.booleans(), group=st.integers(1, 4), owner=st.sampled_from(OWNERS),
          permit=st.integers(0, 2))
    def begin_transfer(self, picks, to, drop, group, owner, permit):
        src = L.HOST_MEDIUM if to == L.DEVICE else L.DEVICE
        ok = [o.object_id for o in self.live()
              if o.replica(to) is None and o.replica(src) is not None and o.replica(src).complete]
        oids = sorted({_pick(ok, i) for i in picks}) if ok else []
        if not oids:
            return
        demand = L.UnitDemand(owner, L.UnitKind.PREFILL, {L.MAIN_KV: permit}) if permit else None
        before = self.s
        r = L.plan_begin_transfer(self.s, L.TransferRequest(L.TxnKind.CAPTURE, owner, oids, to, drop, group, demand))
        if isinstance(r, L.Refusal):
            assert r.reason in ("transaction_busy", "shortfall")
            assert (r.reason == "transaction_busy") == (before.transaction is not None)
            self.unchanged(before)
            return
        self.commit(r)
        if r.proof.permits:
            self.permits[r.proof.permits[0]] = owner

    @precondition(lambda self: self.s.transaction is not None)
    @rule(action=st.sampled_from(("next", "next", "next", "cancel", "late", "wrong")))
    def advance(self, action):
        t = self.s.transaction
        before = self.s
        if action == "late":  # a completion from an older generation (TXN-2)
            with pytest.raises(L.StaleGeneration):
                L.plan_complete(self.s, t.generation - 1)
            self.unchanged(before)
            return
        nxt = {L.TxnPhase.RESERVED: L.plan_submit, L.TxnPhase.SUBMITTED: L.plan_complete,
               L.TxnPhase.CANCELLING: L.plan_complete, L.TxnPhase.COMPLETED: L.plan_publish}[t.phase]
        if action == "wrong":  # a step out of order: typed error, nothing changes
            wrong = L.plan_publish if t.phase != L.TxnPhase.COMPLETED else L.plan_submit
            with pytest.raises(L.TransactionStateError):
                wrong(self.s, t.generation)
            self.unchanged(before)
            return
        if action == "cancel" and t.phase == L.TxnPhase.CANCELLING:
            with pytest.raises(L.TransactionStateError):
                L.plan_cancel(self.s, t.generation)
            return
        self.commit((nxt if action == "next" else L.plan_cancel)(self.s, t.generation))
        if self.s.transaction is None and t.permit_id is not None and t.permit_id not in self.s.permits:
            self.permits.pop(t.permit_id, None)  # reverted together with the transaction

    # -- stale plans --------------------------------------------------------------------------
    @precondition(lambda self: self.history)
    @rule(i=idx, j=idx, which=st.sampled_from(("drop", "settle", "allocate", "reserve")))
    def stale_plan(self, i, j, which):
        old = _pick(range(len(self.history)), i)
        old = self.history[old]
        plan = None
        if which == "drop":
            held = [o for o in old.objects.values() if o.holders]
            if held:
                o = _pick(held, j)
                plan = L.plan_drop_holders(old, [o.object_id], _pick(o.holders, j))
        elif which == "settle":
            p = _pick(old.permits.values(), j)
            if p is not None and (old.transaction is None or old.transaction.permit_id != p.permit_id):
                plan = L.plan_settle(old, p.permit_id, p.owner)
        elif which == "allocate":
            plan = L.plan_allocate(old, L.MAIN_KV, 1, "r1")
        elif which == "reserve":
            plan = L.plan_unit_permit(old, L.UnitDemand("a", L.UnitKind.DECODE, {L.MAIN_KV: 1}))
        if not isinstance(plan, L.Plan):
            return
        before = self.s
        try:
            new = L.commit(self.s, plan)
        except L.StalePlan:
            self.unchanged(before)  # refused whole
            return
        # It replayed: every op's precondition held on the current state.
        L.check_integrity(new)
        self.history = (self.history + [self.s])[-6:]
        self.s = new
        if which == "drop":
            (oid,) = [op.after.object_id for op in plan.ops if isinstance(op, SwapObject)][:1]
            self.holders[oid] = set(new.objects[oid].holders) if oid in new.objects else set()
        elif which == "settle":
            self.permits.pop(plan.proof.permits[0], None)
        elif which == "allocate":
            for oid, _, _ in plan.proof.allocated:
                self.holders[oid] = {"r1"}
        else:
            self.permits[plan.proof.permits[0]] = "a"

    # -- invariants -----------------------------------------------------------------------------
    @invariant()
    def integrity(self):
        rc = L.check_integrity(self.s)
        for pid, pool in rc.pools.items():
            assert pool["used"] + pool["free"] == pool["capacity"] and pool["reserved"] <= pool["free"]
        assert {oid: set(o.holders) for oid, o in self.s.objects.items() if o.holders} == \
               {oid: h for oid, h in self.holders.items() if h}
        assert set(self.s.permits) == set(self.permits)
        assert rc.holders == sum(len(h) for h in self.holders.values())

    def teardown(self):
        s = self.s
        t = s.transaction
        if t is not None:
            if t.phase == L.TxnPhase.SUBMITTED:
                s = L.commit(s, L.plan_complete(s, t.generation))
            if s.transaction is not None and s.transaction.phase == L.TxnPhase.CANCELLING:
                s = L.commit(s, L.plan_complete(s, t.generation))
            if s.transaction is not None:
                s = L.commit(s, L.plan_cancel(s, t.generation))
        if s.leases:
            by_owner = {}
            for lid, lease in s.leases.items():
                by_owner.setdefault(lease.owner, []).append(lid)
            for owner, lids in by_owner.items():
                s = L.commit(s, L.plan_release_leases(s, lids, owner))
        if s.permits:
            s = L.commit(s, L.plan_settle_all(s, [(p.permit_id, p.owner) for p in s.permits.values()]))
        for oid, o in list(s.objects.items()):
            for h in o.holders:
                s = L.commit(s, L.plan_drop_holders(s, [oid], h))
        L.check_integrity(s)
        # Everything is free at the end.
        assert not s.objects and not s.permits and not s.leases and s.transaction is None
        for pool in s.pools.values():
            assert len(pool.free) == pool.spec.capacity and pool.reserved == 0
        assert s.arena.used_bytes == 0 and s.arena.free.count == 1 and s.arena.free_bytes == s.arena.capacity


LedgerMachine.TestCase.settings = settings(max_examples=50, stateful_step_count=60, deadline=None,
                                           derandomize=True, database=None)
test_ledger_random_sequences = LedgerMachine.TestCase


@pytest.mark.parametrize("seed", range(6))
def test_ledger_long_random_walk(seed):
    """The same rules driven by a seeded random walk of 600 steps: long sequences where every
    operation occurs many times (hypothesis' swarm testing leaves some rules out of a run)."""
    import random

    rng = random.Random(seed)
    m = LedgerMachine()
    n = lambda: rng.randrange(1 << 20)  # noqa: E731
    steps = [
        lambda: m.reserve(rng.choice(OWNERS), rng.randint(0, 6), rng.randint(0, 2), rng.randint(0, 4),
                          rng.random() < 0.2),
        lambda: m.cycle([(rng.choice(OWNERS), rng.randint(0, 3)) for _ in range(rng.randint(1, 5))]),
        lambda: m.permits and m.settle(n()),
        lambda: m.allocate(rng.choice(POOLS), rng.randint(1, 3), rng.choice(HOLDERS), n(), rng.random() < 0.5),
        lambda: m.allocate(L.MAIN_KV, rng.randint(1, 3), rng.choice(HOLDERS), n(), rng.random() < 0.5),
        lambda: m.holders and m.share(n(), rng.choice(HOLDERS)),
        lambda: m.holders and m.drop(n(), n()),
        lambda: m.holders and m.release_by_non_holder(n(), rng.choice(HOLDERS)),
        lambda: m.lease(n(), rng.choice((L.DEVICE, L.HOST_MEDIUM)), rng.choice(OWNERS)),
        lambda: m.leases and m.release_lease(n(), rng.random() < 0.3),
        lambda: m.drop_replica(n(), rng.choice((L.DEVICE, L.HOST_MEDIUM))),
        lambda: m.begin_transfer(list({n() for _ in range(rng.randint(1, 4))}), rng.choice((L.DEVICE, L.HOST_MEDIUM)),
                                 rng.random() < 0.5, rng.randint(1, 4), rng.choice(OWNERS), rng.randint(0, 2)),
        lambda: m.s.transaction is not None and m.advance(rng.choice(("next", "next", "next", "cancel", "late", "wrong"))),
        lambda: m.s.transaction is not None and m.advance("next"),
        lambda: m.history and m.stale_plan(n(), n(), rng.choice(("drop", "settle", "allocate", "reserve"))),
    ]
    for _ in range(600):
        rng.choice(steps)()
        m.integrity()
    m.teardown()
