"""Random operation sequences over the cache policy (hypothesis stateful testing).

After every step check_cache() holds (ledger integrity, holder counts exact, index and
records consistent). Reclamation never frees what a waiter (unless revoked by a rule that may),
a reader lease or a pin protects, and every deleted checkpoint belongs to a chosen action (its
loss was counted). A refusal changes nothing. At the end, after cancel, release and clear,
every pool and the Host arena are empty.
"""
from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from cache_helpers import L, make
from ledger.cache_state import seq_holder
from ledger.outcomes import View
from ledger_helpers import SETTINGS
from victim_checks import order_matches_scratch, quotes_agree

STATS = {"capacity": 0, "turns": 0, "captures": 0, "reclaim": 0, "admitted": 0, "deleted": 0, "host_pressure": 0}
PREFIXES = [list(range(1000 + 100 * i, 1000 + 100 * i + 90)) for i in range(3)]


class CacheMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.sim = make(main=16, slots=4, host=2 * 1024 + 4096, chunk=64, backend=24)
        self.views: dict = {}  # active request -> view
        self.tokens: dict = {}
        self.paused: dict = {}  # request -> (tokens, snapshot cid or None)
        self.leases: list = []  # lease ids
        self.pins: list = []  # object ids pinned by "pinner"
        self.n = 0

    # The last: a tiny Host arena (two StateImage blocks) under Main KV pressure, where Host
    # demotions need victims that may hold the very pages demoted (RCL-5, RCL-7).
    @initialize(cfg=st.sampled_from([(16, 4, 2 * 1024 + 4096, 24), (10, 3, 0, 0), (40, 6, 4 * 4096, 16),
                                     (12, 4, 2 * 4096, 0)]))
    def configure(self, cfg):
        main, slots, host, backend = cfg
        self.sim = make(main=main, slots=slots, host=host, chunk=64, backend=backend)

    # -- helpers -----------------------------------------------------------------------------
    def _apply(self, res):
        if isinstance(res, L.Refusal):
            return False
        self.sim.apply(res)
        return True

    # -- rules -----------------------------------------------------------------------------------
    @rule(p=st.integers(0, 2), extra=st.integers(0, 150), pick=st.integers(0, 5))
    def admit(self, p, extra, pick):
        if len(self.views) >= 3:
            return
        self.n += 1
        req = f"r{self.n}"
        toks = PREFIXES[p] + [(self.n * 7 + i) % 500 for i in range(extra)]
        ident = L.identity_of(toks)
        cands = L.query_sources(self.sim.state, self.sim.cache, L.SourceQuery(req, ident))
        cand = cands[pick % len(cands)]
        if cand.missing or cand.blocked:
            return
        before = (self.sim.state, self.sim.cache)
        res = L.plan_bind(self.sim.state, self.sim.cache, L.BindRequest(req, cand, ticket=self.n))
        if isinstance(res, L.Refusal):
            assert (self.sim.state, self.sim.cache) == before
            return
        self.sim.apply(res)
        v = [o for o in res.outcome if isinstance(o, View)][0]
        self.views[req] = L.SequenceView(req, ident.prefix(cand.frontier), v.state_object, v.kv)
        self.tokens[req] = toks

    @rule(p=st.integers(0, 2), extra=st.integers(1, 120), shared=st.booleans())
    def whole_turn(self, p, extra, shared):
        """One whole request through the simulator (bind, chunks, captures, E)."""
        if len(self.views) >= 2:
            return
        self.n += 1
        toks = PREFIXES[p] + [(self.n * 11 + i) % 500 for i in range(extra)]
        saves = [L.simulate.SavePoint(90, L.PointKind.SHARED if shared else L.PointKind.ANCHOR),
                 L.simulate.SavePoint(len(toks))]
        try:
            self.sim.run(f"t{self.n}", toks, saves, output=(1, 2, 3))
            STATS["turns"] += 1
        except L.simulate.CapacityError:  # RES-6 with the others resident: it was cancelled
            assert f"t{self.n}" not in self.sim.cache.active
            STATS["capacity"] += 1

    @precondition(lambda self: self.views)
    @rule(i=st.integers(0, 9), step=st.integers(1, 100))
    def compute(self, i, step):
        req = sorted(self.views)[i % len(self.views)]
        v = self.views[req]
        upto = min(len(self.tokens[req]), v.frontier + step)
        try:
            self.views[req] = self.sim.grow(v, L.identity_of(self.tokens[req]), upto)
        except L.simulate.CapacityError:
            pass

    @precondition(lambda self: self.views)
    @rule(i=st.integers(0, 9), kind=st.sampled_from(["input", "anchor", None]), shared=st.booleans())
    def capture(self, i, kind, shared):
        req = sorted(self.views)[i % len(self.views)]
        v = self.views[req]
        if v.frontier == 0 or (kind is None and not shared):
            return
        before = (self.sim.state, self.sim.cache)
        res = L.plan_capture(self.sim.state, self.sim.cache, L.CaptureRequest(v, kind, "ResponseReplay", shared))
        if not self._apply(res):
            assert (self.sim.state, self.sim.cache) == before
        else:
            STATS["captures"] += 1

    @precondition(lambda self: self.views)
    @rule(i=st.integers(0, 9), cancel=st.booleans())
    def finish(self, i, cancel):
        req = sorted(self.views)[i % len(self.views)]
        self.sim.apply(L.plan_publish_end(self.sim.state, self.sim.cache, self.views.pop(req), cancel=cancel))

    @precondition(lambda self: self.views)
    @rule(i=st.integers(0, 9), snapshot=st.booleans())
    def pause(self, i, snapshot):
        req = sorted(self.views)[i % len(self.views)]
        v = self.views.pop(req)
        self.sim.apply(L.plan_pause(self.sim.state, self.sim.cache, v, snapshot=snapshot))
        self.paused[req] = self.tokens[req]

    @precondition(lambda self: self.paused)
    @rule(i=st.integers(0, 9), pick=st.integers(0, 3))
    def resume(self, i, pick):
        req = sorted(self.paused)[i % len(self.paused)]
        toks = self.paused[req]  # Replay queries for its whole target; a Snapshot redeems itself (SRC-5)
        snap = self.sim.cache.active[req].snapshot
        cands = L.query_sources(self.sim.state, self.sim.cache, L.SourceQuery(req, L.identity_of(toks), snapshot=snap))
        cand = cands[pick % len(cands)]
        if cand.missing or cand.blocked:
            return
        res = L.plan_bind(self.sim.state, self.sim.cache, L.BindRequest(req, cand, resume=True))
        if self._apply(res):
            v = [o for o in res.outcome if isinstance(o, View)][0]
            self.views[req] = L.SequenceView(req, L.identity_of(toks).prefix(cand.frontier), v.state_object, v.kv)
            self.tokens[req] = toks
            del self.paused[req]

    @rule(p=st.integers(0, 2), extra=st.integers(0, 60), ticket=st.integers(0, 50))
    def wait(self, p, extra, ticket):
        self.n += 1
        req = f"w{self.n}"
        toks = PREFIXES[p] + list(range(extra))
        cands = [c for c in L.query_sources(self.sim.state, self.sim.cache, L.SourceQuery(req, L.identity_of(toks)))
                 if c.cid is not None]
        if cands:
            self.sim.apply(L.plan_wait(self.sim.state, self.sim.cache, req, cands[0], ticket=ticket))

    @precondition(lambda self: self.sim.state.transaction is None and self.sim.cache.checkpoints)
    @rule(i=st.integers(0, 999), n=st.integers(1, 3), to_host=st.booleans())
    def begin_transfer(self, i, n, to_host):
        """A Host demotion (or a bind read-back) left in flight across later steps (TXN-1)."""
        cps = sorted(self.sim.cache.checkpoints)
        c = self.sim.cache.checkpoints[cps[i % len(cps)]]
        objs = self.sim.state.objects
        if to_host:
            ids = [o for o in c.object_ids() if objs[o].device is not None and objs[o].host is None][:n]
            req = L.TransferRequest(L.TxnKind.DEMOTION, "mover", ids, L.HOST_MEDIUM, drop_source=True)
        else:
            ids = [o for o in c.object_ids() if objs[o].device is None][:n]
            req = L.TransferRequest(L.TxnKind.BIND, "mover", ids, L.DEVICE)
        if ids:
            self._apply(L.plan_begin_transfer(self.sim.state, req))

    @precondition(lambda self: self.sim.state.transaction is not None)
    @rule()
    def advance_transfer(self):
        t = self.sim.state.transaction
        step = {"reserved": L.plan_submit, "submitted": L.plan_complete, "completed": L.plan_publish,
                "cancelling": L.plan_complete}[t.phase]
        self.sim.apply(step(self.sim.state, t.generation))

    @precondition(lambda self: self.sim.cache.waiters)
    @rule(i=st.integers(0, 9))
    def release_wait(self, i):
        req = sorted(self.sim.cache.waiters)[i % len(self.sim.cache.waiters)]
        self.sim.apply(L.plan_release_wait(self.sim.state, self.sim.cache, req))

    @precondition(lambda self: self.sim.cache.checkpoints)
    @rule(i=st.integers(0, 999))
    def lease(self, i):
        cps = sorted(self.sim.cache.checkpoints)
        c = self.sim.cache.checkpoints[cps[i % len(cps)]]
        o = self.sim.state.objects[c.state]
        medium = L.DEVICE if o.device is not None and o.device.complete else L.HOST_MEDIUM
        if o.replica(medium) is None or not o.replica(medium).complete:
            return
        p = L.plan_lease(self.sim.state, [c.state], medium, "reader")
        self.sim.apply(p)
        self.leases.append(p.proof.leases[0])

    @precondition(lambda self: self.sim.cache.checkpoints)
    @rule(i=st.integers(0, 999))
    def pin(self, i):
        cps = sorted(self.sim.cache.checkpoints)
        c = self.sim.cache.checkpoints[cps[i % len(cps)]]
        o = self.sim.state.objects[c.state]
        if o.device is None or not o.device.complete or "pinner" in o.pins:
            return
        self.sim.apply(L.plan_pin(self.sim.state, [c.state], "pinner"))
        self.pins.append(c.state)

    @precondition(lambda self: self.pins)
    @rule()
    def unpin(self):
        self.sim.apply(L.plan_unpin(self.sim.state, [self.pins.pop(0)], "pinner"))

    @precondition(lambda self: self.leases)
    @rule()
    def release_lease(self):
        self.sim.apply(L.plan_release_leases(self.sim.state, [self.leases.pop(0)], "reader"))

    @precondition(lambda self: self.sim.cache.checkpoints)
    @rule(i=st.integers(0, 999))
    def demand(self, i):
        """Two requests' new prefill crosses a kept point (HEAT-2): its own repeated demand
        (RCL-9) frees its Host write-back from the cold budget."""
        cps = sorted(self.sim.cache.checkpoints)
        _observe_twice(self.sim, self.sim.cache.checkpoints[cps[i % len(cps)]])

    @rule(pool=st.sampled_from([L.STATE_POOL, L.MAIN_KV, "backend_kv:mtp", L.HOST]), amount=st.integers(1, 6),
          kind=st.sampled_from([L.ApplicantKind.NECESSARY, L.ApplicantKind.CAPTURE]), revoke=st.booleans(),
          budget=st.integers(0, 400))
    def reclaim(self, pool, amount, kind, revoke, budget):
        STATS["reclaim"] += 1
        if pool not in self.sim.state.pools and pool != L.HOST:
            return
        s, c = self.sim.state, self.sim.cache
        if pool == L.HOST:
            amount *= 1024
        ap = L.Applicant(kind, budget=budget, revoke_waiters=revoke and kind == L.ApplicantKind.NECESSARY)
        q = L.quote(s, c, L.Gap(pool, amount), ap)
        assert (self.sim.state, self.sim.cache) == (s, c)  # RCL-2: a quote takes nothing
        L.check_quote(s, c, q)  # RCL-5, RCL-7: it never moves what its own deletions free
        res = L.plan_reclaim(s, c, q)
        if isinstance(res, L.Refusal):
            assert not q.admitted
            return
        protected = {oid for oid, o in s.objects.items() if o.leases or o.pins
                     or any(h[0] == "seq" for h in o.holders)
                     or (not ap.revoke_waiters and any(h[0] == "wait" for h in o.holders))}
        self.sim.apply(res)
        STATS["admitted"] += 1
        after = self.sim.state.objects  # checked at the reclaim's own commit
        for oid in protected:
            assert oid in after, f"protected object {oid} was freed"
            before_o = s.objects[oid]
            if before_o.pins:
                assert after[oid].device == before_o.device, "a pinned Device replica moved"
            if before_o.leases:
                for lid in before_o.leases:
                    lease = s.leases[lid]
                    assert after[oid].replica(lease.medium) is not None, "a leased replica was dropped"
        if self.sim.state.transaction is not None and self.sim.state.transaction.owner == ("reclaim",):
            self.sim.drive_transaction()
        chosen = {cid for a in q.chosen for cid in a.cids if a.kind == "delete"}
        chosen |= {cid for a in q.chosen for v in a.host_victims for cid in v.cids}
        deleted = set(c.checkpoints) - set(self.sim.cache.checkpoints)
        assert deleted <= chosen, "a checkpoint was deleted whose loss was not counted"
        STATS["deleted"] += len(deleted)
        assert q.loss == sum(a.loss for a in q.chosen)

    @invariant()
    def consistent(self):
        L.check_cache(self.sim.state, self.sim.cache)
        for req, v in self.views.items():
            assert seq_holder(req) in self.sim.state.objects[v.state].holders

    @invariant()
    def victim_order(self):
        """RCL-4/RD-8, HEAT-4: the incrementally kept order equals the one ranked from scratch,
        and quotes taken through it equal the full enumeration's (ledger/reclamation/)."""
        order_matches_scratch(self.sim.state, self.sim.cache)
        self.checks = getattr(self, "checks", 0) + 1
        quotes_agree(self.sim.state, self.sim.cache, self.checks)

    def teardown(self):
        sim = self.sim
        for req, v in list(self.views.items()):
            sim.apply(L.plan_publish_end(sim.state, sim.cache, v, cancel=True))
        for req in list(self.paused):
            sim.apply(_end_paused(sim, req))
        for lid in self.leases:
            sim.apply(L.plan_release_leases(sim.state, [lid], "reader"))
        for oid in self.pins:
            sim.apply(L.plan_unpin(sim.state, [oid], "pinner"))
        while sim.state.transaction is not None:
            self.advance_transfer()
        sim.clear()
        s = sim.state
        assert not s.objects and not s.leases and s.arena.used_bytes == 0
        assert all(len(p.free) == p.spec.capacity for p in s.pools.values())


class HostPressureMachine(RuleBasedStateMachine):
    """RCL-5, RCL-7, HOST-1: Main KV pressure with a tiny Host arena. Whole requests leave
    points that share their pages (BIND-3), StateImages are written back to Host until the arena
    is full, and necessary quotes demote pages whose Host room must come from deleting points:
    every quote must be consistent (check_quote) and commit."""

    def __init__(self):
        super().__init__()
        self.sim = make(main=10, slots=6, host=2 * 4096, chunk=64)
        self.n = 0

    @rule(p=st.integers(0, 2), extra=st.sampled_from([60, 170, 200]), out=st.integers(2, 30),
          demand=st.booleans())
    def turn(self, p, extra, out, demand):
        """One whole request (its own shortfalls reclaimed by the simulator): its input point
        and E share their pages (BIND-3) and their StateImages go to Host while there is room;
        with `demand`, two other requests' prefill crossed its input point (RCL-9: its Host
        write-back is not bound by the cold budget)."""
        self.n += 1
        toks = PREFIXES[p] + [(self.n * 11 + i) % 500 for i in range(extra)]
        try:
            self.sim.run(f"t{self.n}", toks, [L.simulate.SavePoint(len(toks))], output=tuple(range(out)))
        except L.simulate.CapacityError:
            return
        mine = [c for c in self.sim.cache.checkpoints.values() if c.identity.tokens[:len(toks)] == tuple(toks)]
        for c in mine:
            self.state_to_host_of(c)
        for c in mine if demand else ():
            if c.frontier == len(toks):
                _observe_twice(self.sim, c)

    @precondition(lambda self: self.sim.cache.checkpoints)
    @rule(i=st.integers(0, 999))
    def state_to_host(self, i):
        """A StateImage written back to Host, its Device slot freed (a Host demotion)."""
        cps = sorted(self.sim.cache.checkpoints)
        self.state_to_host_of(self.sim.cache.checkpoints[cps[i % len(cps)]])

    def state_to_host_of(self, c):
        o = self.sim.state.objects[c.state]
        if o.host is None and o.device is not None and not o.leases and not o.pins:
            got = L.plan_begin_transfer(self.sim.state, L.TransferRequest(
                L.TxnKind.DEMOTION, "mover", [c.state], L.HOST_MEDIUM, drop_source=True))
            if not isinstance(got, L.Refusal):
                self.sim.apply(got)
                self.sim.drive_transaction()

    @precondition(lambda self: self.sim.cache.checkpoints)
    @rule(i=st.integers(0, 999), more=st.sampled_from([0, 0, -2, 3]))
    def reclaim(self, i, more):
        """Necessary execution short of Main KV pages (RCL-8): about one kept history's pages."""
        s, c = self.sim.state, self.sim.cache
        cp = c.checkpoints[sorted(c.checkpoints)[i % len(c.checkpoints)]]
        amount = max(1, sum(len(pages) for _, pages in cp.kv) + more)
        q = L.quote(s, c, L.Gap(L.MAIN_KV, amount), L.Applicant(L.ApplicantKind.NECESSARY))
        L.check_quote(s, c, q)
        res = L.plan_reclaim(s, c, q)
        assert isinstance(res, L.CacheResult) == q.admitted
        if q.admitted:
            STATS["host_pressure"] += any(a.host_victims for a in q.chosen)
            self.sim.apply(res)
            self.sim.drive_transaction()

    @invariant()
    def consistent(self):
        L.check_cache(self.sim.state, self.sim.cache)
        order_matches_scratch(self.sim.state, self.sim.cache)
        self.checks = getattr(self, "checks", 0) + 1
        quotes_agree(self.sim.state, self.sim.cache, self.checks, n=4)

    def teardown(self):
        self.sim.drive_transaction()
        self.sim.clear()
        assert not self.sim.state.objects and self.sim.state.arena.used_bytes == 0


def _observe_twice(sim, c):
    """HEAT-2: two other requests' new prefill crossed c's position: repeated demand there."""
    for req in (("observer", 0), ("observer", 1)):
        sim.cache = L.observe_prefill(sim.cache, req, c.identity, 0, c.frontier, [c.frontier])


def _end_paused(sim, req):
    """A paused request is cancelled: it holds no view; only its snapshot and binding go."""
    return L.plan_cancel_paused(sim.state, sim.cache, req)


CacheMachine.TestCase.settings = settings(SETTINGS, max_examples=50, stateful_step_count=30)
test_cache_random_operation_sequences = CacheMachine.TestCase
HostPressureMachine.TestCase.settings = settings(SETTINGS, max_examples=60, stateful_step_count=15)
test_cache_host_pressure_sequences = HostPressureMachine.TestCase
