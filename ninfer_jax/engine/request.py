"""Request records (the engine side of a request), the caller's `RequestHandle` and the engine's
`Outbox` behind it.

The record holds what the spec's Engine request record owns: the original ticket, input and
output, budget (`max_tokens`, `max_context`), the cancel flag and the first-event times; plus
the device binding the Program gave it (lane, StateImage slot, Main KV pages) and its
`execution_frontier` (`fed`: tokens whose KV and state exist). The binding can be dropped and
rebuilt by Replay (G-5); input, output and seed never change.
"""
from __future__ import annotations

import dataclasses
import queue
import threading
from typing import Iterator

import ledger
from ninfer_jax.engine.detok import Detokenizer
from ninfer_jax.engine.types import Completion, SamplingParams, TokenDelta, TokenLogprob, Usage

QUEUED, PREFILL, DECODE, PAUSED, FINISHED = "queued", "prefill", "decode", "paused", "finished"


class Outbox:
    """The engine thread's end of a request's handle: each delta is pushed as it is produced,
    then the completion, once; the caller's `RequestHandle` reads them."""

    def __init__(self):
        self.events: queue.SimpleQueue = queue.SimpleQueue()  # one engine-thread put per token
        self.completion: Completion | None = None
        self.finished = threading.Event()

    def push(self, delta: TokenDelta) -> None:
        self.events.put(delta)

    def finish(self, completion: Completion) -> None:
        self.events.put(completion)
        self.completion = completion
        self.finished.set()

    def done(self) -> bool:
        return self.finished.is_set()


class RequestHandle:
    """What `Engine.submit` returns: stream deltas, wait for the result, or cancel."""

    def __init__(self, request_id: str, cancel_fn, outbox: Outbox | None = None):
        self.request_id = request_id
        self._outbox = outbox if outbox is not None else Outbox()  # the engine thread writes it
        self._cancel_fn = cancel_fn

    def stream(self) -> Iterator[TokenDelta]:
        """Deltas as tokens are produced; ends when the request finishes."""
        events = self._outbox.events
        while True:
            item = events.get()
            if isinstance(item, Completion):
                events.put(item)  # leave it for result()
                return
            yield item

    def result(self, timeout: float | None = None) -> Completion:
        """Block until the request finishes; the whole `Completion`."""
        if not self._outbox.finished.wait(timeout):
            raise TimeoutError(f"request {self.request_id} not finished after {timeout}s")
        return self._outbox.completion

    def done(self) -> bool:
        return self._outbox.done()

    def cancel(self) -> None:
        """Ask the engine to cancel; idempotent. The result then reports finish_reason 'cancelled'."""
        if not self._outbox.done():
            self._cancel_fn(self.request_id)


@dataclasses.dataclass(eq=False)
class Request:
    ticket: int  # original ticket: FIFO order, kept across pauses (SCH-2, SCH-6)
    request_id: str
    prompt: tuple[int, ...]
    sampling: SamplingParams
    seed: int
    max_context: int
    handle: RequestHandle  # the caller's side
    outbox: Outbox  # the engine's side of the same handle: deltas and the completion go here
    detok: Detokenizer
    stop_ids: frozenset[int]
    saves: tuple = ()  # SavePoints from the frontend, by frontier (SAVE-1)
    splits: tuple[int, ...] = ()  # frontiers where a prefill chunk must end (REC-8)
    raw: bool = False  # no rendering chose its structure (its branch point never yields to markers: SH-6)
    session: object = None
    media: object = None  # engine/media.py RequestMedia: its images and videos, positions, media identity
    matcher: object = None  # engine/grammar.py Matcher of its structured output: at its committed output
    next_allowed: object = None  # its mask for the next token, computed while the step ran (execution.py)
    prompt_lps: list | None = None  # prompt_logprobs: the entries so far (the first prompt token's is None)
    encoded: set = dataclasses.field(default_factory=set)  # media keys the tower encoded for it (PAUSE-6)
    output: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[TokenLogprob] = dataclasses.field(default_factory=list)
    phase: str = QUEUED
    fed: int = 0  # execution_frontier
    pages: list[int] = dataclasses.field(default_factory=list)  # Main KV units, logical order
    page_objects: list[int] = dataclasses.field(default_factory=list)
    # The MTP backend KV pool's units and objects (speculative decoding), one per Main KV page.
    mtp_pages: list[int] = dataclasses.field(default_factory=list)
    mtp_page_objects: list[int] = dataclasses.field(default_factory=list)
    slot: int | None = None
    slot_object: int | None = None
    computed: int = 0  # the furthest frontier ever computed: recomputing below it is Replay (OBS-1)
    paused_route: str | None = None  # a preempt.Route ("snapshot" | "replay") while paused (PAUSE-2)
    recovery_permit: int | None = None  # the full recovery permit it holds (RES-5, SCH-7)
    recovery_since: float = 0.0
    bound: bool = False  # the cache policy knows it (bound to a record until it ends, PAUSE-1)
    cancel_requested: bool = False
    cached_tokens: int = 0
    hit: dict | None = None  # the recovery point its first admission bound from (reuse.hit_of)
    pauses: int = 0  # times it was paused (preempted), by either route
    saved_tokens: int = 0  # the furthest prompt frontier this request's captures kept (Usage.saved_tokens)
    finish_reason: str | None = None
    error: str | None = None
    t_submit: float = 0.0  # on the Program's clock
    t_admitted: float | None = None
    t_first_token: float | None = None
    t_last_token: float | None = None
    max_gap: float = 0.0
    ident: object = dataclasses.field(default=None, repr=False)  # identity of prompt + output, cached
    wait_seen: object = dataclasses.field(default=None, repr=False)  # cache index at the last failed wait
    t_finished: float | None = None  # on the Program's clock: when the request ended (OBS-4)

    @property
    def text(self) -> str:
        """The output text released so far (the streamed deltas, joined)."""
        return self.detok.sent

    @property
    def key(self) -> tuple:
        """This request's holder key on ledger objects: its active execution (docs/cache_policy.md)."""
        return ledger.seq_holder(self.ticket)

    @property
    def replaying(self) -> bool:
        """Recomputing what it had computed before a pause (PAUSE-5); new work is prefill."""
        return self.fed < self.computed

    @property
    def target(self) -> tuple[int, ...]:
        """Tokens whose KV/state must exist before decoding: the prompt, plus every output
        token but the last (which the next decode step feeds)."""
        return self.prompt + tuple(self.output[:-1])

    @property
    def objects(self) -> list[int]:
        return (self.page_objects + self.mtp_page_objects
                + ([self.slot_object] if self.slot_object is not None else []))

    @property
    def logits_from(self) -> int | None:
        """The frontier its prefill must start from at the latest: with prompt_logprobs still to
        record, the position whose logits give the next entry; None when anything goes."""
        if self.prompt_lps is None or len(self.prompt_lps) >= len(self.prompt):
            return None
        return len(self.prompt_lps) - 1

    def completion(self) -> Completion:
        def since_submit(t: float | None) -> float | None:  # OBS-2: first-event times from submission
            return None if t is None else t - self.t_submit

        return Completion(
            request_id=self.request_id, prompt_token_ids=self.prompt, token_ids=tuple(self.output),
            text=self.text, finish_reason=self.finish_reason,
            usage=Usage(prompt_tokens=len(self.prompt), cached_tokens=self.cached_tokens,
                        completion_tokens=len(self.output), saved_tokens=self.saved_tokens),
            logprobs=tuple(self.logprobs), error=self.error,
            prompt_logprobs=tuple(self.prompt_lps) if self.prompt_lps is not None else None,
            stop_sequence=getattr(self.detok, "stop_hit", None),
            ttft_s=since_submit(self.t_first_token),
            max_output_gap_s=self.max_gap if len(self.output) >= 2 else None,  # OBS-3, OBS-4
            admitted_s=since_submit(self.t_admitted),
            completion_s=since_submit(self.t_finished), hit=self.hit, pauses=self.pauses,
            save_frontiers=tuple(s.frontier for s in self.saves))
