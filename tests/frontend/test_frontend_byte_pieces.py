"""`Tokenizer.byte_pieces`: per-id bytes offered only when they reproduce the tokenizer's own
decode (the streaming detokenizer's fast path relies on them, engine/detok.py)."""
from __future__ import annotations

import random

from tokenizers import AddedToken, Tokenizer as HFTokenizer, decoders, models, pre_tokenizers

from ninfer_jax.frontend import Tokenizer
from ninfer_jax.frontend.byte_pieces import byte_pieces


def _joined(pieces, ids) -> str:
    return b"".join(pieces[i] for i in ids).decode("utf-8", "replace")


def test_builtin_pieces_reproduce_decode_on_random_sequences():
    tok = Tokenizer.builtin()
    pieces = tok.byte_pieces()
    assert pieces is not None and len(pieces) == tok.vocab_size
    rng = random.Random(3)
    for _ in range(300):
        ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randint(1, 40))]
        assert _joined(pieces, ids) == tok.decode(ids, skip_special_tokens=True)
    assert all(pieces[i] == b"" for i in tok.special_token_ids)  # dropped, as the engine decodes
    assert pieces[tok.special_tokens["<think>"]] == b"<think>"  # not special: it stays in the text


def test_a_folder_tokenizer_with_non_ascii_added_tokens(hf_folder):
    tok = Tokenizer.from_folder(hf_folder)
    tok.backend.add_tokens([AddedToken("«東京»", normalized=False), AddedToken("zz", normalized=False)])
    tok._pieces = False  # rebuilt for the grown vocabulary
    pieces = tok.byte_pieces()
    assert pieces is not None
    ids = tok.encode("hello «東京» world zz") + [tok.vocab_size - 2]
    assert _joined(pieces, ids) == tok.decode(ids, skip_special_tokens=True)


def test_other_decoders_are_not_offered_a_table():
    vocab = {"<unk>": 0, "▁hello": 1, "▁world": 2}
    meta = HFTokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    meta.pre_tokenizer = pre_tokenizers.Metaspace()
    meta.decoder = decoders.Metaspace()
    assert byte_pieces(meta, frozenset()) is None
    # A byte-level BPE with a second decoder is not a plain concatenation either.
    tok = Tokenizer.builtin().backend
    clone = HFTokenizer.from_str(tok.to_str())
    clone.decoder = decoders.Sequence([decoders.ByteLevel(), decoders.Strip(content=" ", left=1)])
    assert byte_pieces(clone, frozenset()) is None
