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

What this needs from the scheduling core is `PreemptionHost` (EngineCore implements it), handed
to the calls that act on residents (`pause`, `maybe_recover`, `resume_transferred`); the
Program, the cache policy and the counters are its own collaborators.
"""
from __future__ import annotations

import bisect
import enum
from typing import TYPE_CHECKING, Protocol, Sequence

import ledger
from ninfer_jax.engine.request import PAUSED, Request
from ninfer_jax.engine.transactions import WAIT_REASONS, PendingKind, TransactionEnd

if TYPE_CHECKING:
    from ninfer_jax.engine.contract import ProgramContract
    from ninfer_jax.engine.reuse import Bound, ContextCache


class Route(enum.StrEnum):
    """How a paused request keeps what it had computed (PAUSE-2)."""

    SNAPSHOT = "snapshot"
    REPLAY = "replay"


SNAPSHOT, REPLAY = Route.SNAPSHOT, Route.REPLAY


class PreemptionHost(Protocol):
    """What preemption needs from the scheduling core (EngineCore implements it)."""

    @property
    def residents(self) -> list[Request]:
        """Lane holders, in ticket order."""

    def free_lanes(self) -> int: ...

    def unit_end(self, req: Request, at: int) -> int:
        """RD-7: where the unit starting at `at` reaches."""

    def bind(self, req: Request, bound: Bound) -> None:
        """Adopt the binding the cache gave: the request becomes resident."""

    def vacate(self, req: Request) -> None:
        """Settle every permit the request holds and give its lane and units up."""

    def capacity_error(self, req: Request, refusal: ledger.Refusal) -> None:
        """RES-6: end the request with the capacity contract error."""


class Preemption:
    def __init__(self, program: ProgramContract, reuse: ContextCache, counters):
        self.program = program
        self.reuse = reuse
        self.counters = counters
        self.route = program.config.pause_route
        self.paused: list[Request] = []  # by original ticket (SCH-6)
        self._tickets: list[int] = []
        self.event = False  # a real capacity event since the last recovery attempt (SCH-10)
        self.holder: Request | None = None  # the recovery permit's holder (SCH-7)

    # ---- facts ---------------------------------------------------------------------------
    @property
    def recovery_pending(self) -> bool:
        """SCH-7: the Program still holds the recovery permit."""
        return self.program.state.recovery_permit is not None

    def __len__(self) -> int:
        return len(self.paused)

    def pausable(self, residents: Sequence[Request], exclude=()) -> list[Request]:
        """Residents that may be preempted, youngest first: never the recovery permit's holder
        (SCH-5; a request whose bind is still in flight is not resident yet, so it is never
        preempted while it materialises)."""
        return [r for r in reversed(residents) if r is not self.holder and r not in exclude]

    def transaction_ended(self, ended: TransactionEnd) -> None:
        """SCH-10: a transaction's end that frees room is a capacity event for the oldest paused
        request — but a pause's own offload is not one for the request it paused."""
        pending = ended.pending
        own = pending is not None and pending.kind == PendingKind.PAUSE
        older = self.paused and pending is not None and pending.request is not None and \
            self.paused[0].ticket < pending.request
        if ended.waiters or not own or older:
            self.event = True

    # ---- pause ---------------------------------------------------------------------------
    def choose_route(self, req: Request) -> Route:
        """PAUSE-2 / SRC-3: the configured route, or for "auto" the cheaper of copying the
        unique content out and back against recomputing beyond the best cached source."""
        if req.media is not None and req.media.inside(req.fed):
            return REPLAY  # SH-7: no checkpoint inside a media item; it replays from the last legal point
        if self.route != "auto":
            return Route(self.route)
        reuse = self.reuse
        state = self.program.state
        if state.arena.capacity == 0 or req.fed == 0:
            return REPLAY
        nbytes = 0
        for oid in req.objects:
            o = state.objects[oid]
            if o.host is None and not any(h[0] == "seq" and h != req.key for h in o.holders):
                nbytes += o.device.nbytes
        best = ledger.query_sources(state, reuse.cache, ledger.SourceQuery(
            req.ticket, reuse.identity_at(req, req.fed)), reuse.cost)[0]
        # SRC-3: the calibrated prices: the copy out (D2H) and back (H2D) against recomputing
        # what lies beyond the best cached source; the route changes time, never the tokens.
        rates = reuse.rates
        return SNAPSHOT if rates.copy_out_and_back_s(nbytes) < rates.recompute_s(req.fed - best.frontier) else REPLAY

    def pause(self, host: PreemptionHost, req: Request, route: str | None = None) -> None:
        """Pause a resident by Snapshot or Replay (G-5, PAUSE-1..4). The view is released,
        every permit it held is settled, and its lane is free."""
        reuse = self.reuse
        route = route or self.choose_route(req)
        if req is self.holder:
            self.end_recovery(req)  # only an explicit pause reaches the holder (SCH-5)
        req.computed = max(req.computed, req.fed)
        inside = req.media is not None and req.media.inside(req.fed)  # SH-7: never a snapshot there
        snap = reuse.pause(reuse.view_of(req), snapshot=route == SNAPSHOT and req.fed > 0 and not inside)
        route = REPLAY
        if snap is not None:
            pub = reuse.cache.active[req.ticket].publication_order
            copied = reuse.offload(req.ticket, snap, publication=pub)
            if copied is None:  # PAUSE-3: no room on Host: a destructive pause turns to Replay
                reuse.revoke_snapshot(req.ticket)
                self.counters["snapshot_fallbacks"] += 1
            else:
                route = SNAPSHOT
                self.counters["snapshot_bytes"] += copied
        host.vacate(req)
        req.phase, req.paused_route = PAUSED, route
        req.pauses += 1
        self.counters["pauses_" + route] += 1
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
    def maybe_recover(self, host: PreemptionHost) -> None:
        """SCH-1, SCH-10: on a real capacity event try the oldest paused request's full
        recovery; with nothing resident there is no releaser to wait for, so it tries anyway
        (and gets the capacity contract error if even that fails, RES-6)."""
        txns = self.reuse.txns
        if not self.paused or self.holder is not None or txns.recovering:  # SCH-7: one recovery at a time
            return
        if not (self.event or not host.residents):
            return
        self.event = False
        req = self.paused[0]  # RD-2: strictly by original ticket
        older = any(r.ticket < req.ticket for r in host.residents)
        why = ledger.Refusal("no_lane", None, "every lane is held")
        while True:
            if host.free_lanes() > 0:
                why = self._resume(host, req, take=not older)
                if why is None or why.reason in WAIT_REASONS:
                    return  # bound, or waiting for a transfer: its end is the next event (SRC-5, SCH-9)
            if txns.releases():
                return  # a copy in flight frees capacity: wait for it rather than preempt more (SCH-9)
            victims = [] if older else [r for r in self.pausable(host.residents) if r.ticket > req.ticket]
            if not victims:
                break
            # SCH-6: with no older resident, the oldest paused request takes lanes and capacity
            # back from younger residents (their pause is not an event for it: it is acting).
            self.pause(host, victims[0])
            self.event = False
        if not host.residents and self.paused and self.paused[0] is req and not txns.busy:
            host.capacity_error(req, why)

    def resume_transferred(self, host: PreemptionHost, req: Request, permit: int | None) -> None:
        """SCH-9: its recovery bind transaction was published: bind it now with the recovery
        permit that transaction took (TXN-2); if that fails it waits for the next event."""
        older = any(r.ticket < req.ticket for r in host.residents)
        if self._resume(host, req, take=not older, permit=permit) is not None:
            self.event = True

    def offload_failed(self, ticket) -> None:
        """A deferred Snapshot offload found no Host room (PAUSE-3): the snapshot goes and the
        paused request resumes by Replay."""
        self.reuse.revoke_snapshot(ticket)
        self.counters["snapshot_fallbacks"] += 1
        req = next((r for r in self.paused if r.ticket == ticket), None)
        if req is not None:
            req.paused_route = REPLAY

    def _resume(self, host: PreemptionHost, req: Request, take: bool,
                permit: int | None = None) -> ledger.Refusal | None:
        """Bind the paused request again (its Snapshot first) with the recovery permit (or the
        one its bind transaction took, `permit`); the Refusal of the last candidate when it
        cannot be had (a WAIT_REASONS one while its read-back is in flight)."""
        reuse = self.reuse
        snap = reuse.snapshot_of(req.ticket)
        if req.paused_route == SNAPSHOT and snap is None:
            self.counters["snapshot_revocations"] += 1  # PAUSE-4: it turned to Replay meanwhile
            req.paused_route = REPLAY
        applicant = ledger.Applicant(ledger.ApplicantKind.NECESSARY, ticket=req.ticket)
        bound = reuse.bind(req.ticket, reuse.identity_at(req, len(req.target)), session=req.session,
                           unit_end=lambda f: host.unit_end(req, max(f, req.computed)),
                           ticket=req.ticket, resume=True, snapshot=snap, applicant=applicant, revoke=take,
                           permit=permit, at_most=req.logits_from)
        if isinstance(bound, ledger.Refusal):
            return bound
        i = bisect.bisect_left(self._tickets, req.ticket)
        del self._tickets[i], self.paused[i]
        route = SNAPSHOT if bound.takeover == ledger.Takeover.SNAPSHOT else REPLAY
        self.counters["resumes_" + route] += 1
        if bound.frontier > req.computed:  # tokens beyond the old frontier came from the cache
            self.counters["reused_tokens"] += bound.frontier - req.computed
        req.paused_route = None
        if bound.permit is not None:
            req.recovery_permit, req.recovery_since = bound.permit, self.program.clock()
            self.holder = req
        host.bind(req, bound)
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
        state = self.program.state
        if pid in state.permits:
            self.program.commit(ledger.plan_settle(state, pid, req.key))
        self.counters["recovery_permit_seconds"] += self.program.clock() - req.recovery_since
