"""A model-free driver of the cache policy: the call order of docs/cache_policy.md, one request
at a time, on a bare `LedgerState` of any pool geometry (`small_config`).

Used by the ledger's tests, the replay harness (`python -m ninfer_jax.bench.cache_replay`) and
the benchmark. One request at a time: admission -> source query -> bind (a bind transaction
first when the source lies on Host) -> prefill in chunks split at the semantic frontiers, with
a capture at each -> decode -> finish publishes E. Shortage is met by a reclamation quote for
the scarce pool (necessary execution, RCL-8) and the operation is planned again (RES-4).
Every committed plan goes through `ledger.commit`; `check` runs check_cache after each.

It schedules nothing: there is no queue, no lane, no permit and no preemption here, and every
transaction is run to its end at once. The engine's scheduling cycle (ninfer_jax/engine/core.py,
which the cost-model Program `ninfer_jax.sim.SimProgram` runs without model math) is the one
scheduler; the steps both take the same way — save points and their captures, where a chunk
ends, the reclaim-and-replan loop (RES-4), the reading of a bind's and a capture's outcome —
are ledger/driver.py's.
"""
from __future__ import annotations

from typing import Hashable, NamedTuple, Sequence

from ledger import commit
from ledger import driver
from ledger.bind import BindRequest, plan_bind, plan_bind_transfer
from ledger.reclamation.edit import CacheResult
from ledger.cache_integrity import check_cache
from ledger.cache_state import CostModel, InputKind, PointKind, empty_cache, seq_holder
from ledger.capture import SequenceView, plan_capture, plan_clear, plan_publish_end
from ledger.reclamation.demand import observe_prefill
from ledger.identity import InputIdentity, identity_of
from ledger.objects import plan_allocate, plan_drop_holders
from ledger.plan import Plan, Refusal
from ledger.reclamation import Applicant, ApplicantKind, Gap, gap_order, plan_reclaim, quote
from ledger.sources import SourceQuery, query_sources
from ledger.state import KV_PAGES, MAIN_KV, STATE_POOL, STATE_SLOTS, LedgerConfig, PoolSpec, initial_state
from ledger.transactions import plan_complete, plan_publish, plan_submit


def SavePoint(frontier: int, kind: str = PointKind.INPUT,  # noqa: N802 - the ledger tests' spelling of one type
              input_kind: str = InputKind.RESPONSE_REPLAY) -> driver.SavePoint:
    """The save point (`ledger.driver.SavePoint`, the engine's) of a capture of `kind` at
    `frontier`: INPUT or ANCHOR a private point, SHARED a shared entry only (SH-1)."""
    private = kind if kind in (PointKind.INPUT, PointKind.ANCHOR) else None
    return driver.SavePoint(frontier, private, input_kind, shared=kind == PointKind.SHARED)


class Outcome(NamedTuple):
    request: Hashable
    prompt_tokens: int
    reused: int  # tokens taken from the source (its frontier)
    source: str  # takeover kind
    prefill: int
    captures: int
    skipped: int


class CapacityError(Exception):
    """RES-6: even alone, the request cannot get a legal unit."""


def small_config(main_pages: int, state_slots: int, host_bytes: int, page_bytes: int = 1024,
                 slot_bytes: int = 4096, backend_pages: int = 0) -> LedgerConfig:
    """Main KV (64-token pages), StateImage slots and, optionally, a backend KV pool
    ("backend_kv:mtp", 32-token pages of half the bytes: its own geometry)."""
    pools = [PoolSpec(MAIN_KV, KV_PAGES, main_pages, page_bytes, 64),
             PoolSpec(STATE_POOL, STATE_SLOTS, state_slots, slot_bytes)]
    if backend_pages:
        pools.append(PoolSpec("backend_kv:mtp", KV_PAGES, backend_pages, page_bytes // 2, 32))
    return LedgerConfig(tuple(pools), host_bytes)


class CacheSim:
    def __init__(self, config: LedgerConfig, *, chunk: int = 256, cost: CostModel = CostModel(), check: bool = False):
        self.state = initial_state(config)
        self.cache = empty_cache()
        self.chunk = chunk
        self.cost = cost
        self.check = check

    # -- plumbing ----------------------------------------------------------------------------
    def apply(self, res) -> None:
        if isinstance(res, CacheResult):
            self.state = commit(self.state, res.plan)
            self.cache = res.cache
        elif isinstance(res, Plan):
            self.state = commit(self.state, res)
        else:
            raise TypeError(res)
        if self.check:
            check_cache(self.state, self.cache)

    def reclaim(self, pools: dict, protect=(), keep_content=()) -> bool:
        """Necessary execution meets a shortfall (RCL-8), State first (RD-8)."""
        done = False
        for pool in gap_order(pools):
            amount = pools[pool]
            if amount <= 0:
                continue
            q = quote(self.state, self.cache, Gap(pool, amount), Applicant(ApplicantKind.NECESSARY), protect,
                      keep_content)
            if not q.admitted:
                q = quote(self.state, self.cache, Gap(pool, amount),
                          Applicant(ApplicantKind.NECESSARY, revoke_waiters=True), protect, keep_content)
            if not q.admitted:
                continue
            self.apply(plan_reclaim(self.state, self.cache, q))
            self.drive_transaction()
            done = True
        return done

    def drive_transaction(self) -> None:
        steps = {"reserved": plan_submit, "submitted": plan_complete, "completed": plan_publish,
                 "cancelling": plan_complete}  # from whatever phase it is in (TXN-1)
        while self.state.transaction is not None:
            t = self.state.transaction
            self.apply(steps[t.phase](self.state, t.generation))

    def _retry(self, make, protect=(), keep_content=()):
        """RES-4, as the engine does it (ledger/driver.py)."""
        return driver.plan_with_reclaim(make, lambda pools: self.reclaim(pools, protect, keep_content))

    # -- one request --------------------------------------------------------------------------
    def bind(self, request, ident: InputIdentity, session=None):
        cands = query_sources(self.state, self.cache, SourceQuery(request, ident, session), self.cost)
        for cand in cands:
            if cand.missing:  # RCL-8: room for the copy never costs the source itself
                whole = self.cache.checkpoints[cand.cid].object_ids() if cand.cid in self.cache.checkpoints else ()
                t = self._retry(lambda: plan_bind_transfer(self.state, self.cache, request, cand),
                                protect=tuple(whole) or cand.missing)
                if isinstance(t, Refusal):
                    continue
                self.apply(t)
                self.drive_transaction()
                cand = next((c for c in query_sources(self.state, self.cache, SourceQuery(request, ident, session),
                                                      self.cost) if c.cid == cand.cid), None)
                if cand is None or cand.missing:
                    continue
            src = self.cache.checkpoints.get(cand.cid)
            protect = src.object_ids() if src is not None else ()
            keep = ()
            if src is not None and cand.takeover not in ("move", "snapshot"):  # BIND-5: a Fork may read
                protect, keep = src.object_ids()[1:], (src.state,)  # its state from Host
            got = self._retry(lambda: plan_bind(self.state, self.cache, BindRequest(request, cand, session)), protect,
                              keep)
            if isinstance(got, Refusal):
                continue
            self.apply(got)
            view = driver.bound_view(got)
            return cand, SequenceView(request, ident.prefix(cand.frontier), view.state_object, view.kv)
        raise CapacityError(f"{request!r}: no source can be bound, not even root (RES-6)")

    def grow(self, view: SequenceView, ident: InputIdentity, upto: int) -> SequenceView:
        """Compute [view.frontier, upto): allocate the pages that needs (necessary execution)."""
        kv = dict(view.kv)
        me = seq_holder(view.request)
        fresh: list = []  # pages this call took: given back if a later pool cannot grow (the view stays as it was)
        for pool in [p.pool_id for p in self.state.config.pools if p.kind == KV_PAGES]:  # every typed KV pool
            pages = list(kv.get(pool, ()))
            pt = self.state.pool(pool).spec.page_tokens
            need = -(-upto // pt) - len(pages)
            if need > 0:
                protect = tuple(o for ps in kv.values() for o in ps) + (view.state,)
                got = self._retry(lambda: plan_allocate(self.state, pool, need, me), protect)
                if isinstance(got, Refusal):
                    live = [o for o in fresh if o in self.state.objects]
                    if live:
                        self.apply(plan_drop_holders(self.state, live, me))
                    raise CapacityError(f"{view.request!r}: {got.detail} (RES-6)")
                self.apply(got)
                pages.extend(a[0] for a in got.proof.allocated)
                fresh.extend(a[0] for a in got.proof.allocated)
            kv[pool] = tuple(pages)
        return view._replace(identity=ident.prefix(upto), kv=tuple(sorted(kv.items())))

    def run(self, request, tokens: Sequence[int], saves: Sequence[driver.SavePoint] = (), output: Sequence[int] = (),
            session=None, cancel: bool = False) -> Outcome:
        ident = identity_of(tokens)
        cand, view = self.bind(request, ident, session)
        box = [view]
        try:
            return self._run_bound(request, tokens, ident, cand, box, saves, output, cancel)
        except CapacityError:  # RES-6: the request ends; what it holds is released
            self.apply(plan_publish_end(self.state, self.cache, box[0], cancel=True))
            raise

    def _run_bound(self, request, tokens, ident, cand, box, saves, output, cancel) -> Outcome:
        view = box[0]
        n = len(tokens)
        splits = sorted({s.frontier for s in saves})
        captures = skipped = 0
        pos = cand.frontier
        cands = [s.frontier for s in saves]
        while pos < n:
            nxt = driver.chunk_end(pos, n, splits, self.chunk)  # REC-8: split at frontiers
            view = box[0] = self.grow(view, ident, nxt)
            self.cache = observe_prefill(self.cache, request, ident, pos, nxt, cands)  # HEAT-2
            pos = nxt
            for s in saves:
                if s.frontier != pos:
                    continue
                got = plan_capture(self.state, self.cache, driver.capture_request(view, s))
                if isinstance(got, Refusal):
                    skipped += 1
                else:
                    self.apply(got)
                    did = driver.captured(got)
                    captures += did.kept
                    skipped += did.skipped
        if output:
            full = identity_of(tuple(tokens) + tuple(output))
            # E sits at execution_frontier: the last sampled token is committed but not yet input (CKP-2).
            view = box[0] = self.grow(view, full, n + len(output) - 1)
        self.apply(plan_publish_end(self.state, self.cache, view, cancel=cancel))
        return Outcome(request, n, cand.frontier, cand.takeover, n - cand.frontier, captures, skipped)

    def clear(self) -> None:
        self.apply(plan_clear(self.state, self.cache))
