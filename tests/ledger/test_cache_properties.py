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
from ledger_helpers import SETTINGS

STATS = {"capacity": 0, "turns": 0, "captures": 0, "reclaim": 0, "admitted": 0, "deleted": 0}
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

    @initialize(cfg=st.sampled_from([(16, 4, 2 * 1024 + 4096, 24), (10, 3, 0, 0), (40, 6, 4 * 4096, 16)]))
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
        v = [o for o in res.outcome if o[0] == "view"][0]
        self.views[req] = L.SequenceView(req, ident.prefix(cand.frontier), v[1], v[2])
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
        self.paused[req] = self.tokens[req][: v.frontier]

    @precondition(lambda self: self.paused)
    @rule(i=st.integers(0, 9))
    def resume(self, i):
        req = sorted(self.paused)[i % len(self.paused)]
        toks = self.paused[req]
        snap = self.sim.cache.active[req].snapshot
        cands = L.query_sources(self.sim.state, self.sim.cache, L.SourceQuery(req, L.identity_of(toks), snapshot=snap))
        cand = cands[0]
        if cand.missing or cand.blocked:
            return
        res = L.plan_bind(self.sim.state, self.sim.cache, L.BindRequest(req, cand, resume=True))
        if self._apply(res):
            v = [o for o in res.outcome if o[0] == "view"][0]
            self.views[req] = L.SequenceView(req, L.identity_of(toks).prefix(cand.frontier), v[1], v[2])
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


def _end_paused(sim, req):
    """A paused request is cancelled: it holds no view; only its snapshot and binding go."""
    return L.plan_cancel_paused(sim.state, sim.cache, req)


CacheMachine.TestCase.settings = settings(SETTINGS, max_examples=50, stateful_step_count=30)
test_cache_random_operation_sequences = CacheMachine.TestCase
