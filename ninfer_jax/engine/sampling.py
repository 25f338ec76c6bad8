"""Token choice for one row: penalties, temperature, top-k, top-p, min-p, seeded draws.

Randomness is a pure function of (seed, logical position, purpose) (PAUSE-5): the draw for
position p never depends on batching, chunking, cache hits or pauses, so a replayed or reused
request picks exactly the tokens of a cold run.
"""
from __future__ import annotations

from collections import Counter
from typing import Sequence

import numpy as np

from ninfer_jax.engine.types import SamplingParams, TokenLogprob

PURPOSE_SAMPLE = 1  # the token draw; other purposes (speculative acceptance...) get their own ids


def uniform(seed: int, position: int, purpose: int = PURPOSE_SAMPLE) -> float:
    """The uniform draw in [0, 1) for (seed, position, purpose)."""
    return float(np.random.default_rng((seed, position, purpose)).random())


def plain_greedy(sp: SamplingParams, masked: bool = False) -> bool:
    """Greedy with nothing that reshapes or reports the distribution: the token is the argmax of
    the raw logits, so a batch of such rows is chosen by one argmax (`greedy_rows`). `masked`: the
    logits are held to the row's grammar already, so a structured output is no reshaping."""
    return (sp.greedy and not sp.logprobs and sp.repetition_penalty == 1.0 and not sp.presence_penalty
            and not sp.frequency_penalty and not sp.forced_output and not sp.min_tokens
            and (masked or sp.structured_output is None))


def held_ids(stop_ids, sp: SamplingParams, output: Sequence[int]):
    """The ids a row may not draw at its next position: its stop ids (EOS included) while fewer
    than `min_tokens` tokens are out."""
    return stop_ids if len(output) < sp.min_tokens else ()


def greedy_rows(logits: np.ndarray) -> list[int]:
    """The argmax of each row of `[n, V]` logits: what `sample` picks for a `plain_greedy` row
    (the float64 cast there is exact, so ties fall on the same first index)."""
    return np.argmax(np.asarray(logits, np.float32), axis=1).tolist()


def _penalised(logits: np.ndarray, sp: SamplingParams, prompt: Sequence[int], output: Sequence[int],
               held=(), allowed: np.ndarray | None = None, grammar: bool = False) -> np.ndarray:
    x = logits.astype(np.float64, copy=True)
    if allowed is not None:  # structured output: what the grammar does not allow next
        x[~allowed] = -np.inf
    if held:  # min_tokens: these cannot be drawn yet
        ids = np.fromiter(held, dtype=np.int64)
        kept = x[ids]
        x[ids] = -np.inf
        if (grammar or allowed is not None) and not np.isfinite(x).any():
            x[ids] = kept  # the grammar allows nothing but a stop: it is complete, and ends here
    if sp.repetition_penalty != 1.0:
        seen = np.fromiter(set(prompt) | set(output), dtype=np.int64)
        if seen.size:
            vals = x[seen]
            x[seen] = np.where(vals > 0, vals / sp.repetition_penalty, vals * sp.repetition_penalty)
    if (sp.presence_penalty or sp.frequency_penalty) and output:
        counts = Counter(output)
        ids = np.fromiter(counts.keys(), dtype=np.int64)
        n = np.fromiter(counts.values(), dtype=np.float64)
        x[ids] -= sp.frequency_penalty * n + sp.presence_penalty
    return x


def _log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


def _entry(x: np.ndarray, token: int, top: int) -> TokenLogprob:
    """The logprob entry of `token` under the penalised logits `x`, with the `top` best."""
    lp = _log_softmax(x)
    top_ids = np.argsort(-lp, kind="stable")[:top]
    return TokenLogprob(token, float(lp[token]), tuple((int(i), float(lp[i])) for i in top_ids))


def prompt_entry(logits: np.ndarray, token: int, top: int) -> TokenLogprob:
    """A prompt token's entry (prompt_logprobs): its logprob under the raw distribution (no
    penalty, no mask) and the `top` best."""
    x = np.asarray(logits, np.float64)
    entry = _entry(x, token, top)
    return TokenLogprob(entry.token_id, entry.logprob, entry.top, rank=1 + int(np.sum(x > x[token])))


def logprob_of(logits: np.ndarray, sp: SamplingParams, token: int, prompt: Sequence[int],
               output: Sequence[int]) -> TokenLogprob:
    """The logprob entry of a token chosen elsewhere (a forced output), as `sample` reports it."""
    return _entry(_penalised(logits, sp, prompt, output), token, sp.logprobs)


def sample(logits: np.ndarray, sp: SamplingParams, seed: int, position: int,
           prompt: Sequence[int], output: Sequence[int], held=(),
           allowed: np.ndarray | None = None, grammar: bool = False) -> tuple[int, TokenLogprob | None]:
    """Choose the token at `position` from `logits` `[V]`; also its logprob entry when asked.
    `held`: ids that may not be drawn here (`held_ids`: min_tokens); `allowed`: `[V]` bool, the
    tokens a structured output's grammar allows here (None: all); `grammar`: the logits are held
    to the row's grammar already (its masked ids at -inf: the compiled mask step).

    Logprobs are those of the penalised distribution (masked ids at -inf) before temperature and
    truncation.
    """
    x = _penalised(logits, sp, prompt, output, held, allowed, grammar)
    if sp.greedy:
        token = int(np.argmax(x))
    else:
        z = x / sp.temperature
        probs = np.exp(z - z.max())
        keep = np.ones_like(probs, dtype=bool)
        if sp.top_k and sp.top_k < probs.size:
            kth = np.partition(probs, -sp.top_k)[-sp.top_k]
            keep &= probs >= kth
        if sp.min_p > 0:
            keep &= probs >= sp.min_p * probs.max()
        if sp.top_p < 1.0:
            order = np.argsort(-probs, kind="stable")
            p = probs[order] / probs.sum()
            cut = int(np.searchsorted(np.cumsum(p), sp.top_p)) + 1  # smallest set reaching top_p
            top = np.zeros_like(keep)
            top[order[:cut]] = True
            keep &= top
        probs = np.where(keep, probs, 0.0)
        cdf = np.cumsum(probs)
        token = int(np.searchsorted(cdf, uniform(seed, position) * cdf[-1], side="right"))
        token = min(token, probs.size - 1)
    return token, (_entry(x, token, sp.logprobs) if sp.logprobs else None)
