"""A randomized pressure soak for the engine (doctrine 1 and 2 under load).

One *run* drives a manually stepped engine at capacities near their lower bounds with a
workload drawn from an int seed: multi-turn chat sessions (tool calls and tool results,
reasoning, retries, edited history, shared system prompts and cache markers), raw token
prompts that share prefixes (anchors, markers, continuations of a finished output), greedy and
seeded sampling, stop strings, and cancels aimed at every phase (queued, prefilling, decoding,
paused, resuming). After every cycle the engine's integrity holds; every request that finishes
("stop" / "length") equals, token for token and in text, the same request run alone on a cold
engine (cache off); a cancelled one produced a prefix of it; nothing ends in "error"; when all
ended and the cache is cleared nothing is held.

Every run records its concrete schedule (which request at which cycle, which cancel when), so
a failure can be replayed without the generator and shrunk to a minimal schedule:

    python tests/engine/soak.py --config "route=snapshot,C=3,ctx=256,chunk=16,kv=+1,slots=1,host=8" --seed 0
    python tests/engine/soak.py --config ... --seed 0 --shrink      # minimal schedule, as JSON
    python tests/engine/soak.py --replay /tmp/soak-....json          # replay a saved schedule

Pytest entry points: tests/engine/test_engine_soak.py (a short seeded CI run; `--budget=SECONDS`
for long runs).
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import copy
import dataclasses
import json
import math
import os
import random
import signal
import sys
import tempfile
import threading
import time
import traceback
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

PAGE = 64
PHASES = ("queued", "prefill", "decode", "paused", "resuming")  # cancel targets
STEP_ALARM_S = 120  # one engine.step() longer than this is a hang


# ---- configurations -------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class SoakConfig:
    """Capacities near their lower bounds (CFG-6: Main KV pages >= max(ceil(max_context/64), C))."""

    route: str = "auto"  # EngineConfig.pause_route
    c: int = 2  # max_concurrency
    ctx: int = 256  # max_context
    chunk: int = 32  # chunk_size
    kv: int = 1  # Main KV pages above the CFG-6 minimum
    slots: int = 1  # device_state_slots beyond the C basic ones
    host: int = 0  # Host arena, in StateImages' worth
    mtp: int = 0  # EngineConfig.speculative_tokens (MTP drafts per Verify unit)

    @property
    def min_pages(self) -> int:
        return max(math.ceil(self.ctx / PAGE), self.c)

    @property
    def kv_pages(self) -> int:
        return self.min_pages + self.kv

    def spec(self) -> str:
        return (f"route={self.route},C={self.c},ctx={self.ctx},chunk={self.chunk},kv=+{self.kv},"
                f"slots={self.slots},host={self.host}" + (f",mtp={self.mtp}" if self.mtp else ""))

    __str__ = spec

    @classmethod
    def parse(cls, text: str) -> "SoakConfig":
        names = {"route": "route", "C": "c", "c": "c", "ctx": "ctx", "chunk": "chunk", "kv": "kv",
                 "slots": "slots", "host": "host", "mtp": "mtp"}
        kw: dict[str, Any] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            k, v = part.split("=", 1)
            kw[names[k]] = v if k == "route" else int(v.lstrip("+"))
        return cls(**kw)

    def engine_kwargs(self, state_image_bytes: int) -> dict:
        from ninfer_jax import ContextCacheConfig

        return dict(max_concurrency=self.c, max_context=self.ctx, chunk_size=self.chunk,
                    kv_capacity=self.kv_pages * PAGE, pause_route=self.route, progress=False,
                    speculative_tokens=self.mtp,
                    context_cache=ContextCacheConfig(device_state_slots=self.slots,
                                                     host_capacity_bytes=self.host * state_image_bytes))


def random_config(rng: random.Random) -> SoakConfig:
    c = rng.choice((2, 2, 3, 3, 4))
    return SoakConfig(route=rng.choice(("snapshot", "replay", "auto")), c=c, ctx=rng.choice((256, 256, 384)),
                      chunk=rng.choice((16, 32)), kv=rng.choice((0, 1, 1, 1, 2)), slots=rng.choice((0, 1, 2)),
                      host=rng.choice((0, 0, 1, 2, 3, 4, 6, 8)), mtp=rng.choice((0, 0, 0, 2, 4)))


def state_image_bytes() -> int:
    from ninfer_jax.model import builtin

    return builtin.config().state_image_bytes(4)


def build_engine(model, cfg: SoakConfig):
    from ninfer_jax import Engine, EngineConfig
    from ninfer_jax.program.program import Program

    ec = EngineConfig(**cfg.engine_kwargs(state_image_bytes()))
    return Engine(ec, program=Program(ec, model=model), start=False)


# ---- requests and schedules ---------------------------------------------------------------
@dataclasses.dataclass
class ReqSpec:
    """One request as submitted: everything needed to submit it again (JSON-able)."""

    label: str
    kind: str  # "chat" | "raw"
    op: str  # how the generator made it (new, turn, retry, edit, prefix, continue)
    sampling: dict
    messages: list | None = None
    tools: list | None = None
    cache_markers: list | None = None
    session: str | None = None
    ids: list | None = None
    anchors: list | None = None
    markers: list | None = None
    prompt_len: int = 0

    def sampling_params(self):
        from ninfer_jax import SamplingParams

        return SamplingParams(**self.sampling)

    def submit(self, engine):
        sp = self.sampling_params()
        if self.kind == "chat":
            return engine.submit_chat(self.messages, tools=self.tools, session=self.session,
                                      cache_markers=self.cache_markers, sampling=sp, request_id=self.label)
        return engine.submit(self.ids, sp, request_id=self.label, session=self.session,
                             anchors=self.anchors or (), markers=self.markers or ())

    def describe(self) -> str:
        sp = {k: v for k, v in self.sampling.items() if v not in (None, (), [], 0, 0.0, 1.0, False)
              or k in ("temperature", "max_tokens")}
        head = f"{self.label} [{self.kind}/{self.op}] prompt_len={self.prompt_len} sampling={sp}"
        if self.kind == "chat":
            extra = ""
            if self.tools:
                extra += f" tools={[t['function']['name'] for t in self.tools]}"
            if self.cache_markers:
                extra += f" cache_markers={self.cache_markers}"
            if self.session:
                extra += f" session={self.session!r}"
            return head + extra + "\n    messages=" + json.dumps(self.messages)
        extra = ""
        if self.anchors:
            extra += f" anchors={self.anchors}"
        if self.markers:
            extra += f" markers={self.markers}"
        return head + extra + f"\n    ids={self.ids}"


def _sampling_dict(sp) -> dict:
    d = dataclasses.asdict(sp)
    d["stop"], d["stop_token_ids"] = list(d["stop"]), list(d["stop_token_ids"])
    return d


# ---- the workload generator ------------------------------------------------------------------
WORDS = ("the sea boat tea green shop city rain sun cold warm map road train cat dog time day night "
         "stone river house light north south blue red small large quick slow old new bread salt").split()
SYSTEMS = ("You are a helpful assistant.", "You answer briefly.", "You are an agent with a calculator.",
           "You are a careful assistant for a shop that sells tea.")
TOOLS = [{"type": "function", "function": {"name": "calc", "parameters": {
    "type": "object", "properties": {"x": {"type": "string"}}}}}]
STOPS = ("e", "th", "a ", " the", "er", "\n", "ll", "in", "s", ".")


class Workload:
    """Draws requests from a seed. Chat sessions evolve by turns; raw prompts come in families
    sharing a prefix. A request is sized so that it fits alone (prompt + max_tokens <= max_context)."""

    def __init__(self, rng: random.Random, cfg: SoakConfig, frontend, vocab: int, seed: int):
        self.rng, self.cfg, self.frontend, self.vocab, self.seed = rng, cfg, frontend, vocab, seed
        self.sessions: list[dict] = []
        self.families = [[rng.randrange(vocab) for _ in range(rng.randint(40, cfg.ctx // 2))] for _ in range(3)]
        self.chats: list[ReqSpec] = []
        self.raws: list[ReqSpec] = []
        self.finished_raw: list[tuple[ReqSpec, tuple]] = []
        self.n = 0

    # -- pieces --
    def _words(self, lo=2, hi=8) -> str:
        return " ".join(self.rng.choice(WORDS) for _ in range(self.rng.randint(lo, hi)))

    def _sampling(self, room: int):
        from ninfer_jax import SamplingParams

        r = self.rng
        roll = r.random()
        if roll < 0.4:
            max_tokens = r.randint(4, 24)
        elif roll < 0.7:
            max_tokens = r.randint(24, 96)
        else:
            max_tokens = room  # to the end of the context: long enough to be paused
        max_tokens = max(1, min(max_tokens, room))
        kw: dict[str, Any] = dict(max_tokens=max_tokens, ignore_eos=r.random() < 0.85)
        if r.random() < 0.4:
            kw["temperature"] = 0
        else:
            kw.update(temperature=r.choice((0.6, 0.9, 1.3)), seed=r.randrange(1 << 31),
                      top_p=r.choice((1.0, 1.0, 0.9)), top_k=r.choice((0, 0, 20)), min_p=r.choice((0.0, 0.0, 0.05)))
        if r.random() < 0.15:
            kw["repetition_penalty"] = 1.15
        if r.random() < 0.1:
            kw["presence_penalty"] = 0.5
        if r.random() < 0.2:
            kw["stop"] = tuple(r.sample(STOPS, r.randint(1, 2)))
        return SamplingParams(**kw)

    def _label(self) -> str:
        self.n += 1
        return f"s{self.seed}-r{self.n}"

    def _fit(self, spec: ReqSpec, n_prompt: int, min_room: int = 2) -> ReqSpec | None:
        room = self.cfg.ctx - n_prompt
        if room < min_room:
            return None
        spec.prompt_len = n_prompt
        spec.sampling = _sampling_dict(self._sampling(room))
        return spec

    def _render_len(self, messages, tools=None, cache_markers=None) -> int:
        return len(self.frontend.render_chat(messages, tools=tools, cache_markers=cache_markers).token_ids)

    # -- chat --
    def _assistant(self, turn: int) -> list[dict]:
        r = self.rng
        if r.random() < 0.5:  # a tool call and its result
            call_id = f"c{turn}"
            msg = {"role": "assistant", "content": None if r.random() < 0.6 else self._words(1, 4),
                   "tool_calls": [{"id": call_id, "type": "function",
                                   "function": {"name": "calc", "arguments": {"x": self._words(1, 3)}}}]}
            if r.random() < 0.4:
                msg["reasoning_content"] = "I should call the tool: " + self._words(2, 5)
            return [msg, {"role": "tool", "tool_call_id": call_id, "content": self._words(1, 4)}]
        msg = {"role": "assistant", "content": self._words(3, 10)}
        if r.random() < 0.3:
            msg["reasoning_content"] = self._words(2, 6)
        return [msg, {"role": "user", "content": self._words()}]

    def _chat_spec(self, op, messages, tools, markers, session) -> ReqSpec | None:
        try:
            n = self._render_len(messages, tools, markers)
        except Exception:  # the template refused this shape: not a soak target
            return None
        return self._fit(ReqSpec(self._label(), "chat", op, {}, messages=messages, tools=tools,
                                 cache_markers=markers, session=session), n, min_room=4)

    def chat_new(self) -> ReqSpec | None:
        r = self.rng
        msgs = []
        if r.random() < 0.8:
            msgs.append({"role": "system", "content": r.choice(SYSTEMS)})
        msgs.append({"role": "user", "content": self._words()})
        tools = TOOLS if r.random() < (0.35 if self.cfg.ctx >= 384 else 0.1) else None
        markers = [{"message": 0}] if msgs[0]["role"] == "system" and r.random() < 0.3 else None
        sess = {"id": f"s{self.seed}-chat{len(self.sessions)}", "messages": msgs, "tools": tools,
                "markers": markers, "turn": 0}
        spec = self._chat_spec("new", copy.deepcopy(msgs), tools, markers, sess["id"] if r.random() < 0.7 else None)
        if spec is not None:
            self.sessions.append(sess)
        return spec

    def chat_turn(self) -> ReqSpec | None:
        if not self.sessions:
            return self.chat_new()
        sess = self.rng.choice(self.sessions)
        sess["turn"] += 1
        msgs = sess["messages"] + self._assistant(sess["turn"])
        spec = self._chat_spec("turn", copy.deepcopy(msgs), sess["tools"], sess["markers"], sess["id"])
        if spec is None:  # the conversation outgrew the context: it ends
            self.sessions.remove(sess)
            return self.chat_new()
        sess["messages"] = msgs
        return spec

    def chat_retry(self) -> ReqSpec | None:
        if not self.chats:
            return self.chat_new()
        old = self.rng.choice(self.chats)
        spec = ReqSpec(self._label(), "chat", "retry", dict(old.sampling), messages=copy.deepcopy(old.messages),
                       tools=old.tools, cache_markers=old.cache_markers, session=old.session,
                       prompt_len=old.prompt_len)
        if self.rng.random() < 0.5 and spec.sampling.get("temperature"):
            spec.sampling["seed"] = self.rng.randrange(1 << 31)  # the same input, another draw
        return spec

    def chat_edit(self) -> ReqSpec | None:
        """An earlier message changed (not the last one), the rest kept."""
        cands = [s for s in self.chats if len(s.messages) >= 3]
        if not cands:
            return self.chat_turn()
        old = self.rng.choice(cands)
        msgs = copy.deepcopy(old.messages)
        idx = [i for i, m in enumerate(msgs[:-1]) if isinstance(m.get("content"), str) and m["content"]]
        if not idx:
            return self.chat_turn()
        i = self.rng.choice(idx)
        msgs[i]["content"] = self._words()
        return self._chat_spec("edit", msgs, old.tools, old.cache_markers, old.session)

    # -- raw --
    def raw_prefix(self) -> ReqSpec | None:
        r = self.rng
        fam = r.choice(self.families)
        k = r.randint(min(8, len(fam)), len(fam))
        ids = fam[:k] + [r.randrange(self.vocab) for _ in range(r.randint(1, 60))]
        ids = ids[:self.cfg.ctx - 4]
        spec = ReqSpec(self._label(), "raw", "prefix", {}, ids=ids)
        if r.random() < 0.3:
            spec.anchors = [r.randint(1, len(ids))]
        if r.random() < 0.3:
            spec.markers = [min(k, len(ids))]
        if r.random() < 0.3:
            spec.session = f"s{self.seed}-fam{self.families.index(fam)}"
        return self._fit(spec, len(ids))

    def raw_retry(self) -> ReqSpec | None:
        if not self.raws:
            return self.raw_prefix()
        old = self.rng.choice(self.raws)
        spec = dataclasses.replace(old, label=self._label(), op="retry", sampling=dict(old.sampling))
        if self.rng.random() < 0.5 and spec.sampling.get("temperature"):
            spec.sampling["seed"] = self.rng.randrange(1 << 31)
        return spec

    def raw_continue(self) -> ReqSpec | None:
        """prompt + a finished output + new tokens (source E)."""
        if not self.finished_raw:
            return self.raw_prefix()
        old, out = self.rng.choice(self.finished_raw)
        ids = list(old.ids) + list(out) + [self.rng.randrange(self.vocab) for _ in range(self.rng.randint(0, 20))]
        if len(ids) > self.cfg.ctx - 4:
            return self.raw_prefix()
        return self._fit(ReqSpec(self._label(), "raw", "continue", {}, ids=ids, session=old.session), len(ids))

    OPS = (("chat_new", 2), ("chat_turn", 4), ("chat_retry", 1), ("chat_edit", 1),
           ("raw_prefix", 4), ("raw_retry", 1), ("raw_continue", 2))

    def next(self) -> ReqSpec:
        names, weights = zip(*self.OPS)
        for _ in range(20):
            spec = getattr(self, self.rng.choices(names, weights)[0])()
            if spec is not None:
                (self.chats if spec.kind == "chat" else self.raws).append(spec)
                return spec
        spec = self.raw_prefix()
        assert spec is not None
        return spec

    def finished(self, spec: ReqSpec, completion) -> None:
        if spec.kind == "raw" and completion.finish_reason in ("stop", "length"):
            self.finished_raw.append((spec, completion.token_ids))


# ---- the cold oracle ------------------------------------------------------------------------
class ColdOracle:
    """The same request alone on a fresh engine with the cache off (one per max_context);
    results cached by (prompt ids, sampling)."""

    def __init__(self, model, max_context: int):
        from ninfer_jax import ContextCacheConfig, Engine, EngineConfig
        from ninfer_jax.program.program import Program

        ec = EngineConfig(max_concurrency=1, max_context=max_context, chunk_size=32, progress=False,
                          context_cache=ContextCacheConfig(host_capacity_bytes=1 << 20, enabled=False))
        self.engine = Engine(ec, program=Program(ec, model=model), start=False)
        self.max_context = max_context
        self._memo: dict = {}
        self.runs = 0

    def prompt_ids(self, spec: ReqSpec) -> tuple:
        if spec.kind == "chat":
            return tuple(self.engine._frontend().render_chat(spec.messages, tools=spec.tools,
                                                            cache_markers=spec.cache_markers).token_ids)
        return tuple(spec.ids)

    def _run(self, spec: ReqSpec):
        e = self.engine
        h = spec.submit(e) if spec.kind == "chat" else e.submit(spec.ids, spec.sampling_params())
        for _ in range(4 * self.max_context + 100):
            if h.done():
                break
            e.step()
        assert h.done(), f"the cold engine did not finish {spec.label}"
        e.step()
        e.clear_cache()
        self.runs += 1
        return h

    def reference(self, spec: ReqSpec):
        key = (self.prompt_ids(spec), json.dumps(spec.sampling, sort_keys=True))
        got = self._memo.get(key)
        if got is None:
            got = self._memo[key] = self._run(spec).result()
        return got

    def logits(self, spec: ReqSpec) -> dict | None:
        """The cold run's logits by position (run again, recorded), or None when the engine's
        sampling seam is not there to record them."""
        store = logit_store(self.engine)
        if store is None:
            return None
        label = spec.label if spec.kind == "chat" else None
        store.clear()
        store[label or "*"] = rows = {}
        try:
            self._run(spec)
        finally:
            store.clear()
        return rows


# ---- logits, to tell a float-noise flip from a wrong state ---------------------------------------
NUMERIC_TOL = 1e-3  # logits closer than this (float32 noise is ~1e-5 here) are "the same distribution"


def logit_store(engine) -> dict | None:
    """{request_id or "*": {position: logits}} filled by a wrapper around the core's sampling
    seam (`EngineCore._sample(req, logits)`), installed once; None if that seam is gone."""
    core = engine.core
    store = getattr(core, "_soak_logits", None)
    if store is not None:
        return store
    orig = getattr(core, "_sample", None)
    if not callable(orig):
        return None
    import numpy as np

    store = {}

    def sample(req, logits, *args, **kwargs):
        rows = store.get(req.request_id, store.get("*"))
        if rows is not None:
            rows[len(req.prompt) + len(req.output)] = np.array(logits, dtype=np.float32, copy=True)
        return orig(req, logits, *args, **kwargs)

    core._sample = sample
    core._soak_logits = store
    return store


def diagnose(hot_rows: dict | None, cold_rows: dict | None, prompt_len: int, i: int) -> tuple[str, str]:
    """("numeric" | "state" | "unknown", explanation) for a first difference at output index i."""
    if not hot_rows or not cold_rows:
        return "unknown", "  (logits not recorded: the engine's sampling seam changed)"
    import numpy as np

    p = prompt_len + i
    if p not in hot_rows or p not in cold_rows:
        return "unknown", f"  (no logits recorded at position {p})"
    before = [float(np.abs(hot_rows[q] - cold_rows[q]).max()) for q in range(prompt_len, p)
              if q in hot_rows and q in cold_rows]
    d = float(np.abs(hot_rows[p] - cold_rows[p]).max())
    top = lambda x: np.argsort(-x)[:3].tolist()  # noqa: E731
    text = (f"  logits at position {p}: max|hot - cold| = {d:.3g} (max over the {len(before)} earlier positions: "
            f"{max(before, default=0.0):.3g}); top-3 hot {top(hot_rows[p])}, cold {top(cold_rows[p])}")
    if d <= NUMERIC_TOL:
        return "numeric", text + ("\n  => the same distribution up to float32 noise: a near-tie draw flipped, "
                                  "so some step is not bit-identical to the cold run's (batching is: "
                                  "test_engine_batch_invariant.py; look at chunk boundaries and restored "
                                  "states); no reuse/pause logic error is implied")
    return "state", text + ("\n  => different logits: the hot run computed from a different state "
                            "(KV/StateImage/binding)")


# ---- one run ------------------------------------------------------------------------------
class SoakFailure(AssertionError):
    def __init__(self, message: str, signature: tuple):
        super().__init__(message)
        self.signature = signature


@dataclasses.dataclass
class RunReport:
    cfg: SoakConfig
    seed: int | None
    requests: int = 0
    finished: int = 0
    cancelled: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    cycles: int = 0
    seconds: float = 0.0
    stats: dict = dataclasses.field(default_factory=dict)  # engine counter deltas over the run
    cancelled_seen: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # rare-phase aims

    def line(self) -> str:
        s = self.stats
        who = f"seed={self.seed}" if self.seed is not None else "replayed"
        return (f"{self.cfg} {who}: {self.requests} requests ({self.finished} finished, "
                f"{sum(self.cancelled.values())} cancelled {dict(self.cancelled)}), {self.cycles} cycles, "
                f"pauses replay/snapshot {s.get('pauses_replay', 0)}/{s.get('pauses_snapshot', 0)}, "
                f"resumes {s.get('resumes_replay', 0)}/{s.get('resumes_snapshot', 0)}, "
                f"hits {s.get('cache_hits', 0)}, {self.seconds:.1f}s")


def phase_of(engine, handle) -> str:
    """queued / prefill / decode / paused / resuming / inbox / finished, read between cycles.
    Works with the phase names of today's core (paused = queued after an admission) and with a
    PAUSED phase."""
    req = engine.core.by_id.get(handle.request_id)
    if req is None:
        return "finished" if handle.done() else "inbox"
    ph = str(req.phase)
    if ph == "queued" and (getattr(req, "replaying", False) or req.output or req.t_admitted is not None):
        return "paused"
    if ph == "prefill" and getattr(req, "replaying", False):
        return "resuming"
    return ph


@contextlib.contextmanager
def alarm(seconds: int, what: str):
    """Turn a hang inside one call into a clear failure (main thread, POSIX only)."""
    if not hasattr(signal, "SIGALRM") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def fire(signum, frame):
        raise TimeoutError(f"{what} ran longer than {seconds}s (hang)")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _repo_relative(filename: str) -> str:
    """A frame's file as a path inside the repository when it is one (short failure reports)."""
    rel = os.path.relpath(filename, _REPO)
    return filename if rel.startswith("..") else rel


def _frame_signature(exc: BaseException) -> str:
    """Where in the project an exception came from: its innermost engine/ledger frame."""
    tb = traceback.extract_tb(exc.__traceback__)
    for fr in reversed(tb):
        if "/ninfer_jax/" in fr.filename or "/ledger/" in fr.filename:
            return f"{fr.filename.split('/')[-2]}/{fr.filename.split('/')[-1]}:{fr.name}"
    return tb[-1].name if tb else "?"


class Run:
    """One seeded (or replayed) run. `schedule` records every submit and cancel by cycle."""

    P_SUBMIT = 0.2
    P_CANCEL = 0.3  # share of requests aimed at a cancel
    P_RARE = 0.15  # share of the requests seen paused (or resuming) that are cancelled there

    def __init__(self, engine, oracle: ColdOracle, cfg: SoakConfig, seed: int | None, n_requests: int = 12,
                 schedule: list | None = None, check_every_cycle: bool = True, log=None, origin: str = ""):
        self.engine, self.oracle, self.cfg, self.seed = engine, oracle, cfg, seed
        self.origin = origin  # what a replayed schedule came from, for messages
        self.n_requests = n_requests
        self.replaying = schedule is not None
        self.given = sorted(schedule, key=lambda ev: ev["cycle"]) if schedule is not None else None
        self.schedule: list[dict] = []
        self.rng = random.Random(seed if seed is not None else 0)
        self.check_every_cycle = check_every_cycle
        self.log = log
        self.live: dict[str, dict] = {}  # label -> {spec, handle, target}
        self.specs: dict[str, ReqSpec] = {}
        self.cycle = 0
        self.work = 0  # cycles the submitted requests need alone, for the no-progress budget
        self.report = RunReport(cfg, seed)
        self.targets: list[str] = []  # phases whose aimed request missed them
        self.aims: dict[int, str] = {}  # request ordinal -> the phase it is cancelled in
        self.logits = logit_store(engine)
        if not self.replaying:
            # Every run aims at every phase, then at random ones, P_CANCEL of its requests in
            # all; the queued aims go to the latest requests (submitted while lanes are full).
            n = n_requests
            k = min(n, max(len(PHASES), round(self.P_CANCEL * n)))
            phases = list(PHASES) + [self.rng.choice(PHASES) for _ in range(k - len(PHASES))]
            others = [p for p in phases if p != "queued"]
            self.rng.shuffle(others)
            queued = [p for p in phases if p == "queued"]
            self.aims = dict(zip(sorted(self.rng.sample(range(n), k)), others + queued))
            self.workload = Workload(random.Random(self.rng.randrange(1 << 62)), cfg, engine._frontend(),
                                     engine.program.vocab_size, seed)

    # -- reporting --
    def repro(self) -> str:
        if self.replaying:
            return f"python tests/engine/soak.py --replay {self.origin or 'FILE.json'} [--trace] [--shrink]"
        return (f"python tests/engine/soak.py --config '{self.cfg}' --seed {self.seed} --requests {self.n_requests} "
                f"[--trace] [--shrink]  (the same harness version; the saved schedule below does not depend on it)")

    def fail(self, what: str, signature: tuple, spec: ReqSpec | None = None, detail: str = "",
             exc: BaseException | None = None) -> SoakFailure:
        live = ", ".join(f"{k}:{phase_of(self.engine, v['handle'])}" for k, v in self.live.items())
        events = "\n".join(f"    {_event_str(ev)}" for ev in self.schedule[-25:])
        msg = [f"SOAK FAILURE: {what}",
               f"  {'seed=' + str(self.seed) if not self.replaying else 'replayed schedule ' + (self.origin or '')} "
               f"config: {self.cfg} (EngineConfig "
               f"kv_capacity={self.cfg.kv_pages * PAGE} tokens = {self.cfg.kv_pages} pages, "
               f"state slots {self.cfg.c}+{self.cfg.slots}, host {self.cfg.host} StateImages)",
               f"  at cycle {self.cycle}; live: {live or '-'}",
               f"  core: {_core_state(self.engine)}",
               f"  repro: {self.repro()}"]
        if spec is not None:
            msg.append("  request: " + spec.describe())
        if detail:
            msg.append(detail)
        if exc is not None:
            frames = traceback.extract_tb(exc.__traceback__)[-6:]
            msg.append("  where (innermost frames):\n" + "".join(
                f"    {_repo_relative(fr.filename)}:{fr.lineno} in {fr.name}: {fr.line}\n"
                for fr in frames).rstrip())
        msg.append(f"  schedule (last {min(25, len(self.schedule))} of {len(self.schedule)} events):\n{events}")
        return SoakFailure("\n".join(msg), signature)

    # -- driving --
    def _submit(self, spec: ReqSpec, target: str | None) -> None:
        self.specs[spec.label] = spec
        self.schedule.append({"cycle": self.cycle, "op": "submit", "spec": dataclasses.asdict(spec)})
        try:
            handle = spec.submit(self.engine)
        except Exception as e:
            raise self.fail(f"submit raised {type(e).__name__}: {e}", ("submit", type(e).__name__), spec, exc=e) from e
        self.live[spec.label] = {"spec": spec, "handle": handle, "target": target}
        if self.logits is not None:
            self.logits[handle.request_id] = {}
        self.report.requests += 1
        self.work += math.ceil(spec.prompt_len / self.cfg.chunk) + spec.sampling["max_tokens"] + 2
        if self.log:
            self.log(f"cycle {self.cycle}: submit {spec.label} [{spec.kind}/{spec.op}] "
                     f"prompt {spec.prompt_len} max_tokens {spec.sampling['max_tokens']}"
                     + (f" (cancel target {target})" if target else ""))

    def _cancel(self, label: str, phase: str) -> None:
        entry = self.live.get(label)
        if entry is None or entry["handle"].done():
            return
        self.schedule.append({"cycle": self.cycle, "op": "cancel", "label": label, "phase": phase})
        entry["cancel_phase"] = phase
        entry["handle"].cancel()
        if self.log:
            self.log(f"cycle {self.cycle}: cancel {label} ({phase})")

    def _generated_events(self) -> None:
        r = self.rng
        if self.report.requests < self.n_requests:
            burst = self.report.requests == 0
            if burst or not self.live or r.random() < self.P_SUBMIT:
                k = self.cfg.c + 1 if burst else r.randint(1, 3)
                for _ in range(min(k, self.n_requests - self.report.requests)):
                    target = self.aims.pop(self.report.requests, None)
                    if target is None and self.targets and r.random() < 0.5:
                        target = self.targets.pop()  # a phase an earlier aim missed
                    self._submit(self.workload.next(), target)
        for label, entry in list(self.live.items()):
            if "cancel_phase" in entry:
                continue
            ph = phase_of(self.engine, entry["handle"])
            if ph == "inbox":
                ph = "queued"
            if ph in ("paused", "resuming") and ph not in entry.setdefault("seen", set()):
                # Pauses are the rarest phases: the first request seen in one in a run, then one in
                # P_RARE of them, is cancelled there.
                entry["seen"].add(ph)
                if entry["target"] is None and (not self.report.cancelled_seen[ph] or r.random() < self.P_RARE):
                    entry["target"] = ph
                    self.report.cancelled_seen[ph] += 1
            target = entry["target"]
            if target is None:
                continue
            if ph == target and r.random() < (1.0 if target in ("paused", "resuming") else 0.5):
                self._cancel(label, ph)
            elif target == "queued" and ph not in ("queued", "paused"):
                entry["target"] = None  # admitted before the draw said so: another request takes it
                self.targets.append("queued")

    def _given_events(self) -> None:
        while self.given and self.given[0]["cycle"] <= self.cycle:
            ev = self.given.pop(0)
            if ev["op"] == "submit":
                self._submit(ReqSpec(**ev["spec"]), None)
            else:
                entry = self.live.get(ev["label"])
                ph = phase_of(self.engine, entry["handle"]) if entry else "finished"
                self._cancel(ev["label"], "queued" if ph == "inbox" else ph)

    def _step(self) -> None:
        try:
            with alarm(STEP_ALARM_S, f"engine.step() at cycle {self.cycle}"):
                self.engine.step()
        except SoakFailure:
            raise
        except Exception as e:
            raise self.fail(f"engine.step() raised {type(e).__name__}: {e}",
                            ("step", type(e).__name__, _frame_signature(e)), exc=e) from e
        if self.check_every_cycle:
            try:
                self.engine.check_integrity()
            except Exception as e:
                raise self.fail(f"check_integrity() after cycle {self.cycle} raised {type(e).__name__}: {e}",
                                ("integrity", type(e).__name__, _frame_signature(e)), exc=e) from e

    def _collect(self) -> None:
        for label, entry in list(self.live.items()):
            h = entry["handle"]
            if not h.done():
                phases = entry.setdefault("phases", [])
                ph = phase_of(self.engine, h)
                if not phases or phases[-1] != ph:
                    phases.append(ph)
                continue
            del self.live[label]
            got = h.result()
            if entry["target"] and "cancel_phase" not in entry and not self.replaying:
                self.targets.append(entry["target"])  # missed its phase: the next aimed request takes it
            entry["logits"] = self.logits.pop(h.request_id, None) if self.logits is not None else None
            if self.log:
                self.log(f"cycle {self.cycle}: {label} ended {got.finish_reason} with {len(got.token_ids)} tokens "
                         f"(cached {got.usage.cached_tokens}); phases " + " > ".join(entry.get("phases", [])))
            self.check(entry, got)

    def check(self, entry: dict, got) -> None:
        spec: ReqSpec = entry["spec"]
        if not self.replaying:
            self.workload.finished(spec, got)
        if got.finish_reason == "error":
            raise self.fail(f"request {spec.label} ended with an error: {got.error}",
                            ("error", (got.error or "").replace(spec.label, "X")[:60]),
                            spec, f"  output so far: {list(got.token_ids)}")
        cold = self.oracle.reference(spec)
        if cold.finish_reason == "error":
            raise self.fail(f"the cold engine failed {spec.label}: {cold.error}", ("cold-error",), spec)
        if tuple(got.prompt_token_ids) != tuple(cold.prompt_token_ids):
            raise self.fail(f"request {spec.label}: prompt token ids differ from the cold run", ("prompt",), spec,
                            f"  hot  {list(got.prompt_token_ids)}\n  cold {list(cold.prompt_token_ids)}")
        hot_t, cold_t = tuple(got.token_ids), tuple(cold.token_ids)
        pauses = "  phases seen between cycles: " + " > ".join(entry.get("phases", []))
        if got.finish_reason == "cancelled":
            self.report.cancelled[entry.get("cancel_phase", "?")] += 1
            ok_tokens = cold_t[:len(hot_t)] == hot_t
            if not ok_tokens:
                self._token_mismatch(entry, got, cold, pauses, f"cancelled request {spec.label} (cancelled while "
                                     f"{entry.get('cancel_phase')}) is not a prefix of the cold run", "cancel-prefix")
                return
            expect_text = _detok_text(self.engine, spec, hot_t)
            if got.text != expect_text:
                raise self.fail(f"cancelled request {spec.label}: its text is not the text of its tokens",
                                ("cancel-text",), spec, _diff(got, cold, pauses) + f"\n  text expected {expect_text!r}")
            return
        self.report.finished += 1
        if not 0 <= got.usage.cached_tokens <= len(got.prompt_token_ids):
            raise self.fail(f"request {spec.label}: usage.cached_tokens={got.usage.cached_tokens} outside "
                            f"[0, prompt_tokens]", ("usage",), spec)
        if any(x != y for x, y in zip(hot_t, cold_t)):
            self._token_mismatch(entry, got, cold, pauses, f"request {spec.label} differs from the cold run",
                                 "mismatch")
            return
        if (got.finish_reason, hot_t, got.text) != (cold.finish_reason, cold_t, cold.text) or \
                got.usage.completion_tokens != len(hot_t) or got.usage.prompt_tokens != len(cold.prompt_token_ids):
            raise self.fail(f"request {spec.label} differs from the cold run", ("mismatch", got.finish_reason),
                            spec, _diff(got, cold, pauses))

    def _token_mismatch(self, entry, got, cold, pauses: str, what: str, kind: str) -> None:
        """Tokens differ at some index: tell a float-noise flip from a wrong state by the logits."""
        spec: ReqSpec = entry["spec"]
        a, b = tuple(got.token_ids), tuple(cold.token_ids)
        i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        cold_rows = self.oracle.logits(spec) if entry.get("logits") is not None else None
        verdict, why = diagnose(entry.get("logits"), cold_rows, len(got.prompt_token_ids), i)
        if verdict == "numeric":  # fails like any other difference: batching is bit-identical
            what = "NUMERIC FLIP: " + what
        raise self.fail(what, (kind, verdict), spec, _diff(got, cold, pauses) + "\n" + why)

    def run(self) -> RunReport:
        t0 = time.perf_counter()
        stats0 = self.engine.stats()
        while True:
            if self.replaying:
                self._given_events()
                more = bool(self.given)
            else:
                self._generated_events()
                more = self.report.requests < self.n_requests
            if not self.live and not more:
                break
            budget = 4 * self.work + 400
            if self.cycle > budget:
                raise self.fail(f"no progress: {self.cycle} cycles, over the budget of {budget} for the work "
                                f"submitted (each request alone needs ~{self.work} cycles in all)", ("hang",))
            self._step()
            self.cycle += 1
            self._collect()
        try:
            self.engine.step()  # drain the inbox
            self.engine.check_integrity()
            from engine_helpers import assert_idle_and_empty

            assert_idle_and_empty(self.engine)
        except Exception as e:
            raise self.fail(f"at the end (everything finished, cache cleared) something is held: "
                            f"{type(e).__name__}: {e}", ("leak", type(e).__name__), exc=e) from e
        stats1 = self.engine.stats()
        self.report.stats = {k: v - stats0.get(k, 0) for k, v in stats1.items()
                             if isinstance(v, (int, float)) and not isinstance(v, bool)}
        self.report.cycles = self.cycle
        self.report.seconds = time.perf_counter() - t0
        for key in ("requests_failed", "capacity_errors"):
            if self.report.stats.get(key):
                raise self.fail(f"stats()['{key}'] = {self.report.stats[key]} at capacities where every "
                                f"request fits alone", (key,))
        return self.report


def _core_state(engine) -> str:
    """Residents and queued/paused requests as the core sees them (between or inside a cycle)."""
    def row(r):
        extra = "".join(f" {k}={getattr(r, k)}" for k in ("replaying", "computed", "paused_route")
                        if getattr(r, k, None) not in (None, False, 0))
        return f"{r.request_id}({r.phase} fed={r.fed} pages={len(r.pages)} out={len(r.output)}{extra})"
    try:
        core = engine.core
        waiting = [r for r in core.by_id.values() if r not in core.residents]
        return ("residents " + ", ".join(row(r) for r in core.residents) + "; waiting "
                + ", ".join(row(r) for r in sorted(waiting, key=lambda r: r.ticket)))
    except Exception as e:  # the engine's insides changed shape: say so, do not fail here
        return f"(unavailable: {type(e).__name__}: {e})"


def _event_str(ev: dict) -> str:
    if ev["op"] == "submit":
        s = ev["spec"]
        return (f"cycle {ev['cycle']:4d}: submit {s['label']} [{s['kind']}/{s['op']}] prompt {s['prompt_len']} "
                f"max_tokens {s['sampling']['max_tokens']} T={s['sampling']['temperature']}")
    return f"cycle {ev['cycle']:4d}: cancel {ev['label']} ({ev.get('phase')})"


def _detok_text(engine, spec: ReqSpec, tokens) -> str:
    from ninfer_jax.engine.detok import Detokenizer

    d = Detokenizer(engine.tokenizer_decode, tuple(spec.sampling.get("stop") or ()))
    text = "".join(d.push(t) for t in tokens)
    return text + d.flush()


def _diff(got, cold, extra: str = "") -> str:
    a, b = tuple(got.token_ids), tuple(cold.token_ids)
    i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    lines = [f"  finish hot={got.finish_reason!r} cold={cold.finish_reason!r}; "
             f"{len(a)} vs {len(b)} tokens; first difference at output index {i} "
             f"(position {len(got.prompt_token_ids) + i}); cached_tokens={got.usage.cached_tokens}",
             f"  hot  tokens {list(a)}", f"  cold tokens {list(b)}",
             f"  hot  text {got.text!r}", f"  cold text {cold.text!r}"]
    if extra:
        lines.append(extra)
    return "\n".join(lines)


# ---- drivers ------------------------------------------------------------------------------
class Soak:
    """Engines and cold oracles shared by many runs; an engine that failed is dropped."""

    def __init__(self, model, log=print):
        self.model = model
        self.log = log
        self.engines: dict[str, Any] = {}
        self.oracles: dict[int, ColdOracle] = {}
        self.reports: list[RunReport] = []
        self.failures: list[SoakFailure] = []
        self.history: dict[str, list] = collections.defaultdict(list)  # seeds each engine ran before
        self.schedules: dict[str, list] = collections.defaultdict(list)  # and their schedules
        self.out_dir = os.environ.get("NINFER_SOAK_DIR") or tempfile.gettempdir()

    def oracle(self, ctx: int) -> ColdOracle:
        if ctx not in self.oracles:
            self.oracles[ctx] = ColdOracle(self.model, ctx)
        return self.oracles[ctx]

    def engine(self, cfg: SoakConfig):
        key = cfg.spec()
        if key not in self.engines:
            if len(self.engines) >= 4:  # keep memory bounded in long runs
                self.engines.pop(next(iter(self.engines)))
            self.engines[key] = build_engine(self.model, cfg)
            self.history[key], self.schedules[key] = [], []
        return self.engines[key]

    def run(self, cfg: SoakConfig, seed: int, n_requests: int) -> RunReport | None:
        engine = self.engine(cfg)
        run = Run(engine, self.oracle(cfg.ctx), cfg, seed, n_requests)
        before = list(self.history[cfg.spec()])
        self.history[cfg.spec()].append(seed)
        try:
            report = run.run()
        except SoakFailure as f:
            path = os.path.join(self.out_dir, f"soak-fail-{cfg.route}-seed{seed}.json")
            try:
                save_schedule(path, cfg, seed, run.schedule, f.signature, self.schedules[cfg.spec()])
                saved = f"\n  schedule saved: python tests/engine/soak.py --replay {path} [--trace] [--shrink]"
            except OSError as e:
                saved = f"\n  (schedule not saved: {e})"
            if before:
                saved += (f"\n  (this engine had run seeds {before} before, each ending idle and empty; "
                          f"the saved file replays them first)")
            f.args = (f.args[0] + saved,)
            self.failures.append(f)
            self.engines.pop(cfg.spec(), None)  # its state is suspect
            self.log(f"soak FAIL {cfg} seed={seed}:\n{f}")
            return None
        self.schedules[cfg.spec()].append(run.schedule)
        self.reports.append(report)
        self.log("soak " + report.line())
        return report

    def totals(self) -> dict:
        t: dict[str, Any] = collections.Counter()
        by_route: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        for r in self.reports:
            t["runs"] += 1
            t["requests"] += r.requests
            t["finished"] += r.finished
            t["cancelled"] += sum(r.cancelled.values())
            for k in ("pauses_replay", "pauses_snapshot", "resumes_replay", "resumes_snapshot", "cache_hits"):
                t[k] += r.stats.get(k, 0)
                by_route[r.cfg.route][k] += r.stats.get(k, 0)
        cancels = collections.Counter()
        for r in self.reports:
            cancels.update(r.cancelled)
        return {"totals": dict(t), "by_route": {k: dict(v) for k, v in by_route.items()},
                "cancelled_by_phase": dict(cancels), "failures": len(self.failures)}

    def summary(self) -> str:
        t = self.totals()
        tt = t["totals"]
        return (f"soak summary: {tt.get('runs', 0)} runs, {tt.get('requests', 0)} requests checked against cold "
                f"({tt.get('finished', 0)} finished, {tt.get('cancelled', 0)} cancelled by phase "
                f"{t['cancelled_by_phase']}); pauses replay/snapshot {tt.get('pauses_replay', 0)}/"
                f"{tt.get('pauses_snapshot', 0)}, resumes {tt.get('resumes_replay', 0)}/"
                f"{tt.get('resumes_snapshot', 0)}, "
                f"cache hits {tt.get('cache_hits', 0)}; by route {t['by_route']}; {len(self.failures)} failed runs")


# ---- replay and shrinking -----------------------------------------------------------------
def replay(model, cfg: SoakConfig, schedule: list, oracle: ColdOracle | None = None, log=None, prior=(),
           engine=None, origin: str = ""):
    """Run a recorded schedule on a fresh engine (after `prior` schedules that ran on it before
    and passed); returns the report or raises SoakFailure."""
    engine = engine or build_engine(model, cfg)
    oracle = oracle or ColdOracle(model, cfg.ctx)
    for earlier in prior:
        Run(engine, oracle, cfg, None, schedule=earlier, origin=origin + " (an earlier run)").run()
    return Run(engine, oracle, cfg, None, schedule=schedule, log=log, origin=origin).run()


def replay_file(model, path: str, log=None, oracle: ColdOracle | None = None):
    """Replay a saved schedule file (as written by a failing run or --shrink) on a fresh engine."""
    with open(path) as f:
        doc = json.load(f)
    cfg = SoakConfig.parse(doc["config"])
    return replay(model, cfg, doc["schedule"], oracle=oracle, log=log, prior=doc.get("prior") or (), origin=path)


def shrink(model, cfg: SoakConfig, schedule: list, signature: tuple, log=print, prior=()) -> tuple[list, list]:
    """Greedy one-at-a-time removal of submits (and their cancels), then of cancels, then moving
    submits to cycle 0, keeping the failure's signature. Every try costs a fresh engine
    (warm-up ~10 s), so this takes minutes. Returns (schedule, prior) with `prior` dropped when
    the failure does not need the earlier runs."""
    oracle = ColdOracle(model, cfg.ctx)

    def fails(sched, pre) -> bool:
        # A fresh engine each try: an engine that ended idle and empty still carries history
        # (cache evidence, tickets) that can decide whether a failure shows.
        try:
            replay(model, cfg, sched, oracle=oracle, prior=pre)
            return False
        except SoakFailure as f:
            return tuple(f.signature) == tuple(signature)

    prior = list(prior)
    if prior and fails(schedule, []):
        log("shrink: the failure does not need the earlier runs")
        prior = []
    cur = list(schedule)
    changed = True
    while changed:
        changed = False
        labels = [ev["spec"]["label"] for ev in cur if ev["op"] == "submit"]
        for label in reversed(labels):
            trial = [ev for ev in cur if not (ev.get("label") == label or
                                              (ev["op"] == "submit" and ev["spec"]["label"] == label))]
            if fails(trial, prior):
                cur, changed = trial, True
                log(f"shrink: dropped {label}; {sum(ev['op'] == 'submit' for ev in cur)} requests left")
        for ev in [e for e in cur if e["op"] == "cancel"]:
            trial = [e for e in cur if e is not ev]
            if fails(trial, prior):
                cur, changed = trial, True
                log(f"shrink: dropped the cancel of {ev['label']}")
        for ev in list(cur):
            if ev["op"] == "submit" and ev["cycle"] > 0:
                trial = [dict(e, cycle=0) if e is ev else e for e in cur]
                if fails(trial, prior):
                    cur, changed = trial, True
                    log(f"shrink: {ev['spec']['label']} now submitted at cycle 0")
    return cur, prior


def save_schedule(path: str, cfg: SoakConfig, seed, schedule: list, signature=(), prior=()) -> str:
    with open(path, "w") as f:
        json.dump({"config": str(cfg), "seed": seed, "signature": list(signature or ()), "prior": list(prior),
                   "schedule": schedule}, f, indent=1)
    return path


def print_schedule(schedule: list) -> None:
    for ev in schedule:
        print("  " + _event_str(ev))
        if ev["op"] == "submit":
            print("      " + ReqSpec(**ev["spec"]).describe().replace("\n", "\n      "))


def main(argv=None) -> int:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(SoakConfig()))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--requests", type=int, default=12)
    p.add_argument("--replay", help="a schedule JSON (saved by a failing soak run, --save or --shrink)")
    p.add_argument("--save", help="write the run's schedule to this JSON file")
    p.add_argument("--shrink", action="store_true", help="on failure, shrink the schedule and save it")
    p.add_argument("--trace", action="store_true", help="print every submit, cancel and end as it happens")
    args = p.parse_args(argv)
    from ninfer_jax.model.model import load_model

    model = load_model("builtin:tiny-hybrid")
    log = print if args.trace else None
    prior: list = []
    if args.replay:
        with open(args.replay) as f:
            doc = json.load(f)
        cfg, seed, prior = SoakConfig.parse(doc["config"]), doc.get("seed"), doc.get("prior") or []
        sched, status, sig = doc["schedule"], 0, None
        try:
            print(replay(model, cfg, sched, prior=prior, log=log, origin=args.replay).line())
        except SoakFailure as f:
            print(f)
            status, sig = 1, f.signature
    else:
        cfg, seed = SoakConfig.parse(args.config), args.seed
        run = Run(build_engine(model, cfg), ColdOracle(model, cfg.ctx), cfg, seed, args.requests, log=log)
        try:
            print(run.run().line())
            status, sig = 0, None
        except SoakFailure as f:
            print(f)
            status, sig = 1, f.signature
        sched = run.schedule
    if status and args.shrink:
        print(f"shrinking {sum(ev['op'] == 'submit' for ev in sched)} requests, signature {sig} ...")
        sched, prior = shrink(model, cfg, sched, sig, prior=prior)
    if args.save or (status and args.shrink):
        path = args.save or os.path.join(tempfile.gettempdir(), f"soak-min-{cfg.route}-seed{seed}.json")
        save_schedule(path, cfg, seed, sched, sig, prior)
        print(f"schedule ({sum(ev['op'] == 'submit' for ev in sched)} requests"
              + (f", after {len(prior)} earlier runs on the same engine" if prior else "")
              + f") saved to {path}; replay: python tests/engine/soak.py --replay {path} --trace")
        if status and args.shrink:
            print_schedule(sched)
    return status


if __name__ == "__main__":
    sys.exit(main())
