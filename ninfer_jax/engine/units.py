"""Resident unit permits, chunking and settlement (RES-1..5, SCH-1, SCH-4, SCH-8, RD-7).

A mixin of `EngineCore`: every cycle the residents apply for the typed Main KV their next unit
needs, recovery first then by original ticket; the runnable subset runs; pages are drawn from
the permits just before execution and every cycle permit is settled after it. The recovery
permit (engine/preempt.py) is drawn from across cycles and is not settled here.
"""
from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import ledger
from ledger import MAIN_KV, Refusal, UnitDemand, UnitKind
from ledger.driver import chunk_end
from ninfer_jax.engine.request import DECODE, PREFILL, Request

PAGE = ledger.PAGE_TOKENS
# A unit whose pages are all bound already (most decode steps: one page holds PAGE tokens)
# demands nothing from any pool: it cannot be refused and reserves nothing (RES-2), so it
# applies for no permit and the cycle writes nothing to the ledger for it.
NO_UNITS = "no-units"


class Turn(NamedTuple):
    """The cycle's prefill turn (SCH-8): the request and the permit its chunk draws from (a
    permit id, the recovery permit, or NO_UNITS)."""

    request: Request
    permit: object


@dataclasses.dataclass
class CyclePermits:
    """RES-3: what the residents were granted for this cycle: each decoding row's permit, and
    the prefill turn's (None when no prefilling resident may run a chunk)."""

    decode: dict  # Request -> permit id | NO_UNITS
    prefill: Turn | None = None


class UnitPlanning:
    @staticmethod
    def _pages_needed(req: Request, upto: int) -> int:
        return max(0, math.ceil(upto / PAGE) - len(req.pages))

    def _chunk_end(self, req: Request, at: int) -> int:
        """End of the prefill chunk starting at `at`: exactly at the next semantic frontier
        (REC-8), at the old frontier while replaying, never past the target; a chunk end by
        itself is never a save (G-6)."""
        end = req.computed if at < req.computed else len(req.target)
        return chunk_end(at, end, req.splits, self.program.chunk_size)

    def _chunk(self, req: Request) -> int:
        return self._chunk_end(req, req.fed) - req.fed

    def unit_end(self, req: Request, at: int) -> int:
        """RD-7: where the unit starting at `at` reaches: one decode step past the target (with
        speculative decoding the Verify unit's peak, `_decode_span`), or one prefill chunk of
        the configured size."""
        return at + self._decode_span(req) if at >= len(req.target) else self._chunk_end(req, at)

    def _drafts(self, req: Request) -> int:
        """Drafts the row's next Verify unit checks: k, fewer where max_tokens, max_context or a
        forced output leaves room for fewer tokens (a Verify unit emits up to drafts + 1)."""
        k = self.spec_k
        if not k:
            return 0
        out = len(req.output)
        sp = req.sampling
        room = min(sp.max_tokens - out, req.max_context - len(req.prompt) - out)
        if sp.forced_output:
            room = min(room, len(sp.forced_output) - out)
        return max(0, min(k, room - 1))

    def _decode_span(self, req: Request) -> int:
        """Positions a decode unit writes from the frontier: 1, or 1 + drafts for a Verify unit
        (RES-1: its speculative peak is reserved like any unit's pages)."""
        return 1 + self._drafts(req)

    def _prefill_turn(self) -> Request | None:
        """SCH-7/SCH-8: the recovery holder rebuilding first; otherwise prefilling residents
        rotate the turn by ticket at chunk boundaries."""
        rows = [r for r in self.residents if r.phase == PREFILL]
        if not rows:
            return None
        holder = self.preempt.holder
        if holder is not None and holder.phase == PREFILL:
            return holder
        return next((r for r in rows if r.ticket > self._last_turn), rows[0])

    def _resident_permits(self) -> CyclePermits:
        """RES-3: resident rows, recovery first then by ticket; the oldest always progresses
        (pausing the young, SCH-4)."""
        reclaimed = False
        turn = self._prefill_turn()
        holder = self.preempt.holder
        if turn is None and holder is None and all(r.phase == DECODE and r.fed + self._decode_span(r) <= len(r.pages) * PAGE
                                                   for r in self.residents):
            # The common decode cycle: every row's next token lands in a page it holds (RES-2),
            # so no row applies and nothing is planned or committed.
            return CyclePermits(dict.fromkeys(self.residents, NO_UNITS))
        while True:
            rows, demands, free = [], [], set()
            for r in self.residents:
                if r.phase == DECODE:
                    need = self._pages_needed(r, r.fed + self._decode_span(r))
                    kind = UnitKind.VERIFY if self.spec_k else UnitKind.DECODE
                elif r is turn:
                    kind = UnitKind.REPLAY if r.replaying else UnitKind.PREFILL
                    need = self._pages_needed(r, r.fed + self._chunk(r))
                else:
                    continue
                if r is holder and need <= self._permit_left(r):
                    continue  # RES-5: drawn from the recovery permit the Program holds
                if not need:
                    free.add(id(r))  # RES-2: nothing to reserve, nothing to refuse
                    continue
                rows.append(r)
                demands.append(UnitDemand(r.key, kind, self.reuse.unit_pools(need)))
            plan = ledger.plan_cycle_permits(self.program.state, demands) if demands else None
            results = plan.proof.rows if plan is not None else ()
            refused = [r for r, got in zip(rows, results) if isinstance(got, Refusal)]
            if refused and not reclaimed:
                # Running rows short of units take optional cache first (RCL-8), once per cycle,
                # then plan again at once (RES-4).
                reclaimed = True
                gaps: dict = {}
                for got in results:
                    if isinstance(got, Refusal) and got.shortfall:
                        for pool, n in got.shortfall.pools.items():
                            gaps[pool] = gaps.get(pool, 0) + n
                if gaps and self.reuse.reclaim(gaps):
                    continue
            oldest = self.residents[0] if self.residents else None
            first = next((r for r in self.residents if r.phase == PREFILL), None)
            if refused and turn in refused and turn is not first and turn is not holder:
                turn = first  # SCH-8: a rotated turn that cannot run goes back to the oldest
                continue
            if refused and refused[0] is oldest:
                # SCH-4: the oldest resident cannot progress: pause the youngest other resident
                # that may be preempted and plan again at once (RES-4) — unless a copy in flight
                # (a pause's offload, a demotion) frees what it lacks: then it waits for that
                # rather than preempting more (SCH-9).
                got = results[rows.index(oldest)]
                txns = self.reuse.txns
                waiting = txns.releases(got.shortfall.pools if got.shortfall else ())
                victims = [] if waiting else self.preempt.pausable(self.residents, exclude=(oldest,))
                if victims:
                    self.preempt.pause(self, victims[0])
                    if victims[0] is turn:
                        turn = self._prefill_turn()
                    reclaimed = False  # the pause changed what the cache may give up
                    continue
                if holder is None and not txns.busy:  # alone: no releaser exists (RES-6)
                    self.capacity_error(oldest, got)
                    turn = self._prefill_turn()
                    continue
                # the recovery holder holds its permit, or a transfer in flight will release:
                # the oldest waits
            if plan is not None:
                self.program.commit(plan)
            out = CyclePermits({})
            granted = dict(zip(map(id, rows), results))
            for r in self.residents:
                got = NO_UNITS if id(r) in free else granted.get(id(r))
                if got is None and r is holder and (r.phase == DECODE or r is turn):
                    got = r.recovery_permit
                if got is None or isinstance(got, Refusal):
                    continue  # waits for a later cycle; the oldest row is never here
                if r is turn and r.phase == PREFILL:
                    out.prefill = Turn(r, got)
                elif r.phase == DECODE:
                    out.decode[r] = got
            if out.prefill is not None:
                self._last_turn = out.prefill.request.ticket
            return out

    def _refreshed_prefill(self) -> Turn | None:
        """SCH-9: after Control/Decode, the prefill turn that had no permit this cycle applies
        again, once, with no reclamation and no pause (a refusal waits for the next cycle, as
        it would have). The recovery holder draws from its own permit and is not refreshed."""
        turn = self._prefill_turn()
        if turn is None or turn is self.preempt.holder or turn.phase != PREFILL:
            return None
        kind = UnitKind.REPLAY if turn.replaying else UnitKind.PREFILL
        need = self._pages_needed(turn, turn.fed + self._chunk(turn))
        if not need:
            self._last_turn = turn.ticket
            return Turn(turn, NO_UNITS)  # RES-2: nothing to reserve
        plan = ledger.plan_cycle_permits(self.program.state, [UnitDemand(turn.key, kind, self.reuse.unit_pools(need))])
        got = plan.proof.rows[0]
        if isinstance(got, Refusal):
            return None
        self.program.commit(plan)
        self._last_turn = turn.ticket
        return Turn(turn, got)

    def _permit_left(self, req: Request) -> int:
        p = self.program.state.permits.get(req.recovery_permit) if req.recovery_permit is not None else None
        return -1 if p is None else p.remaining.get(MAIN_KV, 0)

    def _allocate(self, decode_permits: dict, prefill: Turn | None) -> None:
        grants = list(decode_permits.items())
        if prefill is not None:
            grants.append(prefill)
        for req, pid in grants:
            if pid is NO_UNITS:
                continue  # RES-2: its pages are all bound already
            upto = req.fed + (self._decode_span(req) if req.phase == DECODE else self._chunk(req))
            n = self._pages_needed(req, upto)
            if n:
                plan = ledger.plan_allocate(self.program.state, MAIN_KV, n, req.key, permit_id=pid)
                self.program.commit(plan)
                for obj, _, unit in plan.proof.allocated:
                    req.page_objects.append(obj)
                    req.pages.append(unit)
                if self.spec_k:  # the MTP backend KV pages of the same positions (RES-1)
                    plan = ledger.plan_allocate(self.program.state, self.reuse.spec_pool, n, req.key, permit_id=pid)
                    self.program.commit(plan)
                    for obj, _, unit in plan.proof.allocated:
                        req.mtp_page_objects.append(obj)
                        req.mtp_pages.append(unit)

    def _settle_permit(self, req: Request, pid: int) -> None:
        self.program.commit(ledger.plan_settle(self.program.state, pid, req.key))

    def _settle(self, decode_permits: dict, prefill: Turn | None) -> None:
        pairs = [(pid, r.key) for r, pid in decode_permits.items() if pid is not NO_UNITS]
        if prefill is not None:
            pairs.append((prefill.permit, prefill.request.key))
        live = self.program.state.permits
        # A finished row's permit went with it; the recovery permit outlives the cycle (RES-5).
        pairs = [p for p in pairs if p[0] in live and p[0] != self.program.state.recovery_permit]
        if pairs:
            self.program.commit(ledger.plan_settle_all(self.program.state, pairs))
