"""EngineCore: the one control thread's scheduling cycle (G-8, SCH-1).

Each `step()` is one cycle:
  1. inbox: new requests join the fresh queue; cancels end requests wherever they are (queued,
     resident, paused) and release everything at once;
  2. on a real capacity event, the oldest paused request tries its full recovery
     (engine/preempt.py: Snapshot or Replay under the recovery permit, SCH-10, RES-5);
  3. resident unit permits, recovery first then by original ticket (RES-3): each decoding row
     asks for the page its next token may need, the prefill turn (rotating among prefilling
     residents, SCH-8; the recovery holder first) for its next chunk's pages; the recovery
     holder draws from its own permit. Rows short of units first take optional cache (RCL-8);
     if the oldest resident is still refused, the youngest other resident is paused (SCH-4,
     G-5) and the permits are planned again at once (RES-4); alone and still refused, it gets
     the capacity contract error (RES-6);
  4. fresh admission from the surplus, FIFO with bounded overtaking (SCH-2): each admitted
     request binds the best recovery source the cache has (engine/reuse.py); without a free
     lane, queued requests keep their chosen source under a waiting reference (WAIT-1);
  5. one compact decode batch and one prefill chunk (SCH-1, SCH-8), chunks ending at the
     frontend's semantic frontiers, captures there (REC-8, SAVE-*); recomputing what a paused
     request had computed is Replay, the rest is ordinary prefill (OBS-1);
  6. settlement of every cycle permit (RES-3); finished rows publish E and release their objects.
The one context transaction (a bind's read-back, a demotion, a Snapshot's offload) stays in
flight across cycles and advances at the three SCH-9 points: the cycle's start, after
admission before the execution choice, and after Control/Decode (engine/transactions.py).
Every resource change is a ledger plan committed through the Program; the core keeps no
occupancy ledger of its own.

The core is split by concern: this file (intake, the cycle, admission, bindings, ends),
engine/units.py (unit permits, chunking, settlement) and engine/execution.py (the Program's
steps, sampling, streaming) are one class; its collaborators talk to it through Protocols it
implements — `PreemptionHost` (engine/preempt.py) and `TransactionEvents`
(engine/transactions.py) — and it reaches the Program through `ProgramContract`
(engine/contract.py).
"""
from __future__ import annotations

import collections
import itertools
import queue
import random
import threading
import time
from typing import Hashable, Sequence

import ledger
from ledger import Refusal
from ninfer_jax.engine.contract import ProgramContract
from ninfer_jax.engine.detok import Detokenizer
from ninfer_jax.engine.execution import Execution
from ninfer_jax.engine.intake import Call, Cancel, Message, Submit, check_submission
from ninfer_jax.engine.integrity import check_engine
from ninfer_jax.engine.media_cache import MediaCache
from ninfer_jax.engine.observe import COUNTERS, latency_histograms
from ninfer_jax.engine.preempt import Preemption
from ninfer_jax.engine.request import DECODE, FINISHED, PAUSED, PREFILL, QUEUED, Outbox, Request, RequestHandle
from ninfer_jax.engine.reuse import Bound, ContextCache, SavePoint
from ninfer_jax.engine.scheduler import WAIT, FreshQueue
from ninfer_jax.engine.transactions import Pending, PendingKind, TransactionEnd
from ninfer_jax.engine.types import SamplingParams, TokenDelta
from ninfer_jax.engine.units import Turn, UnitPlanning
from ninfer_jax.errors import CapacityError, QueueFullError, RequestError
from ninfer_jax.frontend.markers import MAX_MARKERS as MAX_SHARED_MARKERS


class EngineCore(UnitPlanning, Execution):
    def __init__(self, program: ProgramContract, decode_text=None, *, max_queue: int = 4096,
                 max_context: int | None = None, pieces=None, grammars=None):
        self.program = program
        self.grammars = grammars  # engine/grammar.py Grammars (None: no tokenizer, no structured output)
        self.decode_text = decode_text  # ids -> text, or None (token ids only)
        self.pieces = pieces  # per-id bytes of decode_text when it is byte-level (detok's fast path)
        self.c = program.config.max_concurrency
        self.max_context = max_context or program.config.max_context
        self.max_queue = max_queue
        self.inbox: queue.SimpleQueue[Message] = queue.SimpleQueue()  # from any thread (intake.py)
        self.fresh: FreshQueue[Request] = FreshQueue(self.c, lambda r: r.ticket)
        self.residents: list[Request] = []  # lane holders, kept in ticket order
        self.by_id: dict[str, Request] = {}
        # Ids of requests submitted and not yet ended, queued in the inbox included: a second
        # request may not take one (cancel is by id). Taken on the caller's thread, given back
        # on the engine thread when the request ends.
        self._live_ids: set[str] = set()
        self._ids_lock = threading.Lock()
        self._tickets = itertools.count(1)
        self.counters = collections.Counter({k: 0 for k in COUNTERS})
        self.histograms = latency_histograms()
        cache_cfg = program.config.context_cache
        # events=self: the core hears of each end of the transaction in flight (SCH-9)
        self.reuse = ContextCache(program, self.counters, enabled=cache_cfg.enabled,
                                  execution=program.execution_tag, events=self)
        self.preempt = Preemption(program, self.reuse, self.counters)
        # The tower's outputs by media identity, under their own byte budget (engine/media_cache.py)
        self.media_cache = MediaCache(program.config.media.cache_bytes)
        self._last_turn = 0  # ticket of the last prefill turn (SCH-8 rotation)
        self.cycle_seconds = 0.0  # wall time in step(), for the overhead figure
        self.compute_seconds = 0.0  # wall time inside the Program's compiled steps (`_compute`)
        # Speculative decoding (issue 17): drafts per Verify unit, and how many were accepted at
        # each draft position.
        self.spec_k = program.speculative_tokens
        self.spec_accepted_by_position = [0] * self.spec_k

    # ---- intake (any thread) ---------------------------------------------------------
    def make_request(self, prompt: Sequence[int], sp: SamplingParams, request_id: str | None,
                     cancel_fn, *, saves: Sequence[SavePoint] | None = None, splits: Sequence[int] = (),
                     session=None, raw: bool = False, media=None) -> Request:
        """Validate at the boundary (doctrine 3) and build the record; nothing is queued yet."""
        prompt = check_submission(prompt, self.program.vocab_size, self.max_context)
        vocab = self.program.vocab_size
        bad = next((t for t in sp.forced_output if t >= vocab), None)
        if bad is not None:
            raise RequestError(f"sampling.forced_output: token id {bad} outside the vocabulary [0, {vocab})")
        if sp.prompt_logprobs is not None and not getattr(self.program, "serves_prompt_logprobs", False):
            raise RequestError("sampling.prompt_logprobs: not served by this engine (its Program gives the "
                               "last position's logits of a prefill chunk only)")
        matcher = None
        if sp.structured_output is not None and not sp.forced_output:  # compiled here, before queueing
            if self.grammars is None:
                raise RequestError("sampling.structured_output: this engine has no tokenizer to compile a grammar for")
            matcher = self.grammars.matcher(sp.structured_output)
        ticket = next(self._tickets)
        rid = request_id or f"req-{ticket}"
        seed = sp.seed if sp.seed is not None else random.getrandbits(63)
        stop_ids = set(sp.stop_token_ids)
        if not sp.ignore_eos and not sp.forced_output:  # a forced output ends where it was recorded
            stop_ids |= set(self.program.eos_token_ids)
        outbox = Outbox()
        handle = RequestHandle(rid, cancel_fn, outbox)
        if saves is None:  # a raw prompt: its input end is the recovery position P (REC-6)
            saves = (SavePoint(len(prompt)),)
        saves = tuple(sorted((s for s in saves if 0 < s.frontier <= len(prompt)), key=lambda s: s.frontier))
        splits = tuple(sorted({f for f in splits if 0 < f < len(prompt)} | {s.frontier for s in saves}))
        return Request(ticket=ticket, request_id=rid, prompt=prompt, sampling=sp, seed=seed,
                       max_context=self.max_context, handle=handle, outbox=outbox,
                       detok=Detokenizer(self.decode_text, () if sp.forced_output else sp.stop, self.pieces,
                                         min_tokens=sp.min_tokens, include_stop=sp.include_stop_str_in_output),
                       stop_ids=frozenset(stop_ids),
                       saves=saves, splits=splits, session=session, t_submit=self.program.clock(), raw=raw,
                       media=media, matcher=matcher,
                       prompt_lps=[None] if sp.prompt_logprobs is not None else None)

    def reserve_id(self, request_id: str) -> bool:
        """Take `request_id` for a request about to be posted; False while another submitted
        request, queued or running, holds it (any thread)."""
        with self._ids_lock:
            if request_id in self._live_ids:
                return False
            self._live_ids.add(request_id)
            return True

    def release_id(self, request_id: str) -> None:
        with self._ids_lock:
            self._live_ids.discard(request_id)

    # ---- the cycle (engine thread) ---------------------------------------------------------
    def has_work(self) -> bool:
        return bool(self.residents or len(self.fresh) or len(self.preempt) or self.reuse.txns.busy)

    def free_lanes(self) -> int:
        """Lanes neither resident nor kept by a bind in flight (its request binds when it ends)."""
        return self.c - len(self.residents) - self.reuse.txns.reserved_lanes()

    @property
    def recovery_pending(self) -> bool:
        return self.preempt.recovery_pending

    def step(self) -> None:
        start = time.perf_counter()
        self._drain_inbox()
        if self.has_work():
            self.counters["cycles"] += 1
            self._cycle()
        self.cycle_seconds += time.perf_counter() - start

    def _drain_inbox(self) -> None:
        while True:
            try:
                msg = self.inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(msg, Submit):
                self._accept(msg.request)
            elif isinstance(msg, Cancel):
                req = self.by_id.get(msg.request_id)
                if req is not None and req.phase != FINISHED:
                    self._finish(req, "cancelled")
            elif isinstance(msg, Call):
                try:
                    msg.box.put((True, msg.fn()))
                except BaseException as e:  # handed back to the caller's thread
                    msg.box.put((False, e))

    def _accept(self, req: Request) -> None:
        self.counters["requests_submitted"] += 1
        if len(self.fresh) >= self.max_queue:  # Engine.submit refuses earlier; this is the backstop
            self.counters["queue_full_errors"] += 1
            self.counters["requests_failed"] += 1  # submitted = finished + cancelled + failed + live
            self.release_id(req.request_id)
            req.phase, req.finish_reason = FINISHED, "error"
            req.error = str(QueueFullError(f"the queue holds {self.max_queue} requests"))
            req.outbox.finish(req.completion())
            return
        if req.request_id in self.by_id:  # cancel is by id: two live requests never share one
            self.counters["requests_failed"] += 1  # (its id stays the live request's)
            req.phase, req.finish_reason = FINISHED, "error"
            req.error = f"request_id {req.request_id!r} is already in use by a running request"
            req.outbox.finish(req.completion())
            return
        self.by_id[req.request_id] = req
        self.counters["prompt_tokens"] += len(req.prompt)
        self.fresh.push(req)

    def _cycle(self) -> None:
        txns = self.reuse.txns
        txns.advance()  # SCH-9: the cycle's start
        self.preempt.maybe_recover(self)  # SCH-1: recovery first, on a real capacity event
        permits = self._resident_permits()
        prefill = permits.prefill
        admitted = self._admit(take_prefill=prefill is None)
        prefill = prefill or admitted
        txns.advance()  # SCH-9: after admission, before the execution choice
        decode_rows = [r for r in self.residents if r.phase == DECODE and r in permits.decode]
        self._allocate(permits.decode, prefill)
        ran = bool(decode_rows)
        if decode_rows:
            self._run_decode(decode_rows)
        prefilled = prefill is not None and prefill.request.phase == PREFILL
        if prefilled:
            self._run_prefill(prefill.request)
            ran = True
        self._settle(permits.decode, prefill)
        before = self.program.state.transaction
        txns.advance(idle=not ran)  # SCH-9: after Control/Decode (a cycle that ran nothing waits here)
        if not prefilled and before is not None and self.program.state.transaction is not before:
            # SCH-9: a transaction ended at this point (a demotion freed pages, say); the prefill
            # turn no permit let run this cycle applies again and takes the cycle's prefill turn.
            turn = self._refreshed_prefill()
            if turn is not None:
                self._allocate({}, turn)
                self._run_prefill(turn.request)
                self._settle({}, turn)

    def _admit(self, take_prefill: bool = True) -> Turn | None:
        """Fresh admission from the surplus (RES-3, SCH-2): each candidate asks the cache for
        sources and binds the best it can have. Returns the prefill turn if an admitted
        request takes it. Paused requests are not here: they recover by ticket (SCH-6)."""
        turn = None
        lanes = self.free_lanes()
        if not len(self.fresh):
            return None
        if lanes <= 0:
            # SCH-2, WAIT-1: without a free lane the head and its C followers may still keep
            # their chosen recovery sources.
            for req in self.fresh.first(self.c + 1):
                # Quote again only when the cache's index changed since a failed try (SCH-3); a
                # request already waiting keeps its reference until its bind (WAIT-3).
                if not req.bound and req.wait_seen is not self.reuse.cache.index and not self.reuse.waiting(req.ticket):
                    if not self.reuse.wait(req.ticket, self.reuse.identity_at(req, len(req.target)),
                                           session=req.session, ticket=req.ticket):
                        req.wait_seen = self.reuse.cache.index
            return None

        def try_admit(req: Request):
            nonlocal turn
            bound = self._bind_fresh(req)
            if isinstance(bound, Refusal):
                if (not self.residents and not len(self.preempt) and req is self.fresh.head()
                        and bound.reason == "shortfall" and not self.reuse.txns.busy):
                    self.capacity_error(req, bound)  # nothing else holds or frees anything (RES-6)
                if bound.reason == "waiting_release" and self.program.state.transaction is not None:
                    # SCH-2/3: the room it lacks comes with the copy in flight; its followers
                    # would wait for the same copy, so the scan resumes when that copy ends.
                    return WAIT
                return False
            self.bind(req, bound)
            if req.phase == PREFILL and turn is None and take_prefill:
                turn = Turn(req, bound.permit)
                self._last_turn = req.ticket
            elif bound.permit is not None and bound.permit in self.program.state.permits:
                self._settle_permit(req, bound.permit)
            return True

        self.fresh.scan(lanes, try_admit)
        return turn

    def _bind_fresh(self, req: Request, permit: int | None = None):
        # WAIT-2: fresh admission may revoke only younger waiters, never a pause snapshot.
        applicant = ledger.Applicant(ledger.ApplicantKind.NECESSARY, ticket=req.ticket, fresh=True)
        return self.reuse.bind(req.ticket, self.reuse.identity_at(req, len(req.target)), session=req.session,
                               unit_end=lambda f: self.unit_end(req, f), ticket=req.ticket,
                               resume=False, applicant=applicant, permit=permit, at_most=req.logits_from)

    # ---- what the transaction in flight tells the core (TransactionEvents) ------------------
    def transaction_ended(self, ended: TransactionEnd) -> None:
        """SRC-5, SCH-10: a transaction that frees room or answers a waiter makes the queue look
        again and is a capacity event (engine/preempt.py decides for whom); a published bind's
        request binds now."""
        if ended.frees:
            self.fresh.dirty = True
            self.preempt.transaction_ended(ended)
        if ended.published and ended.pending is not None and ended.pending.kind == PendingKind.BIND:
            self._transfer_bound(ended.pending)

    def offload_failed(self, ticket: Hashable) -> None:
        self.preempt.offload_failed(ticket)

    def _transfer_bound(self, pending: Pending) -> None:
        """SCH-9: a bind transaction was published; its request binds now and joins the normal
        permit and capture flow (its first-unit permit is settled: it runs from the next cycle)."""
        if pending.resume:
            req = next((r for r in self.preempt.paused if r.ticket == pending.request), None)
            if req is not None:
                self.preempt.resume_transferred(self, req, pending.permit)
            return
        req = next((r for r in self.fresh if r.ticket == pending.request), None)
        if req is None or self.free_lanes() <= 0:
            return
        bound = self._bind_fresh(req)
        if isinstance(bound, Refusal):
            self.fresh.dirty = True  # it is admitted again by the scan
            return
        self.fresh.remove(req)
        self.bind(req, bound)
        if bound.permit is not None and bound.permit in self.program.state.permits:
            self._settle_permit(req, bound.permit)

    def bind(self, req: Request, bound: Bound) -> None:
        """Adopt the binding the cache gave: lane, StateImage slot, the source's pages (seam of
        BIND-*); with the whole target covered and no token yet, it samples from the
        continuation hidden (an exact hit, or a recovery at its prompt end)."""
        state = self.program.state
        req.bound = True
        req.slot_object, req.slot = bound.state_object, state.objects[bound.state_object].device.location
        req.page_objects = list(bound.page_objects)
        req.pages = [state.objects[o].device.location for o in bound.page_objects]
        req.mtp_page_objects = list(bound.mtp_objects)
        req.mtp_pages = [state.objects[o].device.location for o in bound.mtp_objects]
        req.fed = bound.frontier
        if req.t_admitted is None:
            self._offer_branch_point(req, bound.frontier)
            req.cached_tokens = bound.frontier
            req.hit = bound.hit
            self.counters["cached_tokens"] += bound.frontier
            req.t_admitted = self.program.clock()
            self.histograms["queue_seconds"].observe(req.t_admitted - req.t_submit)
        req.phase = PREFILL
        self.residents.append(req)
        self.residents.sort(key=lambda r: r.ticket)
        if req.fed == len(req.target):
            req.phase = DECODE
            if not req.output:
                if req.recovery_permit is None:
                    self.counters["full_hits"] += 1
                self._sample(req, self._compute(self.program.hidden_logits, req.slot, req.target[-1],
                                                len(req.target) - 1))
        req.computed = max(req.computed, req.fed)  # past here, bound tokens are not recomputed

    def _offer_branch_point(self, req: Request, bound: int) -> None:
        """SH-6 (engine/branch_points.py): where this prompt leaves every recently seen one
        becomes a shared save opportunity, before its first chunk runs. A rendered prompt gets
        one too (a system prompt or tool block its rendering marks nowhere), but as an automatic
        marker it gives way when four shared markers are in use already."""
        known = self.reuse.known
        if known is None:
            return
        if not req.raw and sum(1 for s in req.saves if s.shared) >= MAX_SHARED_MARKERS:
            return
        blocks = self.reuse.identity_at(req, len(req.prompt)).blocks
        b = known.branch_point(blocks, len(req.prompt), bound)
        known.remember(blocks)
        if b is None or any(s.frontier == b for s in req.saves) or (req.media is not None and req.media.inside(b)):
            return
        req.saves = tuple(sorted(req.saves + (SavePoint(b, None, shared=True, explicit=False),),
                                 key=lambda s: s.frontier))
        req.splits = tuple(sorted(set(req.splits) | {b}))
        self.counters["branch_points"] += 1

    # ---- ends and errors ---------------------------------------------------------------
    def _release(self, req: Request, publish: bool = False) -> None:
        """End the request's hold: a normal finish publishes E (BIND-6), anything else only
        releases; its lane is free (a recovery opportunity, SCH-10)."""
        self.reuse.txns.cancel_for(req.ticket)  # TXN-2: its bind or offload in flight is cancelled
        self.reuse.release_wait(req.ticket)  # a cancelled waiter (WAIT-4); a bind already handed it over
        self.preempt.end_recovery(req)
        if req.bound:
            if req.slot_object is not None:
                self.reuse.end(self.reuse.view_of(req), publish=publish)
            else:  # paused: bound to its record, no view (PAUSE-1); its snapshot goes
                self.reuse.end_paused(req.ticket)
            req.bound = False
        self.vacate(req)
        self.preempt.event = True  # SCH-10: a finish or cancel is a capacity event

    def vacate(self, req: Request) -> None:
        """Settle every permit the request holds and drop its lane binding (pages, slot,
        frontier): it is resident no more. Its objects were released before, with its view
        (an end, a pause)."""
        for pid, permit in list(self.program.state.permits.items()):
            if permit.owner == req.key:
                self._settle_permit(req, pid)
        req.pages, req.page_objects, req.slot, req.slot_object = [], [], None, None
        req.mtp_pages, req.mtp_page_objects = [], []
        req.fed = 0
        if req in self.residents:
            self.residents.remove(req)
        self.fresh.dirty = True

    def capacity_error(self, req: Request, refusal: Refusal) -> None:
        """RES-6: the request cannot obtain a legal unit even alone: it ends with the error."""
        self.counters["capacity_errors"] += 1
        detail = refusal.shortfall
        req.error = str(CapacityError(
            f"request {req.request_id} cannot obtain a legal unit even alone "
            f"(RES-6; shortfall {detail.pools if detail else refusal.detail})"))
        self._finish(req, "error")

    def finish(self, req: Request, reason: str) -> None:
        """End a live request now ("cancelled", "error", ...), releasing what it holds: for the
        engine's close and its failure cleanup (engine/failure.py). `_finish` is the one
        implementation (tests replace it to stand for a broken ledger)."""
        self._finish(req, reason)

    def _finish(self, req: Request, reason: str) -> None:
        if req.phase == QUEUED:
            self.fresh.remove(req)
        elif req.phase == PAUSED:
            self.preempt.remove(req)
        self._release(req, publish=reason in ("stop", "length"))
        req.phase, req.finish_reason = FINISHED, reason
        req.t_finished = self.program.clock()
        self.histograms["e2e_seconds"].observe(req.t_finished - req.t_submit)
        if reason == "cancelled":
            self.counters["requests_cancelled"] += 1
        elif reason == "error":
            self.counters["requests_failed"] += 1
        else:
            self.counters["requests_finished"] += 1
        # What the detokenizer still holds (an incomplete character, a tail that might have grown
        # into a stop string) is output too when the request ends by length, cancel, EOS or a stop
        # token; after a stop string `flush` releases nothing (the stop string is not output).
        tail = req.detok.flush() if reason in ("length", "cancelled", "stop") else ""
        if tail:
            req.outbox.push(TokenDelta((), tail))
        if self.by_id.get(req.request_id) is req:
            del self.by_id[req.request_id]
        self.release_id(req.request_id)
        req.outbox.finish(req.completion())

    # ---- pauses, integrity ---------------------------------------------------------------
    def pause(self, request_id: str, route: str | None = None) -> bool:
        """Pause a resident now, between cycles (SCH-5), by `route` ("snapshot" | "replay";
        default: the engine's choice). For operators and tests; returns False if it is not
        resident."""
        req = self.by_id.get(request_id)
        if req is None or req not in self.residents:
            return False
        self.preempt.pause(self, req, route)
        return True

    def check_integrity(self) -> None:
        """Recount the ledger and the cache policy from first principles, then check every
        binding against them (doctrine 2)."""
        check_engine(self)

    def clear_cache(self) -> None:
        """Drop every cached point (no request may be bound); a transaction still in flight
        ends first."""
        self.reuse.drive_transaction()
        self.reuse.clear()
        self.media_cache.clear()
