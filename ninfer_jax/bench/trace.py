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
import gc
import json
import random
import statistics
import sys
import time
from typing import Iterable, Sequence

FORMATS = ("chat", "marconi", "mooncake")
MOONCAKE_BLOCK = 512  # tokens per hash_id block in Mooncake / AIPerf traces
SAMPLE_EVERY, MAX_SAMPLES = 16, 2000  # occupancy samples (cycles apart; at most this many kept)
GC_YOUNG = 20_000  # the collector's young-generation threshold during a replay (`Replayer.run`)


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
    # whole-list checks at C speed (a long agent trace holds tens of millions of ids); a bool's
    # type is bool, so `true` is refused as before
    if not isinstance(value, list) or not set(map(type, value)) <= {int} or (value and min(value) < 0):
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


# ---- request sizes ------------------------------------------------------------------------------
def request_tokens(req: TraceRequest, forced: Sequence[int] = (), default_max_tokens: int = 32) -> int:
    """Tokens a token-level request needs in one context: its prompt and the output it is
    replayed with (the forced output, else its output length, else `default_max_tokens`)."""
    return len(req.prompt_ids or ()) + (len(forced) if forced else req.max_tokens or default_max_tokens)


def longest_request(trace: Trace, default_max_tokens: int = 32) -> tuple[int, int] | None:
    """(tokens, index) of the token-level trace's longest request; None for a chat-level trace,
    whose prompts are known only once rendered during the replay."""
    if trace.format == "chat":
        return None
    outs = trace.output_tokens or ((),) * len(trace.requests)
    return max((request_tokens(r, o, default_max_tokens), r.index) for r, o in zip(trace.requests, outs))


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


# ---- engines and the two runs ---------------------------------------------------------------------
def make_engine(config, program: str, share=None, cost: str | None = None, capacity=None):
    """A manually stepped engine on the real model or the cost-model Program. `share`: a real
    model Program whose loaded model and compiled steps the new engine reuses (loaded and
    compiled once for both runs); its pools, stores, ledger and cache are its own. `capacity`:
    the cost-model Program's pool sizes instead of the device solve (--cache_device_bytes)."""
    from ninfer_jax import Engine

    if program == "sim":
        from ninfer_jax.sim import SimProgram

        config = dataclasses.replace(config, progress=False)
        return Engine(config, program=SimProgram.for_model(config, cost, capacity=capacity), start=False)
    if capacity is not None:
        from ninfer_jax.errors import ConfigError

        raise ConfigError("cache_device_bytes", "sizes the cost-model Program's pools: it needs --program=sim")
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
                cost: str | None = None, capacity=None, **kw) -> tuple[RunResult, _Shared | None]:
    """One run on a fresh engine; returns its result and, on the real model, what the next run
    can reuse."""
    engine = make_engine(config, program, share, cost, capacity)
    try:
        check_vocab(trace, engine.program.vocab_size, config.model)
        result = Replayer(engine, trace, concurrency=kw.pop("concurrency", None) or config.max_concurrency,
                          progress=label, max_context=config.max_context, **kw).run()
        sim_cost = getattr(engine.program, "cost", None)
        if hasattr(sim_cost, "as_dict"):  # the cost-model Program: what it priced the run with
            result.stats["sim_cost"] = dict(sim_cost.as_dict(), source=engine.program.cost_source)
        result.stats["pools"] = pool_sizes(engine.program)
        return result, (_Shared(engine.program) if program == "model" else None)
    finally:
        engine.close()


def pool_sizes(program) -> dict:
    """Each Device pool's units, unit bytes and bytes as the ledger sees them, and the Host
    arena's bytes (on `sim` with the built-in model every unit is one byte)."""
    state = getattr(program, "state", None)
    if state is None:
        return {}
    out: dict = {}
    for pid, pool in state.pools.items():
        spec = pool.spec
        out[pid] = {"units": spec.capacity, "unit_bytes": spec.unit_bytes, "bytes": spec.capacity * spec.unit_bytes}
    out["host_arena_bytes"] = state.arena.capacity
    return out


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


def too_long(outcomes: Sequence[Outcome], trace: Trace | None) -> list[dict]:
    """The requests --skip_too_long left out: index, session, turn and the tokens each needs."""
    turns = {r.index: r.turn for r in trace.requests} if trace is not None else {}
    return [{"index": o.index, "session": o.session, "turn": turns.get(o.index), "tokens": o.too_long_tokens}
            for o in sorted(outcomes, key=lambda o: o.index) if o.finish_reason == "too_long"]


def figures(trace: Trace, hot: RunResult, cold: RunResult | None, *, program: str, cold_disabled: bool,
            max_context: int | None = None, budget=None) -> dict:
    """`budget`: the `ninfer_jax.plan.CacheSplit` the pools were sized by (--cache_device_bytes)."""
    ok = [o for o in hot.outcomes if o.prompt_ids]
    skipped = too_long(hot.outcomes, trace)
    prompt = sum(len(o.prompt_ids) for o in ok)
    cached = sum(o.cached_tokens for o in ok)
    bound = offline_upper_bound(hot.outcomes)
    s = hot.stats
    fig = {
        "program": program, "clock": hot.clock, "format": trace.format, "sessions": trace.sessions,
        "requests": len(trace.requests), "requests_failed": sum(o.finish_reason == "error" for o in hot.outcomes),
        "requests_too_long": len(skipped), "too_long_requests": skipped,
        **({"max_context": max_context} if max_context is not None else {}),
        **({"split": budget.split, "cache_budget": budget.as_dict()} if budget is not None else {}),
        **({"pools": s["pools"]} if s.get("pools") else {}),
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


# ---- one cache byte budget and its split (--cache_device_bytes, --split, --split_sweep) ------------
SWEEP_DECIDES = "cached_tokens"  # the figure that picks best_split (docs/trace.md)


def parse_split_sweep(value) -> tuple[float | None, ...]:
    """--split_sweep: comma-separated StateImage shares in (0, 1), or `default` for the default
    rule's; ConfigError naming the flag for anything else (empty, repeated, out of range)."""
    from ninfer_jax.errors import ConfigError
    from ninfer_jax.plan import check_split

    items = value.split(",") if isinstance(value, str) else list(value)
    out: list[float | None] = []
    for item in items:
        if isinstance(item, str):
            item = item.strip()
            if item == "default":
                item = None
            else:
                try:
                    item = float(item)
                except ValueError:
                    raise ConfigError("split_sweep", f"expected comma-separated shares in (0, 1) or 'default', got "
                                                     f"{value!r}") from None
        if item is not None:
            item = check_split(item, "split_sweep")
        if item in out:
            raise ConfigError("split_sweep", f"{'default' if item is None else item} appears twice in {value!r}")
        out.append(item)
    if not out:
        raise ConfigError("split_sweep", "give at least one share, e.g. --split_sweep=0.1,0.25,0.5")
    return tuple(out)


def check_cache_flags(program: str, config, *, cache_device_bytes: int | None = None, split: float | None = None,
                      split_sweep=None) -> tuple[float | None, ...] | None:
    """The cache byte budget flags, checked before anything is loaded or replayed: ConfigError
    naming the flag. Returns the sweep's shares (None: no sweep)."""
    from ninfer_jax.errors import ConfigError
    from ninfer_jax.plan import check_cache_device_bytes, check_split

    sweep = None
    if split is not None and cache_device_bytes is None:
        raise ConfigError("split", "is the StateImage share of --cache_device_bytes: give --cache_device_bytes=N too")
    if split_sweep is not None:
        if cache_device_bytes is None:
            raise ConfigError("split_sweep", "replays one --cache_device_bytes budget at several splits: give "
                                             "--cache_device_bytes=N too")
        if split is not None:
            raise ConfigError("split_sweep", "give --split or --split_sweep, not both")
        sweep = parse_split_sweep(split_sweep)
    if cache_device_bytes is None:
        return None
    check_cache_device_bytes(cache_device_bytes)
    if program != "sim":
        raise ConfigError("cache_device_bytes", "sizes the cost-model Program's pools: it needs --program=sim (the "
                                                "real Program solves its pools from the device's memory)")
    if split is not None:
        check_split(split)
    for name, value in (("kv_capacity", config.kv_capacity),
                        ("device_state_slots", config.context_cache.device_state_slots),
                        ("device_memory_bytes", config.device_memory_bytes)):
        if value is not None:
            raise ConfigError(name, "is decided by --cache_device_bytes and its split (the device solve is "
                                    f"bypassed): leave --{name} unset")
    return sweep


def cache_budgets(trace: Trace, config, *, cache_device_bytes: int, split: float | None = None,
                  split_sweep=None, skip_too_long: bool = False, max_context: int | None = None,
                  default_max_tokens: int = 32) -> list:
    """The `ninfer_jax.plan.CacheSplit` of each split to replay (one without a sweep), sized on
    the cost-model Program's geometry; max_context from `max_context` or the trace's longest
    request (plan.split_cache_bytes). ConfigError naming the flag when one cannot be split."""
    from ninfer_jax.plan import split_cache_bytes
    from ninfer_jax.sim import SimProgram

    sweep = parse_split_sweep(split_sweep) if split_sweep is not None else None
    model, itemsize = SimProgram.geometry(config)
    longest = longest_request(trace, default_max_tokens)
    source = "--split_sweep" if sweep else None
    return [split_cache_bytes(model, itemsize, cache_device_bytes, config.max_concurrency, split=s,
                              split_source=source if s is not None else "default rule", max_context=max_context,
                              longest_request=longest[0] if longest else None,
                              fallback_max_context=config.max_context, skip_too_long=skip_too_long)
            for s in (sweep or (split,))]


def _host_bytes(config) -> int:
    """The Host arena the device solve would give (CFG-5): the flag, or the default for the geometry."""
    from ledger import capacity as cap
    from ninfer_jax.sim import SimProgram

    host = config.context_cache.host_capacity_bytes
    if host is None:
        model, itemsize = SimProgram.geometry(config)
        host = cap.default_host_capacity_bytes(model.state_image_bytes(itemsize))
    return host


def best_of_sweep(results: Sequence[dict]) -> dict:
    """The split with the most prompt tokens served from the cache; ties: fewer requests too
    long, then the lower mean TTFT, then the smaller split."""
    def key(f):
        ttft = f.get("ttft_mean_s")
        return (f[SWEEP_DECIDES], -f.get("requests_too_long", 0), -(ttft if ttft is not None else float("inf")),
                -f["split"])

    return max(results, key=key)


def sweep_figures(results: Sequence[dict], cache_device_bytes: int) -> dict:
    best = best_of_sweep(results)
    first = results[0]
    common = {k: first[k] for k in ("program", "clock", "format", "sessions", "requests") if k in first}
    return dict(common, cache_device_bytes=cache_device_bytes, sweep=list(results), best_split=best["split"],
                best_by=SWEEP_DECIDES)


SWEEP_COLUMNS = ("split", "state_slots", "kv_pages", "max_context", "requests_too_long", "cached_tokens", "reuse_pct",
                 "reuse_of_upper_bound_pct", "ttft_mean_s", "ttft_mean_cached_over_cold", "h2d_bytes", "pauses")


def sweep_rows(sweep: dict) -> list[dict]:
    """One row per split of the sweep's headline figures (SWEEP_COLUMNS)."""
    rows = []
    for f in sweep["sweep"]:
        b = f.get("cache_budget", {})
        row = dict(f, state_slots=b.get("state_slots"), kv_pages=b.get("kv_pages"))
        rows.append({k: row.get(k) for k in SWEEP_COLUMNS})
    return rows


def sweep_text(sweep: dict) -> str:
    """The sweep as an aligned table and the best split (`ninfer trace --split_sweep` without --json)."""
    rows = sweep_rows(sweep)

    def cell(v):
        return "-" if v is None else f"{v:.4g}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else str(v)

    table = [list(SWEEP_COLUMNS)] + [[cell(r[k]) for k in SWEEP_COLUMNS] for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(SWEEP_COLUMNS))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in table]
    lines.append(f"best_split {sweep['best_split']:.4g} (by {sweep['best_by']}) of cache_device_bytes "
                 f"{sweep['cache_device_bytes']:,}; --json gives every figure of every split")
    return "\n".join(lines)


def run_trace(path, config, *, program: str = "model", fmt: str = "auto", cold: bool = True,
              limit: int | None = None, report: str | None = None, cache_device_bytes: int | None = None,
              split: float | None = None, split_sweep=None, skip_too_long: bool = False,
              max_context: int | None = None, name: str | None = None, **kw) -> dict:
    """Load (`path`: a file, or a parsed Trace), replay cached (and cold), and return the
    figures; `report`: a folder for the figures as JSON, PNG plots and a summary
    (bench/trace_report.py).

    `cache_device_bytes` (sim only): the pools get these bytes instead of the device solve,
    StateImage share `split` (None: the default rule), `max_context` (None: the trace's longest
    request, raised for CFG-6); `split_sweep`: replay at each of these shares and return
    `{"sweep": [...], "best_split": ...}`. `skip_too_long`: requests that cannot fit
    max_context are reported (`requests_too_long`) instead of replayed."""
    sweep = check_cache_flags(program, config, cache_device_bytes=cache_device_bytes, split=split,
                              split_sweep=split_sweep)
    trace = path if isinstance(path, Trace) else load_trace(path, fmt)
    name = name or (path if isinstance(path, str) else "trace")
    if limit:
        trace = dataclasses.replace(trace, requests=trace.requests[:limit], output_tokens=trace.output_tokens[:limit])
    budgets = [None]
    if cache_device_bytes is not None:
        budgets = cache_budgets(trace, config, cache_device_bytes=cache_device_bytes, split=split, split_sweep=sweep,
                                skip_too_long=skip_too_long, max_context=max_context,
                                default_max_tokens=kw.get("default_max_tokens", 32))
    print(f"[trace] {name}: {trace.format}, {trace.sessions} sessions, {len(trace.requests)} requests, "
          f"program={program}", file=sys.stderr)
    results = []
    for budget in budgets:
        prefix = f"split {budget.split:.4g}: " if sweep else ""
        if budget is not None:
            print(f"[trace] {prefix or 'cache: '}{budget.text()}", file=sys.stderr)
        folder = report
        if report and sweep:
            import os

            folder = os.path.join(report, f"split_{budget.split:.4g}")
        results.append(_run_budget(trace, config, budget, program=program, cold=cold, prefix=prefix,
                                   report=folder, skip_too_long=skip_too_long, **kw))
    if not sweep:
        return results[0]
    out = sweep_figures(results, cache_device_bytes)
    if report:
        from ninfer_jax.bench.trace_report import write_sweep_report

        written = write_sweep_report(report, out)
        print(f"[trace] sweep report: {len(written)} files in {report} (summary.md)", file=sys.stderr)
    return out


def _warn_failed(run: RunResult, prefix: str) -> None:
    """Failed requests are counted in the figures (`requests_failed`); say so on stderr too, with
    the first error, since a replay whose requests mostly fail answers nothing."""
    failed = [o for o in run.outcomes if o.finish_reason == "error"]
    if failed:
        print(f"[trace] {prefix}{len(failed):,} of {len(run.outcomes):,} requests failed; the first "
              f"(request {failed[0].index}): {failed[0].error} (--cache_device_bytes, --max_context or "
              f"--skip_too_long size the replay for the trace)", file=sys.stderr)


def _run_budget(trace: Trace, config, budget, *, program: str, cold: bool, prefix: str, report: str | None,
                skip_too_long: bool, **kw) -> dict:
    """The cached (and cold) run at one pool sizing (`budget`: a CacheSplit, or None for the
    device solve) and its figures; the report written when asked."""
    extra = dict(kw, skip_too_long=skip_too_long, occupancy=bool(report))
    if budget is not None:
        config = dataclasses.replace(config, max_context=budget.max_context)
        extra["capacity"] = budget.capacity(_host_bytes(config))
    hot, shared = replay_once(config, program, trace, f"{prefix}cached run", **dict(extra))
    cold_run, disabled = None, False
    if cold:
        cfg = cold_config(config)
        disabled = cfg is not None
        if cfg is None:
            print("[trace] this build cannot disable the cache: the cold run uses the same config", file=sys.stderr)
        # The cold run: a fresh Program (empty pools, cache off) on the model and compiled steps
        # the cached run loaded, so the model is loaded and compiled once.
        cold_run, _ = replay_once(cfg or config, program, trace, f"{prefix}cold run", share=shared, **dict(extra))
    out = figures(hot.trace, hot, cold_run, program=program, cold_disabled=disabled, max_context=config.max_context,
                  budget=budget)
    _warn_failed(hot, prefix)
    if report:
        from ninfer_jax.bench.trace_report import write_report

        written = write_report(report, out, hot, cold_run)
        print(f"[trace] report: {len(written)} files in {report} (summary.md)", file=sys.stderr)
    return out
