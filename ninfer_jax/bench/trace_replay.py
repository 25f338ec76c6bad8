"""The trace replay loop: one engine driven through a trace, request by request.

`Replayer` steps a manually stepped engine (`Engine(start=False)`) and issues the trace's
requests as they become ready: the requests of one session in turn order, each after its
predecessor finished; different sessions concurrently, at most `concurrency` in flight, the
ready request with the earliest timestamp first (timestamps order requests; they are not
waited for). Chat-level sessions carry their history, extended by each reply
(`assistant_message`). Each request ends as an `Outcome` (its tokens, cached tokens, TTFT,
completion time and largest inter-token gap on the Program's clock), and the run as a
`RunResult` with the engine's counters and, for --report, pool occupancy samples.
"""
from __future__ import annotations

import dataclasses
import gc
import sys
import time
from typing import Sequence

from ninfer_jax.bench.trace_formats import Trace, TraceRequest, request_tokens

SAMPLE_EVERY, MAX_SAMPLES = 16, 2000  # occupancy samples (cycles apart; at most this many kept)
GC_YOUNG = 20_000  # the collector's young-generation threshold during a replay (`Replayer.run`)


# ---- assistant replies back into the history ------------------------------------------------------
def assistant_message(tokenizer, token_ids: Sequence[int]) -> dict:
    """The generated ids as the assistant message a client sends back next turn: reasoning,
    content and tool calls parsed from the text with special tokens kept (the template drops
    the reasoning later, Qwen3-style). Trailing stop tokens are not part of the message."""
    from ninfer_jax.frontend import FrontendError
    from ninfer_jax.frontend.output_parser import parse_assistant_output

    ids = list(token_ids)
    while ids and ids[-1] in tokenizer.eos_token_ids:
        ids.pop()
    text = tokenizer.decode(ids, skip_special_tokens=False)
    try:
        return parse_assistant_output(text).as_message()
    except FrontendError:
        return {"role": "assistant", "content": text}


# ---- the replay ---------------------------------------------------------------------------------
@dataclasses.dataclass
class Outcome:
    index: int
    session: str
    prompt_ids: tuple[int, ...] = ()
    output_ids: tuple[int, ...] = ()
    cached_tokens: int = 0
    ttft_s: float | None = None
    finish_reason: str = "error"
    error: str | None = None
    completion_s: float | None = None  # issue → finish (OBS-4)
    max_gap_s: float | None = None  # largest gap between consecutive output tokens (OBS-3); None below 2 tokens
    too_long_tokens: int | None = None  # --skip_too_long: the tokens it needs (finish_reason "too_long")
    save_frontiers: tuple[int, ...] = ()  # the prompt frontiers it offered the cache (Completion.save_frontiers)


@dataclasses.dataclass
class RunResult:
    outcomes: list[Outcome]  # in issue order
    stats: dict
    seconds: float
    clock: str  # "modelled" | "wall"
    trace: Trace | None = None  # the trace as replayed
    samples: list = dataclasses.field(default_factory=list)  # pool occupancy and pauses over the run


class _Flight:
    """One request in flight: its handle, issue time and first-token time on the run's clock."""

    def __init__(self, req: TraceRequest, handle, t_issue: float):
        self.req, self.handle, self.t_issue, self.ttft = req, handle, t_issue, None

    def started(self) -> bool:
        events = getattr(self.handle, "_events", None)  # a delta queued = the first token exists
        return self.handle.done() or (events is not None and not events.empty())


class Replayer:
    """Drives a manually stepped engine (`Engine(start=False)`) through a trace."""

    def __init__(self, engine, trace: Trace, *, concurrency: int, temperature: float = 0.0, seed: int = 0,
                 default_max_tokens: int = 32, progress: str | None = None, skip_too_long: bool = False,
                 max_context: int | None = None, occupancy: bool = True):
        """`skip_too_long`: a request that cannot fit `max_context` (token-level: prompt + output
        tokens beyond it; chat-level: a rendered prompt the frontend refuses as too long) is not
        replayed and ends as an Outcome with finish_reason "too_long"; its session goes on."""
        self.engine, self.trace, self.concurrency = engine, trace, max(1, concurrency)
        self.temperature, self.seed, self.default_max_tokens = temperature, seed, default_max_tokens
        self.progress = progress
        self.skip_too_long = skip_too_long
        # pool occupancy over time, for --report's plot: each sample reads every Host-resident
        # object, so a replay without a report takes none
        self.occupancy = occupancy
        config = getattr(engine, "config", None)
        self.max_context = max_context or getattr(config, "max_context", None)
        program = engine.program  # the Program's clock: modelled seconds on SimProgram, wall seconds otherwise
        self.clock = getattr(program, "clock", None) or time.perf_counter
        self.clock_kind = "modelled" if hasattr(program, "sim_seconds") else "wall"
        self.forced = {r.index: tuple(out) for r, out in zip(trace.requests, trace.output_tokens) if out}
        self.queues: dict[str, list[TraceRequest]] = {}
        for r in sorted(trace.requests, key=lambda r: (r.turn, r.ts, r.index)):
            self.queues.setdefault(r.session, []).append(r)
        self.history: dict[str, list[dict]] = {s: [] for s in self.queues}
        self.tools: dict[str, tuple | None] = {s: None for s in self.queues}
        self.busy: set[str] = set()

    # -- issuing
    def _sampling(self, req: TraceRequest):
        from ninfer_jax import SamplingParams

        # A recorded output is replayed as it was (forced), so the request ends where the trace's
        # did and the next turn, which extends it, finds that end (E) in the cache.
        forced = self.forced.get(req.index, ())
        return SamplingParams(temperature=self.temperature, seed=self.seed + req.index, ignore_eos=req.ignore_eos,
                              max_tokens=len(forced) if forced else req.max_tokens or self.default_max_tokens,
                              forced_output=forced)

    def _submit(self, req: TraceRequest):
        rid = f"trace-{req.index}"
        if req.prompt_ids is not None:
            saves = {k: v for k, v in (("anchors", req.anchors), ("markers", req.markers),
                                       ("recovery_point", req.recovery_point)) if v}
            return self.engine.submit(list(req.prompt_ids), self._sampling(req), request_id=rid, session=req.session,
                                      **saves)
        if req.tools is not None:
            self.tools[req.session] = req.tools
        hist = self.history[req.session]
        hist[:] = list(req.messages) if req.full_history else hist + list(req.messages)
        tools = self.tools[req.session]
        return self.engine.submit_chat(list(hist), tools=None if tools is None else list(tools), session=req.session,
                                       cache_markers=None if req.cache_markers is None else list(req.cache_markers),
                                       sampling=self._sampling(req), request_id=rid)

    def _too_long(self, req: TraceRequest) -> int | None:
        """The tokens a token-level request needs when they exceed max_context (with
        skip_too_long), else None."""
        if not self.skip_too_long or req.prompt_ids is None or self.max_context is None:
            return None
        need = request_tokens(req, self.forced.get(req.index, ()), self.default_max_tokens)
        return need if need > self.max_context else None

    def _ready(self) -> list[TraceRequest]:
        heads = [q[0] for s, q in self.queues.items() if q and s not in self.busy]
        return sorted(heads, key=lambda r: (r.ts, r.index))

    # -- finishing
    def _finish(self, flight: _Flight, outcomes: list[Outcome], seen_done_s: float) -> None:
        """`seen_done_s`: issue → the end of the cycle the tool saw it finish, the fallback for
        an engine whose Completion does not carry `completion_s`."""
        c = flight.handle.result()
        ttft = getattr(c, "ttft_s", None)
        if ttft is None:
            ttft = flight.ttft
        done = getattr(c, "completion_s", None)
        out = Outcome(flight.req.index, flight.req.session, tuple(c.prompt_token_ids), tuple(c.token_ids),
                      c.usage.cached_tokens, ttft, c.finish_reason, c.error,
                      completion_s=seen_done_s if done is None else done,
                      max_gap_s=getattr(c, "max_output_gap_s", None),
                      save_frontiers=tuple(getattr(c, "save_frontiers", ())))
        outcomes.append(out)
        self._after(flight.req, out)

    def _after(self, req: TraceRequest, out: Outcome) -> None:
        self.busy.discard(req.session)
        if req.prompt_ids is None:
            if req.reply is not None:
                self.history[req.session].append(req.reply)
            elif out.output_ids and self.engine.tokenizer is not None:
                self.history[req.session].append(assistant_message(self.engine.tokenizer, out.output_ids))

    def run(self) -> RunResult:
        # The collector, not the engine, was a third of a long replay's time: the start-up heap
        # (the trace: tens of millions of token ids; the engine) is frozen so full passes do not
        # rescan it (docs/ledger.md), and young passes run every GC_YOUNG net allocations instead
        # of 700 (the ledger's persistent maps allocate many small nodes per edit). The figures
        # do not depend on it; only the wall time does. Both are restored after the replay (a
        # heap someone else froze stays frozen).
        threshold, frozen = gc.get_threshold(), gc.get_freeze_count()
        gc.collect()
        gc.freeze()
        gc.set_threshold(GC_YOUNG, 10, 10)
        try:
            return self._run()
        finally:
            gc.set_threshold(*threshold)
            if not frozen:
                gc.unfreeze()

    def _run(self) -> RunResult:
        from ninfer_jax.engine.observe import occupancy
        from ninfer_jax.errors import NInferError
        from ninfer_jax.frontend import FrontendError
        from ninfer_jax.frontend.errors import InputTooLongError

        start = time.perf_counter()
        total = len(self.trace.requests)
        outcomes: list[Outcome] = []
        flights: list[_Flight] = []
        samples: list[dict] = []
        cycles = 0
        core = getattr(self.engine, "core", None)  # a stand-in engine (tests) reports no occupancy

        def sample():
            if core is None or not self.occupancy:
                return
            row = {"t": self.clock(), **occupancy(self.engine.program.state)}
            row.update({k: core.counters[k] for k in ("pauses_snapshot", "pauses_replay", "resumes_snapshot",
                                                      "resumes_replay")})
            samples.append(row)

        while len(outcomes) < total:
            room = self.concurrency - len(flights)
            for req in self._ready()[:room] if room > 0 else ():
                self.queues[req.session].pop(0)
                self.busy.add(req.session)
                t = self.clock()
                need = self._too_long(req)
                if need is not None:  # --skip_too_long: reported, not replayed; the session goes on
                    out = Outcome(req.index, req.session, finish_reason="too_long", too_long_tokens=need,
                                  error=f"needs {need} tokens, max_context is {self.max_context}")
                    outcomes.append(out)
                    self._after(req, out)
                    continue
                try:
                    flights.append(_Flight(req, self._submit(req), t))
                except InputTooLongError as e:
                    out = Outcome(req.index, req.session, error=f"{type(e).__name__}: {e}")
                    if self.skip_too_long:  # a rendered chat prompt beyond max_context - 1
                        out.finish_reason, out.too_long_tokens = "too_long", e.length
                    outcomes.append(out)
                    self._after(req, out)
                except (NInferError, FrontendError) as e:  # refused at the boundary: counted, the session goes on
                    out = Outcome(req.index, req.session, error=f"{type(e).__name__}: {e}")
                    outcomes.append(out)
                    self._after(req, out)
            if not flights:
                if any(self.queues.values()) and not self._ready():
                    raise RuntimeError("trace replay stalled: requests left but none can be issued")
                continue
            self.engine.step()
            cycles += 1
            if cycles % SAMPLE_EVERY == 0:
                sample()
            now = self.clock()
            for f in list(flights):
                if f.ttft is None and f.started():
                    f.ttft = now - f.t_issue
                if f.handle.done():
                    flights.remove(f)
                    self._finish(f, outcomes, now - f.t_issue)
                    if self.progress and len(outcomes) % 200 == 0:
                        done, spent = len(outcomes), time.perf_counter() - start
                        eta = spent / done * (total - done)
                        print(f"[trace] {self.progress}: {done}/{total} requests, {cycles / spent:,.0f} cycles/s, "
                              f"ETA {eta:,.0f} s", file=sys.stderr)
        self.engine.check_integrity()
        sample()
        return RunResult(outcomes, self.engine.stats(), time.perf_counter() - start, self.clock_kind, self.trace,
                         samples[::max(1, len(samples) // MAX_SAMPLES)])
