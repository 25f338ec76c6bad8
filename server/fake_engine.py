"""A fake engine with the `ninfer_jax.Engine` surface, and a loopback server over an engine.

`FakeEngine` is what `ninfer serve --model=fake:NAME` serves and `ninfer bench serve --fake`
drives: no model, no compilation. It produces deterministic tokens from (prompt, seed, position),
one token per running request per step on a background control thread, admits at most
`max_concurrency` requests and queues the rest, honours `cancel()` on the control thread (like
the real engine), reports `cached_tokens` as the longest prefix shared with an earlier
sequence, and checks its own slot accounting in `check_integrity()`. The tokenizer and chat
frontend are the real built-in ones. `running_server` serves an engine on a free loopback port
(`ninfer bench serve`). The tests' controls (scripted output, injected failures) and helpers
live with the tests (tests/server/fakes.py).
"""
from __future__ import annotations

import collections
import contextlib
import itertools
import queue
import random
import threading
import time
from typing import Iterator, Sequence

from ninfer_jax.engine.types import Completion, SamplingParams, TokenDelta, TokenLogprob, Usage, check_prompt
from ninfer_jax.errors import EngineClosedError, QueueFullError
from ninfer_jax.frontend import ChatFrontend, Tokenizer

_END = object()


class FakeHandle:
    def __init__(self, request_id: str, prompt: tuple[int, ...], sampling: SamplingParams, cached: int):
        self.request_id = request_id
        self.prompt = prompt
        self.sampling = sampling
        self.cached = cached
        self.seed = sampling.seed if sampling.seed is not None else random.getrandbits(32)
        self.tokens: list[int] = []
        self.shown = ""
        self.cancel_requested = False
        self.t_submit = time.monotonic()
        self.t_admitted: float | None = None
        self.t_first: float | None = None
        self._deltas: queue.Queue = queue.Queue()
        self._done = threading.Event()
        self._completion: Completion | None = None
        self._engine: FakeEngine | None = None

    def stream(self) -> Iterator[TokenDelta]:
        while True:
            item = self._deltas.get()
            if item is _END:
                self._deltas.put(_END)  # a second stream() ends at once
                return
            yield item

    def result(self, timeout: float | None = None) -> Completion:
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.request_id} not finished after {timeout}s")
        return self._completion

    def cancel(self) -> None:
        if self._engine is not None:
            self._engine._request_cancel(self)

    def done(self) -> bool:
        return self._done.is_set()


class FakeEngine:
    def __init__(self, *, max_concurrency: int = 4, max_context: int = 256, max_queue: int = 1024,
                 step_s: float = 0.001, warmup_s: float = 0.0, min_len: int = 4, max_len: int = 24,
                 model: str = "fake:tiny", generation_defaults: dict | None = None, chat_template: str | None = None):
        """`generation_defaults`: what `generation_defaults()` reports (a checkpoint's
        generation_config.json sampling defaults; none by default); `chat_template`: a jinja file
        replacing the built-in template (`--chat_template`)."""
        self.tokenizer = Tokenizer.builtin()
        if chat_template is not None:
            from ninfer_jax.engine.intake import read_chat_template

            self.tokenizer.chat_template = read_chat_template(chat_template)
        self._generation_defaults = dict(generation_defaults or {})
        if self._generation_defaults:
            SamplingParams(**self._generation_defaults)  # refused at construction, as the engine's load does
        self.frontend = ChatFrontend(self.tokenizer, max_input_tokens=max_context)
        self.max_concurrency = max_concurrency
        self.max_context = max_context
        self.max_queue = max_queue
        self.step_s = step_s
        self.min_len, self.max_len = min_len, max_len
        self.model = model
        # Printable single-token ids, so every token decodes to visible text on its own.
        self._alphabet = [i for i in range(256) if len(self.tokenizer.decode([i])) == 1
                          and self.tokenizer.decode([i]).isalnum() and self.tokenizer.decode([i]).isascii()]
        self._lock = threading.Condition()
        self._waiting: collections.deque[FakeHandle] = collections.deque()
        self._running: list[FakeHandle] = []
        self._slots_used = 0
        self._history: collections.deque[tuple[int, ...]] = collections.deque(maxlen=64)
        self._ids = itertools.count()
        self._closed = False
        self._stats = collections.Counter()
        if warmup_s:
            time.sleep(warmup_s)  # stands in for loading and compiling
        self._thread = threading.Thread(target=self._loop, name="fake-engine", daemon=True)
        self._thread.start()

    # --- public surface ----------------------------------------------------------------------
    def submit(self, prompt: str | Sequence[int], sampling: SamplingParams | None = None, *,
               request_id: str | None = None, session=None, anchors=(), markers=(),
               recovery_point=None) -> FakeHandle:
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        ids = check_prompt(ids, self.tokenizer.vocab_size, self.max_context)
        sampling = sampling or SamplingParams()
        with self._lock:
            if self._closed:
                raise EngineClosedError("engine is closed")
            if len(self._waiting) >= self.max_queue:
                raise QueueFullError(f"waiting queue full ({self.max_queue})")
            handle = FakeHandle(request_id or f"fake-{next(self._ids)}", ids, sampling, self._cached(ids))
            handle._engine = self
            self._queued(handle)
            self._waiting.append(handle)
            self._stats["requests_submitted"] += 1
            self._stats["prompt_tokens"] += len(ids)
            self._stats["cached_tokens"] += handle.cached
            self._lock.notify_all()
        return handle

    def submit_chat(self, messages, *, tools=None, session=None, cache_markers=None, sampling=None,
                    request_id=None) -> FakeHandle:
        rendered = self.frontend.render_chat(messages, tools=tools, cache_markers=cache_markers)
        return self.submit(list(rendered.token_ids), sampling, request_id=request_id)

    def chat_frontend(self) -> ChatFrontend:
        return self.frontend

    def submit_rendered(self, rendered, *, sampling=None, request_id=None, session=None, anchors=None,
                        prompt_anchor=False) -> FakeHandle:
        return self.submit(list(rendered.token_ids), sampling, request_id=request_id)

    def tokenizer_decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids))

    def generate(self, prompt, sampling=None) -> Completion:
        return self.submit(prompt, sampling).result()

    def chat(self, messages, tools=None, session=None, cache_markers=None, sampling=None) -> Completion:
        return self.submit_chat(messages, tools=tools, session=session, cache_markers=cache_markers,
                                sampling=sampling).result()

    def generation_defaults(self) -> dict:
        return dict(self._generation_defaults)

    def model_info(self) -> dict:
        return {"name": self.model, "model_type": "fake", "vocab_size": self.tokenizer.vocab_size,
                "max_context": self.max_context, "max_concurrency": self.max_concurrency,
                "dtype": "float32", "eos_token_ids": list(self.tokenizer.eos_token_ids)}

    def stats(self) -> dict[str, int | float]:
        with self._lock:
            out = dict(self._stats)
            out.update(running=len(self._running), waiting=len(self._waiting), step_seconds=self.step_s)
            # The real engine's names, so /metrics reads the fake the same way (server/metrics.py).
            out.update(residents=len(self._running), queued=len(self._waiting),
                       requests_finished=self._stats["finished_stop"] + self._stats["finished_length"],
                       requests_cancelled=self._stats["finished_cancelled"],
                       requests_failed=self._stats["finished_error"])
            return out

    def check_integrity(self) -> None:
        with self._lock:
            if self._slots_used != len(self._running) or self._slots_used > self.max_concurrency:
                raise AssertionError(f"slots used {self._slots_used}, running {len(self._running)}")
            leaked = [h.request_id for h in self._running if h.done()]
            if leaked:
                raise AssertionError(f"finished requests still hold slots: {leaked}")

    def active_requests(self) -> int:
        with self._lock:
            return len(self._running) + len(self._waiting)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for h in list(self._running) + list(self._waiting):
                h.cancel_requested = True
            self._lock.notify_all()
        self._thread.join(timeout=10)

    # --- control thread ----------------------------------------------------------------------
    def _queued(self, handle: FakeHandle) -> None:
        """A request joins the queue (the lock held); a fake with more to say about it says it here."""

    def _request_cancel(self, handle: FakeHandle) -> None:
        with self._lock:
            handle.cancel_requested = True
            self._lock.notify_all()

    def _cached(self, ids: tuple[int, ...]) -> int:
        best = 0
        for seq in self._history:
            n = 0
            for a, b in zip(seq, ids[:-1]):  # at least one prompt token is always computed
                if a != b:
                    break
                n += 1
            best = max(best, n)
        return best

    def _token(self, h: FakeHandle, i: int) -> int:
        key = hash((h.prompt, i, 0 if h.sampling.greedy else h.seed)) & 0xFFFFFFFF
        return self._alphabet[key % len(self._alphabet)]

    def _length(self, h: FakeHandle) -> int:
        return self.min_len + sum(h.prompt) % (self.max_len - self.min_len + 1)

    def _finish(self, h: FakeHandle, reason: str, error: str | None = None) -> None:
        """Free the slot, record the sequence, publish the completion (lock held); `error`: the
        message of a request that finishes with reason "error"."""
        if h in self._running:
            self._running.remove(h)
            self._slots_used -= 1
        elif h in self._waiting:
            self._waiting.remove(h)
        if reason in ("stop", "length"):
            self._history.append(h.prompt + tuple(h.tokens))
        self._stats[f"finished_{reason}"] += 1
        since = (lambda t: None if t is None else t - h.t_submit)
        h._completion = Completion(
            request_id=h.request_id, prompt_token_ids=h.prompt, token_ids=tuple(h.tokens), text=h.shown,
            finish_reason=reason, usage=Usage(len(h.prompt), h.cached, len(h.tokens)),
            error=error if reason == "error" else None, ttft_s=since(h.t_first), admitted_s=since(h.t_admitted),
            completion_s=since(time.monotonic()))
        h._done.set()
        h._deltas.put(_END)

    def _loop(self) -> None:
        while True:
            with self._lock:
                for h in [h for h in list(self._running) + list(self._waiting) if h.cancel_requested]:
                    self._finish(h, "cancelled")
                if self._closed and not self._running and not self._waiting:
                    return
                while self._waiting and len(self._running) < self.max_concurrency:
                    self._running.append(self._waiting.popleft())
                    self._running[-1].t_admitted = time.monotonic()
                    self._slots_used += 1
                if not self._running:
                    self._lock.wait(0.05)
                    continue
                for h in list(self._running):
                    self._step(h)
            time.sleep(self.step_s)

    def _step(self, h: FakeHandle) -> None:
        limit = min(self._length(h), h.sampling.max_tokens, self.max_context - len(h.prompt))
        if len(h.tokens) >= limit:
            self._finish(h, "length" if limit < self._length(h) else "stop")
            return
        token = self._token(h, len(h.tokens))
        h.tokens.append(token)
        if h.t_first is None:
            h.t_first = time.monotonic()
        self._stats["generated_tokens"] += 1
        text = self.tokenizer.decode(h.tokens, skip_special_tokens=True)
        piece, h.shown = text[len(h.shown):], text
        lps = (TokenLogprob(token, -0.5, tuple((t, -0.5 - k) for k, t in enumerate(self._alphabet[:h.sampling.logprobs]))),) \
            if h.sampling.logprobs else ()
        h._deltas.put(TokenDelta((token,), piece, lps))
        if len(h.tokens) >= limit:
            self._finish(h, "length" if limit < self._length(h) else "stop")


@contextlib.contextmanager
def running_server(engine, *, token: str | None = None, close_engine: bool = False, **server_kwargs):
    """An `InferenceServer` on 127.0.0.1 (a free port) over `engine`, warmed up, and a client.
    Shuts the server down on exit; the engine is closed only when `close_engine`."""
    from server.app import InferenceServer
    from server.client import NInferClient

    srv = InferenceServer(lambda: engine, port=0, token=token, close_engine=close_engine, **server_kwargs)
    srv.start()
    srv.warm_up()
    client = NInferClient(srv.address, token=token, timeout=60.0)
    try:
        yield srv, client
    finally:
        client.close()
        srv.shutdown(grace_s=2.0)
