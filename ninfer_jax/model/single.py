"""One sequence through the paged steps: chunked prefill, then decode.

The smallest real user of the step functions — what `ninfer generate` runs until the engine
(scheduler, ledger-backed pools, batching) takes over, and what the oracle tests use to check
greedy tokens through the cached path. Pages are laid out linearly for the one request.
"""
from __future__ import annotations

import math
from typing import Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np

from ninfer_jax.errors import RequestError
from ninfer_jax.model.compiled import CompiledSteps
from ninfer_jax.model.pools import PAGE_SIZE, init_pools


def sample(logits: np.ndarray, temperature: float, seed: int, position: int) -> int:
    """Greedy at temperature 0; otherwise a draw that depends only on (seed, position)."""
    if temperature <= 0:
        return int(np.argmax(logits))
    key = jax.random.fold_in(jax.random.key(seed), position)
    return int(jax.random.categorical(key, jnp.asarray(logits, jnp.float32) / temperature))


def generate(steps: CompiledSteps, prompt: Iterable[int], max_tokens: int, *, max_context: int = 1024,
             chunk: int = 64, temperature: float = 0.0, seed: int = 0, stop_ids: Iterable[int] = (),
             on_token: Callable[[int], None] | None = None) -> list[int]:
    """Generate up to `max_tokens` after `prompt`; stops early at a token in `stop_ids`."""
    cfg = steps.model.config
    prompt = [int(t) for t in prompt]
    if not prompt:
        raise RequestError("the prompt is empty")
    if any(not 0 <= t < cfg.vocab_size for t in prompt):
        raise RequestError(f"prompt token ids must lie in [0, {cfg.vocab_size})")
    if len(prompt) + max_tokens > max_context:
        raise RequestError(f"prompt ({len(prompt)}) + max_tokens ({max_tokens}) exceeds max_context ({max_context})")
    pages = math.ceil(max_context / PAGE_SIZE)
    kv, state = init_pools(cfg, pages, 1, steps.model.dtype, steps.backend)
    page_table = jnp.arange(pages, dtype=jnp.int32)[None]
    slot = jnp.zeros((1,), jnp.int32)

    logits = None
    for start in range(0, len(prompt), chunk):
        piece = prompt[start:start + chunk]
        tokens = np.zeros((1, chunk), np.int32)
        tokens[0, :len(piece)] = piece
        logits, _, kv, state = steps.prefill(kv, state, jnp.asarray(tokens), jnp.array([start], jnp.int32),
                                             jnp.array([len(piece)], jnp.int32), page_table, slot)
    out: list[int] = []
    stop = set(stop_ids)
    position = len(prompt)
    while True:
        token = sample(np.asarray(logits[0]), temperature, seed, position)
        out.append(token)
        if on_token is not None:
            on_token(token)
        if token in stop or len(out) >= max_tokens:
            return out
        logits, _, kv, state = steps.decode(kv, state, jnp.array([token], jnp.int32),
                                            jnp.array([position], jnp.int32), page_table, slot)
        position += 1
