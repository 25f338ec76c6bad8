"""`ninfer trace`: replay a multi-turn trace through the engine and report context reuse.

    ninfer trace FILE [--program=model|sim] [--trace_format=auto|chat|marconi] [--json] ...

The trace runs twice on fresh engines with the same settings: once with the context cache on,
once with it off (`ContextCacheConfig(enabled=False)`: the cold baseline). The cold engine's
Program is fresh (empty pools, stores and ledger) but shares the model loaded and the steps
compiled for the first run, so the model is loaded and compiled once. The figures
(docs/trace.md): prompt tokens served from the cache against the offline upper bound
(`cache_replay.upper_bound` over the prompts and outputs this run produced), prefill and replay
tokens, H2D/D2H bytes, cache hits, and per-request latency cached vs cold (OBS-4): time to first
token, completion time and the largest inter-token gap, on the Program's clock (modelled seconds
on the cost-model Program, wall seconds on the real model). Outputs of
the two runs are compared token for token: reuse must never change a token (doctrine 1).

Scheduling: the requests of one session are issued in turn order, each after its predecessor
finished; different sessions run concurrently, at most `concurrency` requests in flight, the
ready request with the earliest timestamp first. Timestamps order requests; they are not waited
for.
"""
from __future__ import annotations

import dataclasses
import json
import random
import statistics
import sys
import time
from typing import Iterable, Sequence

FORMATS = ("chat", "marconi", "mooncake")
MOONCAKE_BLOCK = 512  # tokens per hash_id block in Mooncake / AIPerf traces
SAMPLE_EVERY, MAX_SAMPLES = 16, 2000  # occupancy samples (cycles apart; at most this many kept)


class TraceError(ValueError):
    """A malformed trace: names the file, the line and what is wrong with it."""


# ---- the two input formats -------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class TraceRequest:
    index: int  # line order
    session: str
    turn: int
    ts: float
    max_tokens: int | None  # None: the command's --max_tokens
    prompt_ids: tuple[int, ...] | None = None  # token-level (Marconi)
    messages: tuple[dict, ...] = ()  # chat-level: messages this request adds to the history
    tools: tuple[dict, ...] | None = None  # chat-level: the session's tools from here on
    cache_markers: tuple | None = None
    reply: dict | None = None  # chat-level: the assistant message appended after the request
    full_history: bool = False  # chat-level: `messages` is the whole conversation
    ignore_eos: bool = False  # token-level: generate exactly num_output_tokens
    # token-level: explicit save points (Engine.submit's recovery_point, anchors, markers)
    recovery_point: int | None = None
    anchors: tuple[int, ...] = ()
    markers: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class Trace:
    format: str
    requests: tuple[TraceRequest, ...]
    output_tokens: tuple[tuple[int, ...], ...] = ()  # token-level: the trace's recorded outputs

    @property
    def sessions(self) -> int:
        return len({r.session for r in self.requests})


def _need(obj: dict, key: str, kinds: tuple, where: str, optional: bool = False):
    """obj[key] checked against `kinds` (a bool is not an int here); None when optional and absent."""
    value = obj.get(key)
    if value is None:
        if optional:
            return None
        raise TraceError(f"{where}: missing {key!r}")
    if not isinstance(value, kinds) or isinstance(value, bool):
        raise TraceError(f"{where}: {key!r} has the wrong type ({type(value).__name__})")
    return value


def _ids(value, key: str, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or any(not isinstance(t, int) or isinstance(t, bool) or t < 0 for t in value):
        raise TraceError(f"{where}: {key!r} must be a list of non-negative integer token ids")
    return tuple(value)


def _chat_request(obj: dict, where: str, index: int) -> TraceRequest:
    messages = _need(obj, "messages", (list,), where)
    if not messages or any(not isinstance(m, dict) or "role" not in m for m in messages):
        raise TraceError(f"{where}: 'messages' must be a non-empty list of messages with a 'role'")
    tools = _need(obj, "tools", (list,), where, optional=True)
    markers = _need(obj, "cache_markers", (list,), where, optional=True)
    reply = obj.get("reply")
    if isinstance(reply, str):
        reply = {"role": "assistant", "content": reply}
    if reply is not None and (not isinstance(reply, dict) or reply.get("role", "assistant") != "assistant"):
        raise TraceError(f"{where}: 'reply' must be an assistant message or a string")
    max_tokens = _need(obj, "max_tokens", (int,), where, optional=True)
    if max_tokens is not None and max_tokens < 1:
        raise TraceError(f"{where}: 'max_tokens' must be positive")
    session = obj.get("session")
    turn = _need(obj, "turn", (int,), where, optional=True)
    ts = _need(obj, "ts", (int, float), where, optional=True)
    return TraceRequest(
        index=index, session=f"line-{index}" if session is None else str(session),
        turn=index if turn is None else turn, ts=float(index if ts is None else ts), max_tokens=max_tokens,
        messages=tuple(messages), tools=None if tools is None else tuple(tools),
        cache_markers=None if markers is None else tuple(markers),
        reply=None if reply is None else dict(reply, role="assistant"), full_history=bool(obj.get("full_history")))


def _marconi_request(obj: dict, where: str, index: int) -> tuple[TraceRequest, tuple[int, ...]]:
    session = _need(obj, "session_id", (int, str), where)
    turn = _need(obj, "turn_id", (int,), where)
    ts = _need(obj, "ts", (int, float), where)
    prompt = _ids(_need(obj, "input_tokens", (list,), where), "input_tokens", where)
    output = _ids(obj.get("output_tokens") or [], "output_tokens", where)
    if not prompt:
        raise TraceError(f"{where}: 'input_tokens' is empty")
    n_in = _need(obj, "num_input_tokens", (int,), where, optional=True)
    if n_in is not None and n_in != len(prompt):
        raise TraceError(f"{where}: num_input_tokens={n_in} but input_tokens holds {len(prompt)} ids")
    n_out = _need(obj, "num_output_tokens", (int,), where, optional=True)
    if n_out is None:
        n_out = len(output)
    if n_out < 0 or output and n_out != len(output):
        raise TraceError(f"{where}: num_output_tokens={n_out} but output_tokens holds {len(output)} ids")
    saves = _save_points(obj, where, len(prompt))
    req = TraceRequest(index=index, session=str(session), turn=turn, ts=float(ts), max_tokens=max(1, n_out),
                       prompt_ids=prompt, ignore_eos=True, **saves)
    return req, output


def _save_points(obj: dict, where: str, n: int) -> dict:
    """Optional `recovery_point` (int), `anchors` and `markers` (lists of at most 4 ints): token
    frontiers in [1, n] where the client knows its chat structure lies."""
    out: dict = {}
    rp = _need(obj, "recovery_point", (int,), where, optional=True)
    if rp is not None:
        if not 1 <= rp <= n:
            raise TraceError(f"{where}: 'recovery_point' {rp} outside [1, {n}]")
        out["recovery_point"] = rp
    for key in ("anchors", "markers"):
        values = _need(obj, key, (list,), where, optional=True)
        if values is None:
            continue
        if len(values) > 4 or any(not isinstance(f, int) or isinstance(f, bool) or not 1 <= f <= n for f in values):
            raise TraceError(f"{where}: {key!r} must be at most 4 token frontiers in [1, {n}]")
        out[key] = tuple(values)
    return out


def mooncake_block(hash_id: int, size: int = MOONCAKE_BLOCK) -> tuple[int, ...]:
    """The token ids standing for one hash block: a pure function of the hash id, in [1, 1000)
    (inside every vocabulary the tool replays on), so equal hash ids give equal blocks and
    different ones practically never share a prefix."""
    rng = random.Random(hash_id * 2654435761 + 97)
    return tuple(rng.randrange(1, 1000) for _ in range(size))


def _mooncake_request(obj: dict, where: str, index: int, block: int) -> TraceRequest:
    ts = _need(obj, "timestamp", (int, float), where)
    n_in = _need(obj, "input_length", (int,), where)
    n_out = _need(obj, "output_length", (int,), where)
    hashes = _ids(_need(obj, "hash_ids", (list,), where), "hash_ids", where)
    if n_in < 1:
        raise TraceError(f"{where}: 'input_length' must be positive")
    if n_out < 0:
        raise TraceError(f"{where}: 'output_length' must be non-negative")
    if len(hashes) != -(-n_in // block):
        raise TraceError(f"{where}: input_length={n_in} needs {-(-n_in // block)} hash_ids of {block} tokens, "
                         f"got {len(hashes)}")
    prompt = tuple(t for h in hashes for t in mooncake_block(h, block))[:n_in]
    session = obj.get("session_id")
    if session is not None and not isinstance(session, (int, str)):
        raise TraceError(f"{where}: 'session_id' must be an int or a string")
    # Without sessions every request is its own conversation, issued at its timestamp.
    return TraceRequest(index=index, session=str(session) if session is not None else f"r{index}",
                        turn=index if session is not None else 0, ts=float(ts) / 1000.0, max_tokens=max(1, n_out),
                        prompt_ids=prompt, ignore_eos=True)


def parse_lines(lines: Iterable[str], fmt: str = "auto", name: str = "trace") -> Trace:
    """Parse JSONL lines (blank lines skipped). `fmt` auto picks by the first request's keys."""
    if fmt not in ("auto",) + FORMATS:
        raise TraceError(f"unknown trace format {fmt!r}; choose auto, chat, marconi or mooncake")
    requests, outputs = [], []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{name}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise TraceError(f"{where}: not valid JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise TraceError(f"{where}: a line must be a JSON object")
        if fmt == "auto":
            fmt = ("marconi" if "input_tokens" in obj else "chat" if "messages" in obj
                   else "mooncake" if "hash_ids" in obj else fmt)
            if fmt == "auto":
                raise TraceError(f"{where}: neither a chat request ('messages'), a Marconi request "
                                 f"('input_tokens') nor a Mooncake request ('hash_ids')")
        if fmt == "chat":
            requests.append(_chat_request(obj, where, len(requests)))
        elif fmt == "mooncake":
            requests.append(_mooncake_request(obj, where, len(requests), MOONCAKE_BLOCK))
            outputs.append(())
        else:
            req, out = _marconi_request(obj, where, len(requests))
            requests.append(req)
            outputs.append(out)
    if not requests:
        raise TraceError(f"{name}: no requests")
    _check_turns(requests, name)
    return Trace(fmt, tuple(requests), output_tokens=tuple(outputs))


def _check_turns(requests: Sequence[TraceRequest], name: str) -> None:
    seen: dict[str, set] = {}
    for r in requests:
        turns = seen.setdefault(r.session, set())
        if r.turn in turns:
            raise TraceError(f"{name}: session {r.session!r} has turn {r.turn} twice")
        turns.add(r.turn)


def load_trace(path: str, fmt: str = "auto") -> Trace:
    try:
        with open(path, encoding="utf-8") as f:
            return parse_lines(f, fmt, name=path)
    except OSError as e:
        raise TraceError(f"{path}: {e.strerror}") from None


def check_vocab(trace: Trace, vocab_size: int, model: str = "the model") -> None:
    """A token-level trace must lie inside the vocabulary it is replayed on: ids are never
    folded (folding invents shared prefixes). TraceError naming the first request beyond it."""
    if trace.format not in ("marconi", "mooncake"):
        return
    for r, out in zip(trace.requests, trace.output_tokens or ((),) * len(trace.requests)):
        top = max(r.prompt_ids + tuple(out))
        if top >= vocab_size:
            raise TraceError(f"request {r.index} (session {r.session!r}, turn {r.turn}) has token id {top}, beyond "
                             f"the vocabulary of {model} ({vocab_size}): replay it on a model whose vocabulary "
                             f"covers the trace (`--program=sim --model=FOLDER` needs only a config.json)")


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
                 default_max_tokens: int = 32, progress: str | None = None):
        self.engine, self.trace, self.concurrency = engine, trace, max(1, concurrency)
        self.temperature, self.seed, self.default_max_tokens = temperature, seed, default_max_tokens
        self.progress = progress
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
                      max_gap_s=getattr(c, "max_output_gap_s", None))
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
        from ninfer_jax.errors import NInferError
        from ninfer_jax.frontend import FrontendError

        from ninfer_jax.engine.observe import occupancy

        start = time.perf_counter()
        total = len(self.trace.requests)
        outcomes: list[Outcome] = []
        flights: list[_Flight] = []
        samples: list[dict] = []
        cycles = 0
        core = getattr(self.engine, "core", None)  # a stand-in engine (tests) reports no occupancy

        def sample():
            if core is None:
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
                try:
                    flights.append(_Flight(req, self._submit(req), t))
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


# ---- engines and the two runs ---------------------------------------------------------------------
def make_engine(config, program: str, share=None, cost: str | None = None):
    """A manually stepped engine on the real model or the cost-model Program. `share`: a real
    model Program whose loaded model and compiled steps the new engine reuses (loaded and
    compiled once for both runs); its pools, stores, ledger and cache are its own."""
    from ninfer_jax import Engine

    if program == "sim":
        from ninfer_jax.sim import SimProgram

        config = dataclasses.replace(config, progress=False)
        return Engine(config, program=SimProgram.for_model(config, cost), start=False)
    if cost is not None:
        from ninfer_jax.errors import ConfigError

        raise ConfigError("cost", "sets the cost-model Program's costs: it needs --program=sim")
    if program != "model":
        raise ValueError(f"--program must be 'model' or 'sim', got {program!r}")
    if share is None:
        return Engine(config, start=False)
    from ninfer_jax.program.program import Program

    return Engine(config, program=Program(config, model=share.model, steps=share.steps), start=False)


def cold_config(config):
    """The same config with the context cache off, or None where this build cannot turn it off."""
    try:
        return dataclasses.replace(config, context_cache=dataclasses.replace(config.context_cache, enabled=False))
    except TypeError:
        return None


class _Shared:
    """What a later run may reuse of an earlier one's Program: the model and its compiled steps
    (not the Program itself, whose pools are freed with it)."""

    def __init__(self, program):
        self.model, self.steps = program.model, program.steps


def replay_once(config, program: str, trace: Trace, label: str, share: _Shared | None = None,
                cost: str | None = None, **kw) -> tuple[RunResult, _Shared | None]:
    """One run on a fresh engine; returns its result and, on the real model, what the next run
    can reuse."""
    engine = make_engine(config, program, share, cost)
    try:
        check_vocab(trace, engine.program.vocab_size, config.model)
        result = Replayer(engine, trace, concurrency=kw.pop("concurrency", None) or config.max_concurrency,
                          progress=label, **kw).run()
        sim_cost = getattr(engine.program, "cost", None)
        if hasattr(sim_cost, "as_dict"):  # the cost-model Program: what it priced the run with
            result.stats["sim_cost"] = dict(sim_cost.as_dict(), source=engine.program.cost_source)
        return result, (_Shared(engine.program) if program == "model" else None)
    finally:
        engine.close()


# ---- figures ------------------------------------------------------------------------------------
def offline_upper_bound(outcomes: Sequence[Outcome], within_sessions: bool = False) -> int:
    """Prompt tokens reusable with unlimited capacity: for each request the longest prefix any
    earlier-issued request's prompt and output share (the ledger replay harness's bound);
    `within_sessions` counts only earlier requests of the same session."""
    from ninfer_jax.bench.cache_replay import upper_bound

    groups: dict[str, list[dict]] = {}
    for o in outcomes:
        if o.prompt_ids:
            groups.setdefault(o.session if within_sessions else "", []).append(
                {"tokens": o.prompt_ids, "output": o.output_ids})
    return sum(sum(upper_bound(reqs)) for reqs in groups.values())


def _pct(a: float, b: float) -> float:
    return round(100.0 * a / b, 1) if b else 0.0


def percentile(xs: Sequence[float], q: float) -> float:
    """Nearest rank over sorted `xs` (q in [0, 1]): a value some request really had."""
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _ttft(outcomes: Sequence[Outcome], prefix: str) -> dict:
    xs = sorted(o.ttft_s for o in outcomes if o.ttft_s is not None)
    if not xs:
        return {f"{prefix}ttft_mean_s": None, f"{prefix}ttft_p50_s": None, f"{prefix}ttft_p99_s": None}
    return {f"{prefix}ttft_mean_s": statistics.fmean(xs), f"{prefix}ttft_p50_s": percentile(xs, 0.5),
            f"{prefix}ttft_p99_s": percentile(xs, 0.99)}


def _latency(outcomes: Sequence[Outcome], prefix: str) -> dict:
    """OBS-4 beside TTFT: completion time and the largest inter-token gap, p50 and p99 over the
    requests that have one (OBS-3: a low TTFT can hide a long gap after a pause)."""
    fig = {}
    for name, attr in (("completion", "completion_s"), ("max_gap", "max_gap_s")):
        xs = sorted(getattr(o, attr) for o in outcomes if getattr(o, attr) is not None)
        fig[f"{prefix}{name}_p50_s"] = percentile(xs, 0.5) if xs else None
        fig[f"{prefix}{name}_p99_s"] = percentile(xs, 0.99) if xs else None
    return fig


def _ratio(a, b):
    return round(a / b, 3) if a is not None and b else None


def figures(trace: Trace, hot: RunResult, cold: RunResult | None, *, program: str, cold_disabled: bool) -> dict:
    ok = [o for o in hot.outcomes if o.prompt_ids]
    prompt = sum(len(o.prompt_ids) for o in ok)
    cached = sum(o.cached_tokens for o in ok)
    bound = offline_upper_bound(hot.outcomes)
    s = hot.stats
    fig = {
        "program": program, "clock": hot.clock, "format": trace.format, "sessions": trace.sessions,
        "requests": len(trace.requests), "requests_failed": sum(o.finish_reason == "error" for o in hot.outcomes),
        "forced_outputs": sum(1 for o in trace.output_tokens if o),
        "branch_points": s.get("branch_points", 0),
        "cycles": s.get("cycles", 0),
        "cycles_per_s": round(s.get("cycles", 0) / hot.seconds, 1) if hot.seconds else None,
        **({"sim_cost": s["sim_cost"]} if "sim_cost" in s else {}),
        "prompt_tokens": prompt, "cached_tokens": cached, "reuse_pct": _pct(cached, prompt),
        "upper_bound_tokens": bound, "upper_bound_pct": _pct(bound, prompt),
        "upper_bound_within_sessions_tokens": offline_upper_bound(hot.outcomes, within_sessions=True),
        "reuse_of_upper_bound_pct": _pct(cached, bound),
        "prefill_tokens": s.get("prefill_tokens", 0), "replay_tokens": s.get("replay_tokens", 0),
        "reused_tokens": s.get("reused_tokens", 0), "cache_hits": s.get("cache_hits", 0),
        "h2d_bytes": s.get("h2d_bytes", 0), "d2h_bytes": s.get("d2h_bytes", 0),
        "generated_tokens": s.get("generated_tokens", 0), "compilations": s.get("compilations", 0),
        "mean_decode_rows": _ratio(s.get("generated_tokens", 0), s.get("decode_steps", 0)),
        "pauses": s.get("pauses_replay", 0) + s.get("pauses_snapshot", 0),
    }
    fig.update(_ttft(hot.outcomes, ""))
    fig.update(_latency(hot.outcomes, ""))
    fig["seconds_cached_run"] = round(hot.seconds, 2)
    if cold is not None:
        fig["cold_cache_disabled"] = cold_disabled
        fig["cold_prefill_tokens"] = cold.stats.get("prefill_tokens", 0)
        fig["cold_replay_tokens"] = cold.stats.get("replay_tokens", 0)
        fig["cold_mean_decode_rows"] = _ratio(cold.stats.get("generated_tokens", 0), cold.stats.get("decode_steps", 0))
        fig.update(_ttft(cold.outcomes, "cold_"))
        fig.update(_latency(cold.outcomes, "cold_"))
        fig["ttft_mean_cached_over_cold"] = _ratio(fig["ttft_mean_s"], fig["cold_ttft_mean_s"])
        fig["ttft_p50_cached_over_cold"] = _ratio(fig["ttft_p50_s"], fig["cold_ttft_p50_s"])
        fig["prefill_cached_over_cold"] = _ratio(fig["prefill_tokens"], fig["cold_prefill_tokens"])
        fig["outputs_differing"] = outputs_differing(hot, cold)
        fig["outputs_identical"] = fig["outputs_differing"] == 0
        fig["seconds_cold_run"] = round(cold.seconds, 2)
    return fig


def outputs_differing(a: RunResult, b: RunResult) -> int:
    """Doctrine 1 over the whole trace: how many requests did not produce the same prompt and
    output tokens in both runs (0: reuse changed nothing)."""
    xa = {o.index: (o.prompt_ids, o.output_ids) for o in a.outcomes}
    xb = {o.index: (o.prompt_ids, o.output_ids) for o in b.outcomes}
    return sum(xa.get(i) != xb.get(i) for i in set(xa) | set(xb))


def run_trace(path: str, config, *, program: str = "model", fmt: str = "auto", cold: bool = True,
              limit: int | None = None, report: str | None = None, **kw) -> dict:
    """Load, replay cached (and cold), and return the figures; `report`: a folder for the
    figures as JSON, PNG plots and a summary (bench/trace_report.py)."""
    trace = load_trace(path, fmt)
    if limit:
        trace = dataclasses.replace(trace, requests=trace.requests[:limit], output_tokens=trace.output_tokens[:limit])
    print(f"[trace] {path}: {trace.format}, {trace.sessions} sessions, {len(trace.requests)} requests, "
          f"program={program}", file=sys.stderr)
    hot, shared = replay_once(config, program, trace, "cached run", **dict(kw))
    cold_run, disabled = None, False
    if cold:
        cfg = cold_config(config)
        disabled = cfg is not None
        if cfg is None:
            print("[trace] this build cannot disable the cache: the cold run uses the same config", file=sys.stderr)
        # The cold run: a fresh Program (empty pools, cache off) on the model and compiled steps
        # the cached run loaded, so the model is loaded and compiled once.
        cold_run, _ = replay_once(cfg or config, program, trace, "cold run", share=shared, **dict(kw))
    out = figures(hot.trace, hot, cold_run, program=program, cold_disabled=disabled)
    if report:
        from ninfer_jax.bench.trace_report import write_report

        written = write_report(report, out, hot, cold_run)
        print(f"[trace] report: {len(written)} files in {report} (summary.md)", file=sys.stderr)
    return out
