"""Public request and result types: `SamplingParams`, `Completion`, `Usage`, `TokenDelta`.

Validation happens here, at the boundary (doctrine 3, docs/rules.md): a bad value is a
`RequestError` naming the field, raised before the request reaches the engine.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

from ninfer_jax.engine.grammar import StructuredOutput
from ninfer_jax.errors import RequestError

FINISH_REASONS = ("stop", "length", "cancelled", "error")


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens. Temperature 0 is greedy.

    Randomness is a pure function of (seed, logical position, purpose) (PAUSE-5), so a replay
    after a pause, or a cache hit, draws exactly what a cold run draws. `seed=None` gets a
    random seed at submission, recorded on the request.
    """

    temperature: float = 1.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int = 128
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int = 0  # how many top logprobs to return per token (0 = none)
    # Until this many tokens are out, EOS and the stop ids cannot be drawn (their logits are
    # masked) and no stop string ends the request (vLLM's min_tokens).
    min_tokens: int = 0
    # The stop string (or a stop id's text) that ended the request stays in its text.
    include_stop_str_in_output: bool = False
    # The output must match this grammar (engine/grammar.py): the tokens it does not allow next
    # are masked out of every draw, EOS included until the grammar is complete.
    structured_output: StructuredOutput | None = None
    # The logprob of every prompt token after the first (and this many top ones) under the model's
    # raw distribution (vLLM's prompt_logprobs); the request then prefills its whole prompt itself,
    # reusing nothing, as every position's logits are needed. None: not asked.
    prompt_logprobs: int | None = None
    # Replay only: the engine emits exactly these tokens, through the normal decode path, and
    # ends ("stop") after the last one (or at max_tokens / max_context). No sampling, no stop
    # strings or eos: a trace replayed this way ends where the recorded request ended.
    forced_output: tuple[int, ...] = ()

    def __post_init__(self):
        def bad(field, why):
            raise RequestError(f"sampling.{field}: {why}")

        if not isinstance(self.temperature, (int, float)) or not 0 <= self.temperature <= 100:
            bad("temperature", f"must lie in [0, 100], got {self.temperature!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            bad("top_k", f"must be a non-negative int (0 = off), got {self.top_k!r}")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            bad("top_p", f"must lie in (0, 1], got {self.top_p!r}")
        if not isinstance(self.min_p, (int, float)) or not 0 <= self.min_p <= 1:
            bad("min_p", f"must lie in [0, 1], got {self.min_p!r}")
        if not isinstance(self.repetition_penalty, (int, float)) or not 0 < self.repetition_penalty <= 10:
            bad("repetition_penalty", f"must lie in (0, 10], got {self.repetition_penalty!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not -2 <= value <= 2:
                bad(name, f"must lie in [-2, 2], got {value!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or not 0 <= self.seed < 2 ** 63):
            bad("seed", f"must be an int in [0, 2**63), got {self.seed!r}")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            bad("max_tokens", f"must be a positive int, got {self.max_tokens!r}")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        for name in ("stop", "stop_token_ids"):
            try:
                object.__setattr__(self, name, tuple(getattr(self, name)))
            except TypeError:
                bad(name, f"must be a list, got {getattr(self, name)!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            bad("stop", "must be non-empty strings")
        if len(self.stop) > 16:
            bad("stop", f"at most 16 stop strings, got {len(self.stop)}")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            bad("stop_token_ids", "must be non-negative ints")
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            bad("min_tokens", f"must be a non-negative int, got {self.min_tokens!r}")
        if isinstance(self.max_tokens, int) and self.min_tokens > self.max_tokens:
            bad("min_tokens", f"must not exceed max_tokens ({self.max_tokens}), got {self.min_tokens}")
        if not isinstance(self.include_stop_str_in_output, bool):
            bad("include_stop_str_in_output", f"must be a bool, got {self.include_stop_str_in_output!r}")
        if self.structured_output is not None and not isinstance(self.structured_output, StructuredOutput):
            bad("structured_output", f"must be a StructuredOutput, got {type(self.structured_output).__name__}")
        if self.prompt_logprobs is not None and (not isinstance(self.prompt_logprobs, int)
                                                 or not 0 <= self.prompt_logprobs <= 20):
            bad("prompt_logprobs", f"must be an int in [0, 20], got {self.prompt_logprobs!r}")
        if not isinstance(self.logprobs, int) or not 0 <= self.logprobs <= 20:
            bad("logprobs", f"must be an int in [0, 20], got {self.logprobs!r}")
        try:
            object.__setattr__(self, "forced_output", tuple(self.forced_output))
        except TypeError:
            bad("forced_output", f"must be a list of token ids, got {self.forced_output!r}")
        if any(not isinstance(t, int) or isinstance(t, bool) or t < 0 for t in self.forced_output):
            bad("forced_output", "must be non-negative ints")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclasses.dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    cached_tokens: int  # prompt tokens served from the context cache instead of prefilled
    completion_tokens: int
    # The furthest prompt frontier this request saved to the cache (a capture it kept; 0: none):
    # what Anthropic's usage calls cache creation, beyond `cached_tokens`.
    saved_tokens: int = 0


@dataclasses.dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token id, logprob), best first
    rank: int | None = None  # 1 + the tokens more likely than it (prompt_logprobs entries)


@dataclasses.dataclass(frozen=True)
class TokenDelta:
    """One streamed step: new token ids and the text they completed (may be empty while a
    multi-byte character or a possible stop string is pending)."""

    token_ids: tuple[int, ...]
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclasses.dataclass(frozen=True)
class Completion:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    text: str
    finish_reason: str  # one of FINISH_REASONS
    usage: Usage
    logprobs: tuple[TokenLogprob, ...] = ()
    error: str | None = None  # set when finish_reason == "error"
    # With SamplingParams.prompt_logprobs: one entry per prompt token, None for the first (nothing
    # predicts it); else None.
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None
    stop_sequence: str | None = None  # the stop string that ended the output (finish "stop"), if one did
    # First-event and latency figures (OBS-1, OBS-2, OBS-4), all measured from submission on the
    # Program's clock (modelled seconds on SimProgram, wall seconds on the real model). Each event
    # is recorded once: a pause does not restart them (OBS-2, PAUSE-1). None: the event never happened.
    ttft_s: float | None = None  # submit → first token
    # The largest gap between two consecutive output tokens; None with fewer than two. OBS-3: a
    # low TTFT can hide a long gap after a pause.
    max_output_gap_s: float | None = None
    admitted_s: float | None = None  # submit → first admission (first bind to a lane)
    completion_s: float | None = None  # submit → finish (stop, length, cancel or error)
    # The recovery point its first admission bound from: {"kind" (E, input, anchor, shared),
    # "input_kind" (an input point's typed R kind, else None), "frontier" (tokens reused),
    # "takeover", "private"}; None when nothing was reused. Reporting only.
    hit: dict | None = None
    pauses: int = 0  # times it was paused (preempted) and resumed or ended while paused
    # The prompt frontiers it offered the cache as save points (its SavePoints, an automatic
    # branch point included; E, its end, is always one besides). Reporting only: the offline
    # optimum of `ninfer trace` (bench/offline_optimum.py) places StateImages only there.
    save_frontiers: tuple[int, ...] = ()


def check_prompt(token_ids: Sequence[int], vocab_size: int, max_context: int) -> tuple[int, ...]:
    """A prompt's token ids, validated against the vocabulary and the context limit (CFG-1)."""
    ids = tuple(token_ids)
    if not ids:
        raise RequestError("prompt: empty")
    if not (set(map(type, ids)) == {int} and min(ids) >= 0 and max(ids) < vocab_size):
        # the common case is checked at C speed above; here the first offender is named
        for t in ids:
            if not isinstance(t, int) or isinstance(t, bool):
                raise RequestError(f"prompt: token ids must be ints, got {t!r}")
            if not 0 <= t < vocab_size:
                raise RequestError(f"prompt: token id {t} outside the vocabulary [0, {vocab_size})")
    if len(ids) > max_context:
        raise RequestError(f"prompt: {len(ids)} tokens exceed max_context={max_context}")
    return ids
