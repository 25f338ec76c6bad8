"""Token bitmasks: which ids a row may draw next (structured output, engine/grammar.py).

A row's mask is llguidance's layout: `ceil(V / 32)` little-endian uint32 words, id `t` allowed
when bit `t % 32` of word `t // 32` is set. `mask_logits` applies a batch of them inside a
compiled step, one row each (a free row's words are all ones), so the logits reach the host
already held to their grammars and a greedy constrained row is chosen by the batch's one argmax;
`allowed` is the same mask unpacked on the host (the speculative Verify path, the first token
after a prefill, the cost-model Program).
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

ALL = np.uint32(0xFFFFFFFF)  # a word of a row that is held to nothing


def words(vocab_size: int) -> int:
    """The uint32 words of one row's mask over a vocabulary of `vocab_size` ids."""
    return -(-vocab_size // 32)


def mask_logits(logits, bits):
    """`logits` `[B, V]` with every id its row's `bits` `[B, words(V)]` leaves out at -inf. The
    logits of allowed ids are passed through untouched, so a masked row's float32 values, cast to
    float64 on the host, equal the host's own masking of the same logits."""
    v = logits.shape[-1]
    ids = jnp.arange(v, dtype=jnp.uint32)
    word = jnp.take(bits, ids // 32, axis=1)
    allowed = ((word >> (ids % 32)) & 1).astype(bool)
    return jnp.where(allowed, logits, jnp.asarray(-jnp.inf, logits.dtype))


def allowed(bits: np.ndarray, vocab_size: int) -> np.ndarray:
    """`[V]` bool (or `[B, V]` for `[B, words]`): the ids a mask allows, on the host. A mask
    narrower than the vocabulary (a tokenizer smaller than the model's padded one) allows none of
    the ids past it."""
    bits = np.ascontiguousarray(bits, dtype="<u4")
    flat = np.unpackbits(bits.view(np.uint8).reshape(bits.shape[:-1] + (-1,)), axis=-1, bitorder="little")
    out = np.zeros(bits.shape[:-1] + (vocab_size,), bool)
    n = min(vocab_size, flat.shape[-1])
    out[..., :n] = flat[..., :n].astype(bool)
    return out


def fit(bits: np.ndarray, vocab_size: int) -> np.ndarray:
    """One row's words as `words(vocab_size)` uint32 (a shorter mask padded with zero words:
    nothing past it is allowed)."""
    bits = np.asarray(bits, "<u4")
    n = words(vocab_size)
    if bits.shape[-1] >= n:
        return bits[..., :n]
    return np.concatenate([bits, np.zeros(bits.shape[:-1] + (n - bits.shape[-1],), "<u4")], axis=-1)
