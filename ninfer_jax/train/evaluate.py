"""Held-out figures of a model with an MTP head, from its files: the perplexity of the main head
and the top-1 accuracy of the MTP head (token t+2), over the held-out split of the training
corpus cut into the training windows' length. Used by `ninfer bench model` and the tests."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ninfer_jax.model.modules import HybridLM
from ninfer_jax.model.weights import mtp_params

WINDOW = 128  # the training windows' length (scripts/train_builtin.py --seq_len)


def heldout_windows(tokenizer, documents, window: int = WINDOW) -> np.ndarray:
    """The documents tokenised, each followed by <|endoftext|>, cut into `[n, window]`."""
    ids: list[int] = []
    eot = tokenizer.special_tokens["<|endoftext|>"]
    for d in documents:
        ids += tokenizer.encode(d.text) + [eot]
    return np.asarray(ids[:len(ids) // window * window], np.int32).reshape(-1, window)


def heldout_figures(model, windows: np.ndarray) -> dict:
    """`heldout_perplexity` (next token) and `mtp_top1` (the MTP head's argmax is token t+2) of a
    loaded `Model` with its MTP tensors, over `windows`."""
    cfg = model.config
    lm = HybridLM(cfg, model.params, mtp_params(model.mtp, cfg))

    @jax.jit
    def sums(w):
        logits, hidden = lm(w)
        nll = -jnp.take_along_axis(jax.nn.log_softmax(logits[:-1]), w[1:, None], axis=1)[:, 0]
        hits = jnp.argmax(lm.mtp_logits(hidden[:-2], w[1:-1]), axis=-1) == w[2:]
        return nll.sum(), hits.sum()

    nll, hits = 0.0, 0
    for w in windows:
        a, b = sums(jnp.asarray(w))
        nll, hits = nll + float(a), hits + int(b)
    n, width = windows.shape
    return {"heldout_windows": int(n), "heldout_perplexity": float(np.exp(nll / (n * (width - 1)))),
            "mtp_top1": hits / (n * (width - 2))}
