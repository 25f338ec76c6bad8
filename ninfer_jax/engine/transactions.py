"""The engine's one context transaction, in flight across cycles (TXN-1..3, SCH-9, SRC-5).

A transaction is begun where it is decided — a bind of a Host source at admission or at a
paused request's recovery, a demotion inside reclamation, a Snapshot's offload at a pause — and
submitted at once: its copies are dispatched (program/transfers.py) and the cycle goes on. The
ledger already says what is pending meanwhile: the destinations are reserved and charged, the
sources are under the transaction's reader leases, the permit taken with a bind belongs to it.
It then advances by a bounded amount at the three SCH-9 points of every cycle (its start, after
admission before the execution choice, after Control/Decode): land the copies that are ready;
once all of them have landed, `complete` and `publish`; then what waited for it runs — a bind
continues into `plan_bind` and joins the normal permit and capture flow, a pause's or
demotion's Device units are free (a capacity event, SCH-10). An unfinished copy is looked at
again at the next point, never spun on; a cycle that had nothing to execute waits for it once
(blocking, not polling) so an engine with nothing else to do does not cycle idly.

A request whose valuable source is blocked by the transaction, or that needs the one slot
while it is taken, waits for it (SRC-5, TXN-1): the end of the transaction rescans the queue
and is a recovery opportunity. While a bind is pending, its request keeps a lane. Cancel
(TXN-2, `cancel_for`): before submit and after completion the ledger reverts at once; in
flight the transaction is marked cancelling and its completion reverts once the real copy has
finished. A Snapshot offload that finds the slot taken is deferred to the next free point
(its content stays on Device until then; the pause still counts as a Snapshot).

Who drives the transaction hears of its end through `TransactionEvents` (EngineCore implements
it): a `TransactionEnd` — what waited for it, whether it was published, whether it frees room
or answers a waiter — on which the scheduler rescans, raises a capacity event or binds; and a
deferred offload that found no Host room. The cache the transaction applies its plans to is a
`TransactionCache` (ContextCache implements it).

Test hooks: `hold = {"submit": n, "publish": n}` keeps each following transaction RESERVED /
COMPLETED for n points; `program.stores.transfers.hold_polls` keeps its copies not ready.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Hashable, NamedTuple, Protocol

import ledger
from ledger import TxnPhase

# Refusals that mean "wait for the transaction", not "no" (SRC-5, TXN-1).
WAIT_REASONS = frozenset(("transfer_pending", "source_blocked", "transaction_busy", "waiting_release"))


class PendingKind(enum.StrEnum):
    BIND = "bind"  # a Host source read back for a request's bind (at admission or recovery)
    PAUSE = "pause"  # a Snapshot's offload to the Host arena
    DEMOTION = "demotion"  # a reclamation's demotion (RCL-7)


@dataclasses.dataclass(frozen=True)
class Pending:
    """What waits for the running transaction."""

    kind: PendingKind
    request: Hashable  # the request's ticket (None for a demotion)
    resume: bool = False  # a paused request's recovery bind (it holds the recovery permit, TXN-2)
    permit: int | None = None  # the permit taken with the bind
    cid: int | None = None  # the bound source


@dataclasses.dataclass(frozen=True)
class TransactionEnd:
    """A transaction's end, as its driver hears it (SCH-9, SCH-10, SRC-5)."""

    pending: Pending | None  # what waited for it (None: nothing any more)
    published: bool  # published; else reverted (cancelled, TXN-2)
    frees: bool  # its end frees room or answers a waiter: the queue looks again, a capacity event
    waiters: bool  # something waited for the slot or a blocked source (SRC-5)


class DeferredOffload(NamedTuple):
    """A Snapshot offload waiting for the slot (TXN-1)."""

    ticket: Hashable
    snapshot: int
    publication: int


class TransactionEvents(Protocol):
    """What a transaction's end is told to (EngineCore implements it)."""

    def transaction_ended(self, ended: TransactionEnd) -> None:
        """SCH-9/10: a rescan, a capacity event, a published bind's request binding now."""

    def offload_failed(self, ticket: Hashable) -> None:
        """PAUSE-3: a deferred Snapshot offload found no Host room."""


class TransactionCache(Protocol):
    """The cache policy the transaction's plans go through (ContextCache implements it)."""

    def apply(self, res) -> None: ...

    def snapshot_of(self, request: Hashable) -> int | None: ...

    def offload(self, request: Hashable, snapshot: int, *, publication: int) -> int | None: ...


class Transactions:
    def __init__(self, reuse: TransactionCache, program, counters, events: TransactionEvents | None = None):
        self.reuse = reuse
        self.program = program
        self.events = events  # the driver (EngineCore), told of each end; None: nobody drives it
        self.pending: Pending | None = None  # the continuation of the running transaction
        self.generation: int | None = None  # the transaction `pending` belongs to
        self.offloads: list[DeferredOffload] = []  # deferred Snapshot offloads, in order
        self.waiters = False  # something waited for the slot or a blocked source (SRC-5)
        self.reclaim_waits = False  # a reclamation waits for the slot, to demote rather than delete
        self.hold = {"submit": 0, "publish": 0}  # test hook (module doc)
        self._held = {"submit": 0, "publish": 0}
        self.counters = counters

    # ---- facts ------------------------------------------------------------------------------
    @property
    def current(self):
        return self.program.state.transaction

    @property
    def busy(self) -> bool:
        """A transaction is running or a Snapshot offload waits for the slot."""
        return self.current is not None or bool(self.offloads)

    def live(self, kind: PendingKind | None = None) -> Pending | None:
        """The continuation of the running transaction (of `kind`), unless it is cancelling."""
        t = self.current
        p = self.pending
        if t is None or p is None or t.generation != self.generation or t.phase == TxnPhase.CANCELLING:
            return None
        return p if kind is None or p.kind == kind else None

    @property
    def binding(self) -> Hashable | None:
        """The ticket whose bind transfer is in flight (it keeps a lane), or None."""
        p = self.live(PendingKind.BIND)
        return None if p is None else p.request

    @property
    def recovering(self) -> bool:
        """A paused request's recovery bind is in flight (SCH-7: one recovery at a time)."""
        p = self.live(PendingKind.BIND)
        return p is not None and p.resume

    def reserved_lanes(self) -> int:
        return 1 if self.binding is not None else 0

    def releases(self, pools=()) -> bool:
        """Will a transfer in flight (or a deferred offload) free Device units of `pools` (any
        pool when empty)? Then a refused row waits for it rather than preempting more (SCH-9)."""
        if self.offloads:
            return True
        t = self.current
        if t is None:
            return False
        if self.reclaim_waits:  # its end lets the reclamation demote (ContextCache.reclaim)
            return True
        pools = set(pools) - {ledger.HOST}
        if t.phase == TxnPhase.CANCELLING:  # the revert frees its Device destinations
            return any(j.dst.medium == ledger.DEVICE and (not pools or j.pool in pools) for j in t.jobs)
        return t.drop_source and any(j.src.medium == ledger.DEVICE and (not pools or j.pool in pools)
                                     for j in t.jobs)

    # ---- start ------------------------------------------------------------------------------
    def started(self, pending: Pending) -> None:
        """The transaction a plan just began (RESERVED) is this one: submit it now, unless held."""
        t = self.current
        assert t is not None and t.phase == TxnPhase.RESERVED, t
        self.pending, self.generation = pending, t.generation
        self._held = dict(self.hold)
        if not self._held["submit"]:
            self._submit(t)

    def adopt(self, kind: PendingKind = PendingKind.DEMOTION) -> None:
        """After a plan that may have begun a transaction (a reclamation's demotion, RCL-7)."""
        t = self.current
        if t is not None and t.generation != self.generation and t.phase == TxnPhase.RESERVED:
            self.started(Pending(kind, None))

    def land_demotion(self) -> bool:
        """RES-4: a demotion whose copies have landed completes and is published now, so the
        reclamation that began it goes on to its next pool and the plan it serves is retried
        at once with the room. Where the pools live in host memory (the CPU backend) a poll
        lands its memcpy (`Transfers.synchronous`), so the schedule does not race the copy
        thread. Elsewhere a copy not yet ready is left to the SCH-9 points (looked at once,
        never waited for), as is one a test hold keeps in flight.
        True if the slot is free again."""
        t = self.current
        if t is None or t.phase != TxnPhase.SUBMITTED or self.live(PendingKind.DEMOTION) is None or self._held["publish"]:
            return False
        stores = self.program.stores
        g = t.generation
        if stores.copies_held(g):
            return False
        stores.poll(tick=False)  # on host-side pools this lands it (Transfers.synchronous)
        if not stores.copies_done(g):
            return False
        self._complete(t)
        t = self.current
        if t is not None and t.phase == TxnPhase.COMPLETED:
            self._publish(t)
        return self.current is None

    def _submit(self, t) -> None:
        self.reuse.apply(ledger.plan_submit(self.program.state, t.generation))  # the copies are dispatched

    def defer_offload(self, request, snapshot: int, publication: int) -> None:
        self.offloads.append(DeferredOffload(request, snapshot, publication))

    # ---- advance (SCH-9) --------------------------------------------------------------------
    def advance(self, idle: bool = False) -> None:
        """One bounded step at a SCH-9 point: land ready copies; complete and publish a
        transaction whose copies all landed (then its continuation); start a deferred offload
        when the slot is free. `idle`: this cycle executed nothing, so wait for the copies
        once instead of returning to cycle again."""
        stores = self.program.stores
        stores.poll()
        t = self.current
        if t is None:
            self._start_offload()
            return
        if t.phase == TxnPhase.RESERVED:
            if self._held["submit"]:
                self._held["submit"] -= 1
                return
            self._submit(t)
            return
        if t.phase in (TxnPhase.SUBMITTED, TxnPhase.CANCELLING):
            if not stores.copies_done(t.generation):
                if not idle:
                    return
                stores.transfers.wait(t.generation)  # nothing else to do: block, do not spin
                stores.poll(tick=False)
                if not stores.copies_done(t.generation):
                    return
            self._complete(t)
            t = self.current
            if t is None:
                return
        if t.phase == TxnPhase.COMPLETED:
            if self._held["publish"]:
                self._held["publish"] -= 1
                return
            self._publish(t)

    def _complete(self, t) -> None:
        cancelling = t.phase == TxnPhase.CANCELLING
        self.reuse.apply(ledger.plan_complete(self.program.state, t.generation))
        if cancelling:  # TXN-2: the real copy finished; the completion reverted it
            self._ended(t, published=False)

    def _publish(self, t) -> None:
        self.reuse.apply(ledger.plan_publish(self.program.state, t.generation))
        self._ended(t, published=True)

    def _ended(self, t, published: bool) -> None:
        pending = self.pending if self.generation == t.generation else None
        self.pending, self.generation = None, None
        if self.reclaim_waits:
            self.reclaim_waits = False
            self.waiters = True  # who waited for room looks again
        if self.events is None:
            return
        # SRC-5: who waited for the slot or a blocked source looks again; freed units are room
        # for the queue and a capacity event (SCH-10); a published bind's request binds now.
        waiters = self.waiters
        frees = waiters or not published or t.drop_source
        if frees:
            self.waiters = False
        self.events.transaction_ended(TransactionEnd(pending, published, frees, waiters))

    def _start_offload(self) -> None:
        """A deferred Snapshot offload takes the free slot (one per point)."""
        while self.offloads and self.current is None:
            o = self.offloads.pop(0)
            if self.reuse.snapshot_of(o.ticket) != o.snapshot:
                continue  # revoked or ended meanwhile
            if self.reuse.offload(o.ticket, o.snapshot, publication=o.publication) is None and self.events is not None:
                self.events.offload_failed(o.ticket)
            return

    # ---- cancel (TXN-2) ------------------------------------------------------------------
    def cancel_for(self, request) -> None:
        """The request ends: its deferred offload goes, and the transaction waiting for it (its
        bind, or its pause's offload) is cancelled: reverted at once before submit or after
        completion, marked cancelling in flight (its completion reverts)."""
        self.offloads = [o for o in self.offloads if o.ticket != request]
        t = self.current
        p = self.live()
        if t is None or p is None or p.request != request:
            return
        self.pending = None  # no continuation: nobody waits for it any more
        self.reuse.apply(ledger.plan_cancel(self.program.state, t.generation))
        if self.current is None:
            self._ended(t, published=False)

    # ---- to the end, now ----------------------------------------------------------------
    def finish(self) -> None:
        """Run the transaction to its end now, waiting for its copies (holds ignored): for
        callers that need its result at once (clear_cache, tests)."""
        while True:
            t = self.current
            if t is None:
                return
            if t.phase == TxnPhase.RESERVED:
                if self.generation != t.generation:
                    self.pending, self.generation = None, t.generation
                self._held = {"submit": 0, "publish": 0}
                self._submit(t)
            elif t.phase in (TxnPhase.SUBMITTED, TxnPhase.CANCELLING):
                self.program.stores.wait(t.generation)
                self._complete(t)
            else:
                self._publish(t)

    def check(self) -> None:
        """What the engine knows of the transaction agrees with the ledger (doctrine 2)."""
        err = ledger.IntegrityError
        t = self.current
        if t is None:
            if self.pending is not None:
                raise err(f"a continuation {self.pending} waits for no transaction")
            return
        if t.generation != self.generation:
            raise err(f"transaction {t.generation} is not the one the engine drives ({self.generation})")
        if self.pending is None and t.phase != TxnPhase.CANCELLING:
            raise err(f"transaction {t.generation} ({t.kind}) has no continuation and is not cancelling")
        if self.pending is not None and self.pending.permit not in (None, t.permit_id):
            raise err(f"bind continuation permit {self.pending.permit}, transaction permit {t.permit_id}")
