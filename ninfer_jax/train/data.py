"""Token windows for training: documents tokenised once, packed into one stream, cut into
fixed-length windows, served in a deterministic order per (seed, epoch).

Each document is followed by `<|endoftext|>` (id 1008), so the model learns where a document
ends: the engine stops at that id (an eos id of the built-in model). A window holds
`seq_len + 2` tokens: inputs are the first `seq_len`, the main head predicts the next token
and the MTP head the one after it, so every input position has both targets.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable

import numpy as np

END_OF_TEXT = "<|endoftext|>"


def encode_documents(tokenizer, texts: Iterable[str]) -> np.ndarray:
    """One int32 stream: each text's ids, then the end-of-text id. `tokenizer` is a
    `tokenizers.Tokenizer`."""
    eod = tokenizer.token_to_id(END_OF_TEXT)
    if eod is None:
        raise ValueError(f"the tokenizer has no {END_OF_TEXT!r} token")
    parts = []
    for enc in tokenizer.encode_batch(list(texts), add_special_tokens=False):
        parts.append(np.asarray(enc.ids, np.int32))
        parts.append(np.asarray([eod], np.int32))
    return np.concatenate(parts) if parts else np.zeros((0,), np.int32)


def windows(stream: np.ndarray, seq_len: int, offset: int = 0) -> np.ndarray:
    """Windows `[N, seq_len + 2]` starting at `offset`, `offset + seq_len`, ... (consecutive
    windows share their last two tokens, which are only targets in the first)."""
    n = (len(stream) - offset - 2) // seq_len
    if n <= 0:
        return np.zeros((0, seq_len + 2), np.int32)
    starts = offset + seq_len * np.arange(n)
    return stream[starts[:, None] + np.arange(seq_len + 2)[None, :]]


@dataclasses.dataclass
class Position:
    """Where the data stream stands: the epoch and the next batch within it (checkpointed)."""

    epoch: int = 0
    batch: int = 0

    def as_dict(self) -> dict:
        return {"epoch": self.epoch, "batch": self.batch}


class Batches:
    """Deterministic batches of windows: epoch `e` starts the windows at a random offset
    (so boundaries move between epochs) and visits them in a random order, both drawn from
    `np.random.default_rng([seed, e])`; the last incomplete batch of an epoch is dropped."""

    def __init__(self, stream: np.ndarray, seq_len: int, batch: int, seed: int, position: Position | None = None):
        self.stream, self.seq_len, self.batch, self.seed = stream, seq_len, batch, seed
        self.position = position or Position()
        self._epoch_cache: tuple[int, np.ndarray, np.ndarray] | None = None
        if self.batches_in_epoch(0) == 0:
            raise ValueError(f"{len(stream)} tokens give no batch of {batch} windows of {seq_len + 2}")

    def _epoch(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        if self._epoch_cache is None or self._epoch_cache[0] != epoch:
            rng = np.random.default_rng([self.seed, epoch])
            offset = int(rng.integers(self.seq_len)) if epoch else 0
            w = windows(self.stream, self.seq_len, offset)
            self._epoch_cache = (epoch, w, rng.permutation(len(w)))
        return self._epoch_cache[1], self._epoch_cache[2]

    def batches_in_epoch(self, epoch: int) -> int:
        return len(self._epoch(epoch)[0]) // self.batch

    def next(self) -> np.ndarray:
        """The batch `[batch, seq_len + 2]` at the current position, and advance."""
        if self.position.batch >= self.batches_in_epoch(self.position.epoch):
            self.position = Position(self.position.epoch + 1, 0)
        w, order = self._epoch(self.position.epoch)
        b = self.position.batch
        out = w[order[b * self.batch:(b + 1) * self.batch]]
        self.position = Position(self.position.epoch, b + 1)
        return out
