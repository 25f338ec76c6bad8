"""The engine side of the context cache: the ledger's policy calls in a request's order.

docs/cache_policy.md is the contract: admission asks for sources and binds the best one (Move
or Fork; tail-page copy-on-write and StateImage copies are the plan's byte effects, which the
Program's stores carry out), prefill reports compute demand and captures at the frontend's
semantic frontiers, a normal finish publishes E, a pause releases the view, and a shortfall
is met by a reclamation quote (demotions to the Host arena run as transactions) before the
operation is planned again (RES-4). The policy state (`CacheState`) lives here beside the
Program's ledger state; every change goes through one `apply`.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import ledger
from ledger import (MAIN_KV, Applicant, ApplicantKind, BindRequest, CacheResult, CaptureRequest, Gap, PointKind,
                    Refusal, SequenceView, SourceQuery, UnitDemand, UnitKind)
from ledger.effects import CopyToDevice, CopyToHost

MAX_RETRIES = 4


class SavePoint(NamedTuple):
    """A semantic save opportunity the frontend chose (SAVE-1): where a chunk must end and
    what to capture there."""

    frontier: int
    private: str | None = PointKind.INPUT  # INPUT | ANCHOR | None (shared only)
    input_kind: str = ledger.InputKind.RAW
    shared: bool = False
    explicit: bool = True


class Bound(NamedTuple):
    frontier: int  # tokens taken from the source
    takeover: str
    state_object: int
    page_objects: tuple[int, ...]
    permit: int | None


class ContextCache:
    def __init__(self, program, counters, *, enabled: bool = True, execution: str = ""):
        self.program = program
        self.counters = counters
        self.enabled = enabled
        self.execution = execution  # model, dtype, backend: state from elsewhere is never adopted (CKP-4)
        self.cache = ledger.empty_cache()
        self.cost = ledger.CostModel()

    # ---- plumbing ------------------------------------------------------------------------
    def identity(self, tokens: Sequence[int]) -> ledger.InputIdentity:
        return ledger.identity_of(tuple(tokens), execution=self.execution)

    def apply(self, res) -> None:
        plan = res.plan if isinstance(res, CacheResult) else res
        for e in plan.effects:
            if isinstance(e, CopyToHost):
                self.counters["d2h_bytes"] += e.nbytes
            elif isinstance(e, CopyToDevice):
                self.counters["h2d_bytes"] += e.nbytes
        self.program.commit(plan)
        if isinstance(res, CacheResult):
            self.cache = res.cache

    def drive_transaction(self) -> None:
        """Run the one context transaction to its end (TXN-1). Copies are synchronous here, so
        submit → complete → publish follow at once."""
        t = self.program.state.transaction
        if t is None:
            return
        for step in (ledger.plan_submit, ledger.plan_complete, ledger.plan_publish):
            self.apply(step(self.program.state, t.generation))

    def reclaim(self, pools: dict, protect=(), applicant: Applicant | None = None, *, revoke: bool = True) -> bool:
        """Meet a shortfall from optional cache (RCL-8 for necessary execution), State first.
        Waiting protection and pause snapshots are revoked only when ordinary reclamation is
        not enough and `revoke` allows it (WAIT-2, SCH-4; RD-3 forbids it while an older
        resident exists)."""
        done = False
        applicant = applicant or Applicant(ApplicantKind.NECESSARY)
        for pool in ledger.gap_order(pools):
            amount = pools[pool]
            if amount <= 0:
                continue
            gap = Gap(pool, amount)
            q = ledger.quote(self.program.state, self.cache, gap, applicant, protect)
            if not q.admitted and revoke:
                q = ledger.quote(self.program.state, self.cache, gap, applicant._replace(revoke_waiters=True), protect)
            if not q.admitted:
                continue
            got = ledger.plan_reclaim(self.program.state, self.cache, q)
            if isinstance(got, Refusal):
                continue
            self.apply(got)
            self.drive_transaction()
            self.counters["reclaims"] += 1
            done = True
        return done

    def retry(self, make, protect=(), applicant: Applicant | None = None, revoke: bool = True):
        """Plan, and on a shortfall reclaim and plan again at once (RES-4)."""
        got = make()
        for _ in range(MAX_RETRIES):
            if not isinstance(got, Refusal) or got.reason != "shortfall" or not got.shortfall:
                return got
            if not self.reclaim(dict(got.shortfall.pools), protect, applicant, revoke=revoke):
                return got
            got = make()
        return got

    # ---- admission: sources and bind -------------------------------------------------------
    def bind(self, request, ident: ledger.InputIdentity, *, session, unit_end, ticket: int, resume: bool,
             snapshot: int | None = None, applicant: Applicant | None = None, revoke: bool = True) -> Bound | Refusal:
        """Query sources for the tokens of `ident` and bind the best one that can be had
        (SRC-*, BIND-*). Returns the binding, or the last Refusal (nothing retired, SRC-4).

        `unit_end(frontier)` is where the unit permit taken with the bind must reach from a
        source at `frontier` (TXN-2): the first chunk or decode step of a fresh request; for a
        paused request (`resume`) the rebuild to its old frontier plus its first real new unit,
        taken in one go as the recovery permit (RES-5). A paused request's own Snapshot is
        redeemed first, with no query (SRC-5). `applicant` and `revoke` bound what reclamation
        may take for it (WAIT-2: fresh admission revokes only younger waiters; RD-3)."""
        query = SourceQuery(request, ident, session if self.enabled else None, snapshot=snapshot)
        cands = ledger.query_sources(self.program.state, self.cache, query, self.cost)
        last: Refusal = Refusal("no_source", None, "no candidate")
        page = ledger.PAGE_TOKENS
        kind = UnitKind.RECOVERY if resume else UnitKind.PREFILL
        for cand in cands:
            if cand.blocked:  # its object is in the running transaction; another candidate serves
                continue
            src = self.cache.checkpoints.get(cand.cid)
            protect = src.object_ids() if src is not None else ()  # the whole source stays (RCL-8)
            need = -(-unit_end(cand.frontier) // page) - -(-cand.frontier // page)
            unit = UnitDemand(ledger.seq_holder(request), kind, {MAIN_KV: max(0, need)})
            permit = None
            if cand.missing:  # a Host copy: bring it back to Device first (BIND-5, TXN-*)
                # TXN-2: a paused-recovery bind takes the full recovery permit with its transfer.
                with_permit = resume
                t = self.retry(lambda c=cand: self._bind_transfer(request, c, unit if with_permit else None),
                               protect, applicant, revoke)
                if isinstance(t, Refusal):
                    last = t
                    continue
                self.apply(t)
                if with_permit:
                    permit = t.proof.permits[0]
                self.drive_transaction()
                cand = next((c for c in ledger.query_sources(self.program.state, self.cache, query, self.cost)
                             if c.cid == cand.cid), None)
                if cand is None or cand.missing:
                    if permit is not None:
                        self.program.commit(ledger.plan_settle(self.program.state, permit, unit.owner))
                    continue
            first = unit if permit is None else None
            got = self.retry(lambda c=cand: ledger.plan_bind(
                self.program.state, self.cache,
                BindRequest(request, c, session, first, ticket=ticket, resume=resume)), protect, applicant, revoke)
            if isinstance(got, Refusal):
                if permit is not None:
                    self.program.commit(ledger.plan_settle(self.program.state, permit, unit.owner))
                last = got
                continue
            self.apply(got)
            view = next(o for o in got.outcome if o[0] == "view")
            if permit is None:
                permit = next((o[1] for o in got.outcome if o[0] == "permit"), None)
            pages = dict(view[2]).get(MAIN_KV, ())
            self._drop_stale_host(view[1], pages, cand.frontier)
            if cand.frontier and not resume:
                self.counters["cache_hits"] += 1
                self.counters["reused_tokens"] += cand.frontier
            return Bound(cand.frontier, cand.takeover, view[1], tuple(pages), permit)
        return last

    def _drop_stale_host(self, state_object: int, pages, frontier: int) -> None:
        """BIND-5: the writer computes into its StateImage and appends into a partial tail
        page in place, so a Host replica of either would go stale: drop it now (the Device
        replica is complete), or a later restore from Host would read old bytes (doctrine 1)."""
        writable = [state_object] + ([pages[-1]] if pages and frontier % ledger.PAGE_TOKENS else [])
        for oid in writable:
            o = self.program.state.objects[oid]
            if o.host is not None:
                self.apply(ledger.plan_drop_replica(self.program.state, oid, ledger.HOST_MEDIUM))

    def _bind_transfer(self, request, cand, permit: UnitDemand | None):
        """TXN-1/2: the bind transaction bringing the candidate's Host-only objects to Device,
        with the recovery permit when it resumes a paused request."""
        if permit is None:
            return ledger.plan_bind_transfer(self.program.state, self.cache, request, cand)
        state = self.program.state
        missing = tuple(o for o in cand.missing if o in state.objects and state.objects[o].device is None)
        if not missing:
            return Refusal("nothing_to_transfer", None, "every object already has a Device replica")
        return ledger.plan_begin_transfer(state, ledger.TransferRequest(ledger.TxnKind.BIND, request, missing,
                                                                        ledger.DEVICE, permit=permit))

    def wait(self, request, ident: ledger.InputIdentity, *, session, ticket: int) -> bool:
        """WAIT-1: a queued request without a lane keeps its chosen source under a waiting
        reference, so optional reclamation cannot take it before the bind (which hands the
        reference over, WAIT-3). Returns whether the request now waits."""
        if not self.enabled or request in self.cache.waiters:
            return request in self.cache.waiters
        query = SourceQuery(request, ident, session)
        best = ledger.query_sources(self.program.state, self.cache, query, self.cost)[0]
        if best.cid is None or best.frontier == 0:
            return False
        got = ledger.plan_wait(self.program.state, self.cache, request, best, ticket=ticket)
        if isinstance(got, Refusal):
            return False
        self.apply(got)
        self.counters["waits"] += 1
        return True

    def release_wait(self, request) -> None:
        """WAIT-4: cancel or timeout ends the waiting reference."""
        if request in self.cache.waiters:
            self.apply(ledger.plan_release_wait(self.program.state, self.cache, request))

    # ---- prefill, captures, ends -------------------------------------------------------------
    @staticmethod
    def view(request, ident: ledger.InputIdentity, state_object, page_objects) -> SequenceView:
        """What the request holds now; `ident` covers exactly its execution frontier."""
        return SequenceView(request, ident, state_object, ((MAIN_KV, tuple(page_objects)),))

    def observe(self, request, ident: ledger.InputIdentity, lo: int, hi: int, candidates: Sequence[int]) -> None:
        """HEAT-2: compute demand of a new prefill commit (never for Replay, PAUSE-5)."""
        if self.enabled and request in self.cache.active:
            self.cache = ledger.observe_prefill(self.cache, request, ident, lo, hi, candidates)

    def capture(self, view: SequenceView, save: SavePoint) -> bool:
        """SAVE-*: capture at a semantic frontier; skipped, never blocking, when refused."""
        if not self.enabled:
            return False
        got = ledger.plan_capture(self.program.state, self.cache, CaptureRequest(
            view, save.private, save.input_kind, shared=save.shared, explicit=save.explicit))
        if isinstance(got, Refusal):
            self.counters["captures_skipped"] += 1
            return False
        self.apply(got)
        kept = sum(1 for o in got.outcome if o[0] in ("private", "shared"))
        self.counters["captures"] += kept
        self.counters["captures_skipped"] += sum(1 for o in got.outcome if o[0].endswith("_skipped"))
        return kept > 0

    def end(self, view: SequenceView, *, publish: bool) -> None:
        """BIND-6: a normal finish publishes E; a cancel or an error only releases."""
        self.apply(ledger.plan_publish_end(self.program.state, self.cache, view,
                                           cancel=not (publish and self.enabled)))

    def pause(self, view: SequenceView, *, snapshot: bool) -> int | None:
        """PAUSE-2: release the writable view and keep the binding to the record; a Snapshot
        also keeps the execution position as the request's own checkpoint (its id returned)."""
        got = ledger.plan_pause(self.program.state, self.cache, view, snapshot=snapshot)
        self.apply(got)
        return self.cache.active[view.request].snapshot

    def snapshot_of(self, request) -> int | None:
        use = self.cache.active.get(request)
        return None if use is None else use.snapshot

    def offload(self, request, snapshot: int, *, publication: int) -> int | None:
        """PAUSE-3: copy the Snapshot's content that no active request reads and that has no
        Host replica to the Host arena and free its Device units (immutable pages other
        actives use stay shared; a safe duplicate Device replica is simply dropped). Room on
        Host may come from optional cache and later tickets' snapshots (RCL-10). Returns the
        bytes copied, or None when the content cannot be placed (the caller turns to Replay)."""
        state = self.program.state
        c = self.cache.checkpoints[snapshot]
        move, dups = [], []
        for oid in c.object_ids():
            o = state.objects[oid]
            if o.device is None or not o.device.complete or o.leases or o.pins:
                continue
            if any(h[0] == "seq" for h in o.holders):
                continue  # another active computes on it: it stays shared on Device
            (dups if o.host is not None and o.host.complete else move).append(oid)
        for oid in dups:
            self.apply(ledger.plan_drop_replica(self.program.state, oid, ledger.DEVICE))
        if not move:
            return 0
        applicant = Applicant(ApplicantKind.SNAPSHOT, ticket=publication)
        req = ledger.TransferRequest(ledger.TxnKind.PAUSE, ("pause", request), tuple(move), ledger.HOST_MEDIUM,
                                     drop_source=True)
        got = ledger.plan_begin_transfer(self.program.state, req)
        if isinstance(got, Refusal) and got.reason == "shortfall" and ledger.HOST in got.shortfall.pools \
                or isinstance(got, Refusal) and got.shortfall is not None and got.shortfall.host is not None:
            objs = [self.program.state.objects[o] for o in move]
            allocs = tuple(ledger.HostAllocation(o.device.nbytes) for o in objs)  # HOST-1: each must place
            q = ledger.quote(self.program.state, self.cache, Gap(ledger.HOST, sum(a.size for a in allocs), allocs),
                             applicant, protect=move)
            if q.admitted:
                r = ledger.plan_reclaim(self.program.state, self.cache, q)
                if not isinstance(r, Refusal):
                    self.apply(r)
                    self.drive_transaction()
                    self.counters["reclaims"] += 1
                    got = ledger.plan_begin_transfer(self.program.state, req)
        if isinstance(got, Refusal):
            return None
        self.apply(got)
        self.drive_transaction()
        return sum(self.program.state.objects[o].host.nbytes for o in move if o in self.program.state.objects)

    def revoke_snapshot(self, request) -> None:
        """PAUSE-4: the snapshot's references go; the paused request turns to Replay."""
        got = ledger.plan_revoke_snapshot(self.program.state, self.cache, request)
        if not isinstance(got, Refusal):
            self.apply(got)

    def end_paused(self, request) -> None:
        """A paused request is cancelled or fails: its snapshot and binding go (BIND-6)."""
        self.apply(ledger.plan_cancel_paused(self.program.state, self.cache, request))

    def clear(self) -> None:
        self.apply(ledger.plan_clear(self.program.state, self.cache))

    def check(self) -> None:
        ledger.check_cache(self.program.state, self.cache)
