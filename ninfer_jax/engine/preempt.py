"""Preemption and recovery: pauses by Snapshot or Replay and the one recovery permit
(G-5, SCH-4..7, SCH-10, RES-5, PAUSE-1..5, RD-1..3, RD-7).

A pause happens between cycles, at a stable Program commit boundary (SCH-5). The request keeps
its input, output, seed, budget and first-event times, and stays bound to its record (PAUSE-1);
what it had computed is kept by one of two routes (PAUSE-2):
  Snapshot  its execution position becomes its own checkpoint; the content no other active
            request reads is copied to the Host arena and its Device units are freed (PAUSE-3).
            Resuming reads the missing replicas back and continues exactly where it was. A
            snapshot is revocable (PAUSE-4): the request then turns to Replay.
  Replay    nothing is kept; resuming binds the best source the cache has and recomputes up to
            the old frontier (`Request.computed`) before going on (PAUSE-5).
`EngineConfig.pause_route` picks the route; "auto" compares the copy (D2H + H2D bytes) with the
recomputation (tokens beyond the best cached source) by the Program's calibrated cost model
(`ContextCache.rates`, program/calibrate.py; SRC-3).

Paused requests are their own set, ordered by original ticket, never mixed into fresh
admission (SCH-6). A real capacity event — a finish, a cancel, a younger request's pause
(SCH-10) — tries the oldest paused request's full recovery (RD-2); a request just paused does
not resume because of its own release. While an older resident exists the attempt may use only
free space and ordinary reclamation of optional cache (SCH-6, RD-3); otherwise it may revoke
waiting protection and younger snapshots and take lanes and capacity back from younger
residents. The recovery permit it takes covers State, missing KV, tail page, the rebuild to the
old frontier and the first real new unit (RES-5, RD-7); the Program holds it across Replay
chunks, and it ends only on real new progress — a new prefill commit, a generated token, or a
terminal state — which the engine reads through `recovery_pending` (SCH-7). While it is held,
optional captures are skipped (RD-1, in the ledger) and its holder is never preempted (SCH-5).
"""
from __future__ import annotations

import bisect

import ledger
from ninfer_jax.engine.request import PAUSED, Request
from ninfer_jax.engine.transactions import WAIT_REASONS

SNAPSHOT, REPLAY = "snapshot", "replay"


class Preemption:
    def __init__(self, core):
        self.core = core
        self.route = core.program.config.pause_route
        self.paused: list[Request] = []  # by original ticket (SCH-6)
        self._tickets: list[int] = []
        self.event = False  # a real capacity event since the last recovery attempt (SCH-10)
        self.holder: Request | None = None  # the recovery permit's holder (SCH-7)

    # ---- facts ---------------------------------------------------------------------------
    @property
    def recovery_pending(self) -> bool:
        """SCH-7: the Program still holds the recovery permit."""
        return self.core.program.state.recovery_permit is not None

    def __len__(self) -> int:
        return len(self.paused)

    def pausable(self, exclude=()) -> list[Request]:
        """Residents that may be preempted, youngest first: never the recovery permit's holder
        (SCH-5; a request whose bind is still in flight is not resident yet, so it is never
        preempted while it materialises)."""
        return [r for r in reversed(self.core.residents) if r is not self.holder and r not in exclude]

    # ---- pause ---------------------------------------------------------------------------
    def choose_route(self, req: Request) -> str:
        """PAUSE-2 / SRC-3: the configured route, or for "auto" the cheaper of copying the
        unique content out and back against recomputing beyond the best cached source."""
        if self.route != "auto":
            return self.route
        core = self.core
        state = core.program.state
        if state.arena.capacity == 0 or req.fed == 0:
            return REPLAY
        nbytes = 0
        for oid in req.objects:
            o = state.objects[oid]
            if o.host is None and not any(h[0] == "seq" and h != req.key for h in o.holders):
                nbytes += o.device.nbytes
        best = ledger.query_sources(state, core.reuse.cache, ledger.SourceQuery(
            req.ticket, core._identity(req, req.fed)), core.reuse.cost)[0]
        # SRC-3: the calibrated prices: the copy out (D2H) and back (H2D) against recomputing
        # what lies beyond the best cached source; the route changes time, never the tokens.
        rates = core.reuse.rates
        return SNAPSHOT if rates.copy_out_and_back_s(nbytes) < rates.recompute_s(req.fed - best.frontier) else REPLAY

    def pause(self, req: Request, route: str | None = None) -> None:
        """Pause a resident by Snapshot or Replay (G-5, PAUSE-1..4). The view is released,
        every permit it held is settled, and its lane is free."""
        core = self.core
        route = route or self.choose_route(req)
        if req is self.holder:
            self.end_recovery(req)  # only an explicit pause reaches the holder (SCH-5)
        req.computed = max(req.computed, req.fed)
        snap = core.reuse.pause(core.view(req), snapshot=route == SNAPSHOT and req.fed > 0)
        route = REPLAY
        if snap is not None:
            pub = core.reuse.cache.active[req.ticket].publication_order
            copied = core.reuse.offload(req.ticket, snap, publication=pub)
            if copied is None:  # PAUSE-3: no room on Host: a destructive pause turns to Replay
                core.reuse.revoke_snapshot(req.ticket)
                core.counters["snapshot_fallbacks"] += 1
            else:
                route = SNAPSHOT
                core.counters["snapshot_bytes"] += copied
        core._drop_permits(req)
        core._unbind(req)
        req.phase, req.paused_route = PAUSED, route
        core.counters["pauses_" + route] += 1
        if self.paused and self.paused[0].ticket < req.ticket:
            self.event = True  # SCH-10: a younger request's pause is the older one's opportunity
        i = bisect.bisect_left(self._tickets, req.ticket)
        self._tickets.insert(i, req.ticket)
        self.paused.insert(i, req)

    def remove(self, req: Request) -> None:
        """A paused request ends (cancel, error): it leaves the set; its release is an event."""
        i = bisect.bisect_left(self._tickets, req.ticket)
        if i < len(self._tickets) and self._tickets[i] == req.ticket:
            del self._tickets[i], self.paused[i]
            self.event = True

    # ---- recovery ------------------------------------------------------------------------
    def maybe_recover(self) -> None:
        """SCH-1, SCH-10: on a real capacity event try the oldest paused request's full
        recovery; with nothing resident there is no releaser to wait for, so it tries anyway
        (and gets the capacity contract error if even that fails, RES-6)."""
        core = self.core
        txns = core.reuse.txns
        if not self.paused or self.holder is not None or txns.recovering:  # SCH-7: one recovery at a time
            return
        if not (self.event or not core.residents):
            return
        self.event = False
        req = self.paused[0]  # RD-2: strictly by original ticket
        older = any(r.ticket < req.ticket for r in core.residents)
        why = ledger.Refusal("no_lane", None, "every lane is held")
        while True:
            if core.free_lanes() > 0:
                why = self._resume(req, take=not older)
                if why is None or why.reason in WAIT_REASONS:
                    return  # bound, or waiting for a transfer: its end is the next event (SRC-5, SCH-9)
            if txns.releases():
                return  # a copy in flight frees capacity: wait for it rather than preempt more (SCH-9)
            victims = [] if older else [r for r in self.pausable() if r.ticket > req.ticket]
            if not victims:
                break
            # SCH-6: with no older resident, the oldest paused request takes lanes and capacity
            # back from younger residents (their pause is not an event for it: it is acting).
            self.pause(victims[0])
            self.event = False
        if not core.residents and self.paused and self.paused[0] is req and not txns.busy:
            core._capacity_error(req, why)

    def resume_transferred(self, req: Request, permit: int | None) -> None:
        """SCH-9: its recovery bind transaction was published: bind it now with the recovery
        permit that transaction took (TXN-2); if that fails it waits for the next event."""
        older = any(r.ticket < req.ticket for r in self.core.residents)
        if self._resume(req, take=not older, permit=permit) is not None:
            self.event = True

    def offload_failed(self, ticket) -> None:
        """A deferred Snapshot offload found no Host room (PAUSE-3): the snapshot goes and the
        paused request resumes by Replay."""
        self.core.reuse.revoke_snapshot(ticket)
        self.core.counters["snapshot_fallbacks"] += 1
        req = next((r for r in self.paused if r.ticket == ticket), None)
        if req is not None:
            req.paused_route = REPLAY

    def _resume(self, req: Request, take: bool, permit: int | None = None) -> ledger.Refusal | None:
        """Bind the paused request again (its Snapshot first) with the recovery permit (or the
        one its bind transaction took, `permit`); the Refusal of the last candidate when it
        cannot be had (a WAIT_REASONS one while its read-back is in flight)."""
        core = self.core
        snap = core.reuse.snapshot_of(req.ticket)
        if req.paused_route == SNAPSHOT and snap is None:
            core.counters["snapshot_revocations"] += 1  # PAUSE-4: it turned to Replay meanwhile
            req.paused_route = REPLAY
        applicant = ledger.Applicant(ledger.ApplicantKind.NECESSARY, ticket=req.ticket)
        bound = core.reuse.bind(req.ticket, core._identity(req, len(req.target)), session=req.session,
                                unit_end=lambda f: core._unit_end(req, max(f, req.computed)),
                                ticket=req.ticket, resume=True, snapshot=snap, applicant=applicant, revoke=take,
                                permit=permit)
        if isinstance(bound, ledger.Refusal):
            return bound
        i = bisect.bisect_left(self._tickets, req.ticket)
        del self._tickets[i], self.paused[i]
        route = SNAPSHOT if bound.takeover == ledger.Takeover.SNAPSHOT else REPLAY
        core.counters["resumes_" + route] += 1
        if bound.frontier > req.computed:  # tokens beyond the old frontier came from the cache
            core.counters["reused_tokens"] += bound.frontier - req.computed
        req.paused_route = None
        if bound.permit is not None:
            req.recovery_permit, req.recovery_since = bound.permit, core.program.clock()
            self.holder = req
        core._bind(req, bound)
        return None

    def end_recovery(self, req: Request) -> None:
        """RES-5, SCH-7: real new progress (or a terminal state, or an explicit pause) ends the
        recovery permit; what it did not use returns to the pools."""
        pid = req.recovery_permit
        if pid is None:
            return
        req.recovery_permit = None
        if self.holder is req:
            self.holder = None
        if pid in self.core.program.state.permits:
            self.core._settle_permit(req, pid)
        self.core.counters["recovery_permit_seconds"] += self.core.program.clock() - req.recovery_since
