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

from typing import TYPE_CHECKING, NamedTuple, Sequence

import ledger
from ledger import (MAIN_KV, Applicant, ApplicantKind, BindRequest, CacheResult, Gap, Refusal, SequenceView,
                    SourceQuery, UnitDemand, UnitKind)
from ledger.driver import SavePoint, bound_view, capture_request, captured, plan_with_reclaim
from ledger.effects import CopyToDevice, CopyToHost
from ninfer_jax.engine.branch_points import KnownHistories
from ninfer_jax.engine.transactions import Pending, PendingKind, TransactionEvents, Transactions
from ninfer_jax.model.spec_steps import MTP_POOL
from ninfer_jax.program import calibrate

if TYPE_CHECKING:
    from ninfer_jax.engine.contract import ProgramContract
    from ninfer_jax.engine.request import Request

__all__ = ["Bound", "ContextCache", "SavePoint"]  # SavePoint: ledger/driver.py's, the one both drivers use


class Bound(NamedTuple):
    frontier: int  # tokens taken from the source
    takeover: str
    state_object: int
    page_objects: tuple[int, ...]
    permit: int | None
    mtp_objects: tuple[int, ...] = ()  # the MTP backend KV pages taken (speculative decoding)
    hit: dict | None = None  # the recovery point bound from (`hit_of`); None: none (the root)


def hit_of(src, cand) -> dict | None:
    """What served a bind, for the request's record (`Completion.hit`): the recovery point's kind
    (PointKind: E, input, anchor, shared, snapshot), its typed R kind for an input point, the
    token frontier it covers, the takeover (BIND-5) and whether it was private. None for the
    root (nothing reused)."""
    if src is None or not cand.frontier:
        return None
    return {"kind": src.kind, "input_kind": src.input_kind or None, "frontier": cand.frontier,
            "takeover": cand.takeover, "private": bool(cand.private)}


class ContextCache:
    def __init__(self, program: ProgramContract, counters, *, enabled: bool = True, execution: str = "",
                 events: TransactionEvents | None = None):
        """`events`: who drives the context transaction and hears of its ends (EngineCore)."""
        self.program = program
        self.counters = counters
        self.enabled = enabled
        self.execution = execution  # model, dtype, backend: state from elsewhere is never adopted (CKP-4)
        # A model with a vision tower places every token by M-RoPE (a text token: its index on
        # all three axes); its positions follow from the tokens and the media ranges.
        self.position_scheme = "mrope" if program.takes_media else "linear"
        # KV pools a sequence holds pages in: Main KV, and the MTP backend KV with speculative
        # decoding (RES-1: its pages come with every unit, capture and bind like Main KV's).
        self.mtp = bool(program.speculative_tokens)
        # the drafts' backend KV pool: the MTP layers' or a DFlash drafter's context (issue 35)
        self.spec_pool = getattr(program, "spec_pool", MTP_POOL)
        self.cache = ledger.empty_cache()
        # the one context transaction, in flight across cycles (TXN-1, SCH-9)
        self.txns = Transactions(self, program, counters, events)
        # SRC-3: the Program's prices (calibrated at warm-up, injected, or the ledger's default
        # for a Program that carries none), in seconds; they order sources, never decide what
        # is recoverable. `rates` keeps what the ledger's CostModel has no field for (D2H).
        self.rates = calibrate.rates_of(program)
        self.cost = self.rates.ledger()
        # SH-6 for raw prompts: recently seen prompts, block by block (engine/branch_points.py)
        self.known = KnownHistories() if enabled and program.config.context_cache.branch_points else None
        self._facts = None  # RCL-2: the shared facts of the quotes on the current states
        self._quotes: dict = {}  # (gap, applicant, protect) -> its quote on those states

    # ---- plumbing ------------------------------------------------------------------------
    def identity(self, tokens: Sequence[int], known: ledger.InputIdentity | None = None,
                 media: Sequence = ()) -> ledger.InputIdentity:
        """The identity of `tokens` with its media ranges `(start, end, key)` (CKP-4, SH-7);
        `known`, an identity of a prefix of them with the same media (a request's before its
        latest outputs), lends its block digests so only the new blocks are hashed."""
        toks = tuple(tokens)
        media = tuple(media)
        if (known is not None and known.execution == self.execution and known.media == media
                and toks[:len(known.tokens)] == known.tokens):
            return ledger.extend(known, toks[len(known.tokens):])
        return ledger.identity_of(toks, media, self.position_scheme, execution=self.execution)

    def identity_at(self, req: Request, n: int) -> ledger.InputIdentity:
        """The identity of the request's first `n` tokens (prompt, then output), hashed once per
        output length rather than at every chunk and capture; prefixes share its digests. A
        frontier inside a media item (a chunk may end there) gets the identity of a view that
        is never adopted (`InputIdentity.cut`, SH-7)."""
        total = len(req.prompt) + len(req.output)
        if req.ident is None or len(req.ident.tokens) != total:
            req.ident = self.identity(req.prompt + tuple(req.output), req.ident,
                                      req.media.ranges if req.media is not None else ())
        return req.ident.cut(n) if req.media is not None else req.ident.prefix(n)

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
        if plan.kind != "begin_transfer":  # its caller names what waits for a transfer it begins
            self.txns.adopt()  # RCL-7: a demotion a reclamation began inside this plan runs like any

    def drive_transaction(self) -> None:
        """Run the one context transaction to its end now, waiting for its copies (TXN-1), with
        its continuation: for callers that need the result at once (clear_cache, tests). The
        cycle instead advances it at the SCH-9 points (engine/transactions.py)."""
        self.txns.finish()

    def quote(self, gap: Gap, applicant: Applicant, protect=()) -> ledger.Quote:
        """RCL-2: a read-only quote on the current states. The facts every quote on the same
        (ledger state, cache) pair shares (the victim order brought to the ledger's replicas,
        the HEAT-4 segment) are computed once and kept until either changes, and a quote the
        same decision already asked for on those states is answered again, not recomputed: an
        admission that walks several sources and retries (RES-4) costs one quote per scarce
        pool and applicant per attempt."""
        state, cache = self.program.state, self.cache
        if self._facts is None or not self._facts.valid_for(state, cache):
            self._facts, self._quotes = ledger.quote_facts(state, cache), {}
        key = (gap, applicant, frozenset(protect))
        q = self._quotes.get(key)
        if q is None:
            q = self._quotes[key] = self._facts.quote(gap, applicant, key[2])
            self.counters["reclaim_quotes"] += 1
        return q

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
            if pool != ledger.HOST and applicant.demote and self.program.state.transaction is not None:
                # SCH-9, TXN-1: while a transaction holds the one slot no demotion can start.
                # What costs nothing goes now (Device copies of Host-replicated content, points
                # worth nothing, RCL-1); anything else would delete what a demotion would keep,
                # so the refused work waits for the transaction's end (`Transactions.releases`).
                q = self.quote(gap, applicant._replace(demote=False), protect)
                if not q.admitted or q.loss:
                    self.txns.reclaim_waits = True
                    continue
            else:
                q = self.quote(gap, applicant, protect)
                if not q.admitted and revoke:
                    q = self.quote(gap, applicant._replace(revoke_waiters=True), protect)
                if not q.admitted:
                    continue
            got = ledger.plan_reclaim(self.program.state, self.cache, q)
            if isinstance(got, Refusal):
                continue
            self.apply(got)
            self.txns.adopt()  # RCL-7: a demotion is submitted and completes at a later SCH-9 point,
            self.txns.land_demotion()  # or now if its copies have landed already (RES-4)
            self.counters["reclaims"] += 1
            done = True
        return done

    def retry(self, make, protect=(), applicant: Applicant | None = None, revoke: bool = True):
        """Plan, and on a shortfall reclaim and plan again at once (RES-4: ledger/driver.py)."""
        return plan_with_reclaim(make, lambda pools: self.reclaim(pools, protect, applicant, revoke=revoke))

    # ---- admission: sources and bind -------------------------------------------------------
    def bind(self, request, ident: ledger.InputIdentity, *, session, unit_end, ticket: int, resume: bool,
             snapshot: int | None = None, applicant: Applicant | None = None, revoke: bool = True,
             permit: int | None = None, at_most: int | None = None) -> Bound | Refusal:
        """Query sources for the tokens of `ident` and bind the best one that can be had
        (SRC-*, BIND-*). Returns the binding, or the last Refusal (nothing retired, SRC-4).

        `unit_end(frontier)` is where the unit permit taken with the bind must reach from a
        source at `frontier` (TXN-2): the first chunk or decode step of a fresh request; for a
        paused request (`resume`) the rebuild to its old frontier plus its first real new unit,
        taken in one go as the recovery permit (RES-5). A paused request's own Snapshot is
        redeemed first, with no query (SRC-5). `applicant` and `revoke` bound what reclamation
        may take for it (WAIT-2: fresh admission revokes only younger waiters; RD-3).

        A source with objects only on the Host starts the bind transaction (TXN-1/2, with the
        recovery permit when resuming) and returns Refusal("transfer_pending"): the request
        waits, and `bind` is called again with the transaction's `permit` once it is published
        (engine/transactions.py). A source blocked by the running transaction, a read-back while
        the one slot is taken, or a shortfall a transfer in flight will close is waited for
        rather than given up for a worse source (SRC-5): Refusals in `WAIT_REASONS`. `at_most`: no
        source past this frontier (a request that needs every position's logits from there on)."""
        query = SourceQuery(request, ident, session if self.enabled else None, snapshot=snapshot)
        cands = ledger.query_sources(self.program.state, self.cache, query, self.cost)
        if at_most is not None:  # it must compute from there on itself (prompt_logprobs); the root always fits
            cands = tuple(c for c in cands if c.frontier <= at_most)
        last: Refusal = Refusal("no_source", None, "no candidate")
        page = ledger.PAGE_TOKENS
        kind = UnitKind.RECOVERY if resume else UnitKind.PREFILL
        owner = ledger.seq_holder(request)
        given = permit  # taken by this request's completed bind transaction (TXN-2)
        short = False  # a better source already found no room to bind

        def wait(reason: str, detail: str) -> Refusal:
            if given is not None and given in self.program.state.permits:
                self.program.commit(ledger.plan_settle(self.program.state, given, owner))
            self.txns.waiters = True  # the transaction's end is this request's event
            return Refusal(reason, None, detail)

        for cand in cands:
            if cand.blocked:  # SRC-5: a valuable source blocked by in-flight work is waited for
                txn = self.program.state.transaction
                if resume and txn is not None and txn.owner == ("pause", request):
                    # TXN-2: its own Snapshot's offload is not needed any more: cancelled, it
                    # reverts when the copy ends and the content stays on Device.
                    self.txns.cancel_for(request)
                return wait("source_blocked", f"source {cand.cid} is in transaction {txn and txn.generation}")
            src = self.cache.checkpoints.get(cand.cid)
            protect = src.object_ids() if src is not None else ()  # the whole source stays (RCL-8)
            need = -(-unit_end(cand.frontier) // page) - -(-cand.frontier // page)
            unit = UnitDemand(owner, kind, self.unit_pools(max(0, need)))
            permit = given
            if cand.missing:  # a Host copy: bring it back to Device first (BIND-5, TXN-*)
                if permit is not None:  # what the transaction brought back is gone again
                    self.program.commit(ledger.plan_settle(self.program.state, permit, owner))
                    given = permit = None
                if short:
                    # Its bind would need the room a better source just lacked, and bringing it
                    # back takes more: no transfer (else two Host sources could evict each
                    # other's read-back turn by turn). Sources already on Device are still tried.
                    continue
                if self.program.state.transaction is not None:  # TXN-1: one at a time
                    return wait("transaction_busy", f"transaction {self.program.state.transaction.generation} runs")
                # TXN-2: a paused-recovery bind takes the full recovery permit with its transfer.
                t = self.retry(lambda c=cand: self._bind_transfer(request, c, unit if resume else None),
                               protect, applicant, revoke)
                if isinstance(t, Refusal):
                    if t.reason == "transaction_busy" or (  # reclamation started a demotion for it
                            t.reason == "shortfall" and t.shortfall and self.txns.releases(t.shortfall.pools)):
                        return wait("waiting_release", f"a transfer in flight frees room: {t.detail}")
                    last = t
                    continue
                self.apply(t)  # destinations reserved, sources leased, the permit taken (TXN-1/2)
                self.txns.started(Pending(PendingKind.BIND, request, resume,
                                          t.proof.permits[0] if resume else None, cand.cid))
                return Refusal("transfer_pending", None, f"bind transaction {t.proof.generation} in flight")
            first = unit if permit is None else None
            got = self.retry(lambda c=cand: ledger.plan_bind(
                self.program.state, self.cache,
                BindRequest(request, c, session, first, ticket=ticket, resume=resume)), protect, applicant, revoke)
            if isinstance(got, Refusal):
                if got.reason == "source_busy" or (
                        got.reason == "shortfall" and got.shortfall and self.txns.releases(got.shortfall.pools)):
                    return wait("waiting_release", got.detail)  # SRC-5: in flight, not gone
                if permit is not None:
                    self.program.commit(ledger.plan_settle(self.program.state, permit, owner))
                    given = None
                short = short or got.reason == "shortfall"
                last = got
                continue
            self.apply(got)
            view = bound_view(got)
            if permit is None:
                permit = view.permit
            pages = view.pages(MAIN_KV)
            mtp = view.pages(self.spec_pool)
            self._drop_stale_host(view.state_object, (pages, mtp), cand.frontier)
            if not resume:
                self.counters["cache_queries"] += 1  # one per fresh admission: hits / queries
            if cand.frontier and not resume:
                self.counters["cache_hits"] += 1
                self.counters["cache_hits_private" if cand.private else "cache_hits_shared"] += 1
                self.counters["reused_tokens"] += cand.frontier
            return Bound(cand.frontier, cand.takeover, view.state_object, tuple(pages), permit, tuple(mtp),
                         hit_of(src, cand))
        if given is not None and given in self.program.state.permits:
            self.program.commit(ledger.plan_settle(self.program.state, given, owner))
        return last

    def _drop_stale_host(self, state_object: int, page_lists, frontier: int) -> None:
        """BIND-5: the writer computes into its StateImage and appends into a partial tail
        page in place (of each KV pool it holds), so a Host replica of any would go stale: drop
        it now (the Device replica is complete), or a later restore from Host would read old
        bytes (doctrine 1)."""
        tail = frontier % ledger.PAGE_TOKENS
        writable = [state_object] + [pages[-1] for pages in page_lists if pages and tail]
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

    def waiting(self, request) -> bool:
        """Whether the request holds a waiting reference (WAIT-1); `wait` would keep it as is."""
        return self.enabled and request in self.cache.waiters

    def release_wait(self, request) -> None:
        """WAIT-4: cancel or timeout ends the waiting reference."""
        if request in self.cache.waiters:
            self.apply(ledger.plan_release_wait(self.program.state, self.cache, request))

    # ---- prefill, captures, ends -------------------------------------------------------------
    def view(self, request, ident: ledger.InputIdentity, state_object, page_objects, mtp_objects=()) -> SequenceView:
        """What the request holds now; `ident` covers exactly its execution frontier. With
        speculative decoding the MTP backend KV pages are held and captured alongside (CKP-1)."""
        kv = ((MAIN_KV, tuple(page_objects)),)
        if self.mtp:
            kv += ((self.spec_pool, tuple(mtp_objects)),)
        return SequenceView(request, ident, state_object, kv)

    def view_of(self, req: Request) -> SequenceView:
        """What the bound resident `req` holds now, at its execution frontier."""
        return self.view(req.ticket, self.identity_at(req, req.fed), req.slot_object, req.page_objects,
                         req.mtp_page_objects)

    def unit_pools(self, pages: int) -> dict:
        """The typed pool units of a unit needing `pages` more Main KV pages (RES-1): the same
        count of MTP backend KV pages with speculative decoding (same page size, same frontier)."""
        return {MAIN_KV: pages, self.spec_pool: pages} if self.mtp else {MAIN_KV: pages}

    def observe(self, request, ident: ledger.InputIdentity, lo: int, hi: int, candidates: Sequence[int]) -> None:
        """HEAT-2: compute demand of a new prefill commit (never for Replay, PAUSE-5)."""
        if self.enabled and request in self.cache.active:
            self.cache = ledger.observe_prefill(self.cache, request, ident, lo, hi, candidates)

    def capture(self, view: SequenceView, save: SavePoint) -> bool:
        """SAVE-*: capture at a semantic frontier; skipped, never blocking, when refused."""
        if not self.enabled:
            return False
        got = ledger.plan_capture(self.program.state, self.cache, capture_request(view, save))
        if isinstance(got, Refusal):
            self.counters["captures_skipped"] += 1
            return False
        self.apply(got)
        did = captured(got)
        self.counters["captures"] += did.kept
        self.counters["captures_skipped"] += did.skipped
        return did.kept > 0

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
        bytes it copies, or None when the content cannot be placed (the caller turns to Replay).

        The copy is one `pause` transaction, submitted here and completed at a later SCH-9
        point (engine/transactions.py): the Device units are free once it is published. With
        the slot taken (TXN-1) the offload is deferred to the next free point; the content
        stays on Device until then."""
        state = self.program.state
        c = self.cache.checkpoints[snapshot]
        if state.transaction is not None:
            self.txns.defer_offload(request, snapshot, publication)
            return sum(state.objects[o].device.nbytes for o in c.object_ids()
                       if state.objects[o].device is not None and state.objects[o].host is None)
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
            q = self.quote(Gap(ledger.HOST, sum(a.size for a in allocs), allocs), applicant, protect=move)
            if q.admitted:
                r = ledger.plan_reclaim(self.program.state, self.cache, q)
                if not isinstance(r, Refusal):
                    self.apply(r)
                    self.txns.adopt()
                    self.counters["reclaims"] += 1
                    got = ledger.plan_begin_transfer(self.program.state, req)
                    if isinstance(got, Refusal) and got.reason == "transaction_busy":  # the reclamation's own demotion
                        self.txns.defer_offload(request, snapshot, publication)
                        return sum(self.program.state.objects[o].device.nbytes for o in move)
        if isinstance(got, Refusal):
            return None
        self.apply(got)
        self.txns.started(Pending(PendingKind.PAUSE, request))
        return sum(j.dst.nbytes for j in self.program.state.transaction.jobs)

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
