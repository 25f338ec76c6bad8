"""The byte string each token id decodes to, for byte-level BPE tokenizers.

A byte-level BPE vocabulary (GPT-2, Qwen) spells bytes as printable characters: the 188
printable Latin-1 bytes stand for themselves and the other 68 are shifted past U+00FF. The
`ByteLevel` decoder maps a token's characters back to bytes (a token with a character outside
that alphabet, e.g. an added token written in other scripts, contributes its UTF-8 bytes) and
decodes the concatenation of all tokens as UTF-8, replacing invalid sequences. So the text of
any id sequence is a function of per-id byte strings, which is what a streaming detokenizer
needs to work in constant time per token.
"""
from __future__ import annotations

import json
import random
from typing import AbstractSet

import tokenizers

_CHECK_SEQUENCES = 96
_CHECK_LENGTH = 12


def _byte_of_char() -> dict[str, int]:
    """The byte-level alphabet, inverted: character → byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table = {chr(b): b for b in printable}
    shifted = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + shifted)] = b
            shifted += 1
    return table


def _plain_byte_level(backend: tokenizers.Tokenizer) -> bool:
    """A BPE model whose only decoder is ByteLevel (no byte fallback, no other decoders)."""
    spec = json.loads(backend.to_str())
    decoder, model = spec.get("decoder") or {}, spec.get("model") or {}
    if decoder.get("type") == "Sequence":
        parts = decoder.get("decoders") or []
        decoder = parts[0] if len(parts) == 1 else {}
    return (decoder.get("type") == "ByteLevel" and model.get("type") == "BPE"
            and not model.get("byte_fallback", False))


def byte_pieces(backend: tokenizers.Tokenizer, skipped: AbstractSet[int]) -> tuple[bytes, ...] | None:
    """Per id, its bytes in `decode(..., skip_special_tokens=True)` (`skipped` ids: none), or
    None when the tokenizer is not plain byte-level BPE or the table disagrees with it."""
    if not _plain_byte_level(backend):
        return None
    byte_of = _byte_of_char()
    size = backend.get_vocab_size(with_added_tokens=True)
    pieces = []
    for idx in range(size):
        token = backend.id_to_token(idx)
        if token is None or idx in skipped:
            pieces.append(b"")
            continue
        try:
            pieces.append(bytes(byte_of[c] for c in token))
        except KeyError:  # outside the alphabet: the token's own UTF-8 bytes
            pieces.append(token.encode("utf-8"))
    pieces = tuple(pieces)
    return pieces if _agrees(backend, pieces, skipped) else None


def _agrees(backend: tokenizers.Tokenizer, pieces: tuple[bytes, ...], skipped: AbstractSet[int]) -> bool:
    """The table reproduces the tokenizer's own decode on sequences mixing random ids with
    every added token (fixed seed, so a tokenizer is judged the same way every time)."""
    rng = random.Random(0)
    added = sorted(backend.get_added_tokens_decoder())
    pool = list(range(len(pieces)))
    sequences = [[a] for a in added] + [[rng.choice(pool) for _ in range(_CHECK_LENGTH)]
                                        for _ in range(_CHECK_SEQUENCES)]
    if added:
        for seq in sequences[len(added):len(added) + _CHECK_SEQUENCES // 2]:
            seq[rng.randrange(len(seq))] = rng.choice(added)
    for seq in sequences:
        mine = b"".join(pieces[i] for i in seq).decode("utf-8", "replace")
        if mine != backend.decode(seq, skip_special_tokens=True):
            return False
    return True
