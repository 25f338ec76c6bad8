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

    def reclaim(self, pools: dict, protect=(), applicant: Applicant | None = None) -> bool:
        """Meet a shortfall from optional cache (RCL-8 for necessary execution), State first."""
        done = False
        applicant = applicant or Applicant(ApplicantKind.NECESSARY)
        for pool in ledger.gap_order(pools):
            amount = pools[pool]
            if amount <= 0:
                continue
            q = ledger.quote(self.program.state, self.cache, Gap(pool, amount), applicant, protect)
            if not q.admitted:  # only then revoke waiting protections (WAIT-2, SCH-4)
                q = ledger.quote(self.program.state, self.cache, Gap(pool, amount),
                                 applicant._replace(revoke_waiters=True), protect)
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

    def retry(self, make, protect=()):
        """Plan, and on a shortfall reclaim and plan again at once (RES-4)."""
        got = make()
        for _ in range(MAX_RETRIES):
            if not isinstance(got, Refusal) or got.reason != "shortfall" or not got.shortfall:
                return got
            if not self.reclaim(dict(got.shortfall.pools), protect):
                return got
            got = make()
        return got

    # ---- admission: sources and bind -------------------------------------------------------
    def bind(self, request, ident: ledger.InputIdentity, *, session, first_unit_tokens: int, ticket: int,
             resume: bool) -> Bound | Refusal:
        """Query sources for the tokens of `ident` and bind the best one that can be had
        (SRC-*, BIND-*). Returns the binding, or the last Refusal (nothing retired, SRC-4)."""
        query = SourceQuery(request, ident, session if self.enabled else None)
        cands = ledger.query_sources(self.program.state, self.cache, query, self.cost)
        last: Refusal = Refusal("no_source", None, "no candidate")
        for cand in cands:
            if cand.blocked:  # its object is in the running transaction; another candidate serves
                continue
            src = self.cache.checkpoints.get(cand.cid)
            protect = src.object_ids() if src is not None else ()  # the whole source stays (RCL-8)
            if cand.missing:  # a Host copy: bring it back to Device first (BIND-5, TXN-*)
                t = self.retry(lambda c=cand: ledger.plan_bind_transfer(self.program.state, self.cache, request, c),
                               protect=protect)
                if isinstance(t, Refusal):
                    last = t
                    continue
                self.apply(t)
                self.drive_transaction()
                cand = next((c for c in ledger.query_sources(self.program.state, self.cache, query, self.cost)
                             if c.cid == cand.cid), None)
                if cand is None or cand.missing:
                    continue
            page = ledger.PAGE_TOKENS
            need = -(-(cand.frontier + first_unit_tokens) // page) - -(-cand.frontier // page)
            kind = UnitKind.REPLAY if resume else UnitKind.PREFILL
            unit = UnitDemand(ledger.seq_holder(request), kind, {MAIN_KV: max(0, need)})
            got = self.retry(lambda c=cand: ledger.plan_bind(
                self.program.state, self.cache,
                BindRequest(request, c, session, unit, ticket=ticket, resume=resume)), protect)
            if isinstance(got, Refusal):
                last = got
                continue
            self.apply(got)
            view = next(o for o in got.outcome if o[0] == "view")
            permit = next((o[1] for o in got.outcome if o[0] == "permit"), None)
            pages = dict(view[2]).get(MAIN_KV, ())
            if cand.frontier and not resume:
                self.counters["cache_hits"] += 1
                self.counters["reused_tokens"] += cand.frontier
            return Bound(cand.frontier, cand.takeover, view[1], tuple(pages), permit)
        return last

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

    def pause(self, view: SequenceView) -> None:
        """PAUSE-2 by Replay: release the writable view, keep the binding to the record."""
        self.apply(ledger.plan_pause(self.program.state, self.cache, view, snapshot=False))

    def clear(self) -> None:
        self.apply(ledger.plan_clear(self.program.state, self.cache))

    def check(self) -> None:
        ledger.check_cache(self.program.state, self.cache)
