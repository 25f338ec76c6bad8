"""Windowed incremental detokenisation releases exactly what decoding every token each time
released (the text of the full decode, with the same holds for stop strings and incomplete
characters), for byte-level, Metaspace and WordPiece decoders."""
from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer as HFTokenizer, decoders, models, pre_tokenizers

from ninfer_jax.engine.detok import Detokenizer
from ninfer_jax.frontend import Tokenizer


class FullDecode:
    """The reference: the whole output decoded at every token."""

    def __init__(self, decode, stop=()):
        self.decode, self.stop, self.ids, self.sent, self.stopped = decode, tuple(stop), [], "", False

    def push(self, token):
        self.ids.append(token)
        full = self.decode(self.ids)
        if self.stop:
            start = max(0, len(self.sent) - max(len(s) for s in self.stop))
            hits = [i for i in (full.find(s, start) for s in self.stop) if i >= 0]
            if hits:
                self.stopped = True
                return self._release(full[:min(hits)])
        hold = 1 if full.endswith("\ufffd") else 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(full)), hold, -1):
                if full.endswith(s[:n]):
                    hold = n
                    break
        return self._release(full[:len(full) - hold])

    def flush(self):
        return "" if self.stopped else self._release(self.decode(self.ids))

    def _release(self, text):
        if len(text) <= len(self.sent):
            return ""
        new, self.sent = text[len(self.sent):], text
        return new


def _metaspace():
    vocab = {"<unk>": 0, "▁hello": 1, "▁world": 2, "▁": 3, "lo": 4, "▁the": 5, "s": 6, "é": 7, "▁x": 8}
    tok = HFTokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    return lambda ids: tok.decode(list(ids))


def _wordpiece():
    vocab = {"[UNK]": 0, "hello": 1, "##lo": 2, ",": 3, "world": 4, ".": 5, "the": 6, "##s": 7, "'": 8, "t": 9}
    tok = HFTokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.decoder = decoders.WordPiece(cleanup=True)
    return lambda ids: tok.decode(list(ids))


def _builtin():
    t = Tokenizer.builtin()
    return t.decode


def _builtin_engine():
    """What the engine streams: special tokens skipped (Engine.tokenizer_decode)."""
    t = Tokenizer.builtin()
    return lambda ids: t.decode(ids, skip_special_tokens=True)


DECODERS = {"byte_level": (_builtin, 1024), "metaspace": (_metaspace, 9), "wordpiece": (_wordpiece, 10),
            "byte_pieces": (_builtin_engine, 1024)}


def _detok(kind, decode, stop):
    """The detokenizer under test: "byte_pieces" is the byte-level path with the per-id bytes."""
    pieces = Tokenizer.builtin().byte_pieces() if kind == "byte_pieces" else None
    if kind == "byte_pieces":
        assert pieces is not None
    return Detokenizer(decode, stop, pieces=pieces)


@pytest.mark.parametrize("kind", sorted(DECODERS))
@pytest.mark.parametrize("stop", [(), ("th",), ("e w", "lo")])
def test_windowed_detok_releases_what_the_full_decode_releases(kind, stop):
    make, vocab = DECODERS[kind]
    decode = make()
    rng = random.Random(f"{kind}{stop}")  # str seeds are deterministic
    for trial in range(40):
        ids = [rng.randrange(vocab) for _ in range(rng.randint(1, 60))]
        got, want = _detok(kind, decode, stop), FullDecode(decode, stop)
        for t in ids:
            assert got.push(t) == want.push(t), (kind, ids)
            assert got.stopped == want.stopped
            if want.stopped:
                break
        assert got.flush() == want.flush()
        assert got.sent == want.sent
        if not stop:
            assert got.sent == decode(ids)
        if kind == "byte_level":
            assert got._windowed  # the fast path held: no fallback to decoding everything


@pytest.mark.parametrize("kind", ["byte_level", "byte_pieces"])
def test_windowed_detok_holds_a_split_multibyte_character(kind):
    t = Tokenizer.builtin()
    ids = t.encode("naïve café — 東京 ok")
    d = _detok(kind, _builtin_engine(), ())
    pushed = [d.push(i) for i in ids]
    out = "".join(pushed) + d.flush()
    assert out == t.decode(ids) and "\ufffd" not in out
    assert "" in pushed  # some character was split over tokens and held


def test_byte_pieces_end_on_an_incomplete_character_as_the_full_decode_does():
    t = Tokenizer.builtin()
    ids = t.encode("東")[:-1]  # the character's last byte missing
    d = _detok("byte_pieces", _builtin_engine(), ())
    assert "".join(d.push(i) for i in ids) == ""
    assert d.flush() == t.decode(ids) == "\ufffd"


@pytest.mark.parametrize("kind", ["byte_level", "byte_pieces"])
@pytest.mark.parametrize("stop", [(), ("\n\nQ:", "zq")])
def test_long_outputs_keep_only_the_tail_a_stop_can_span(kind, stop):
    """Past a few hundred characters the settled text is trimmed; releases stay the reference's."""
    decode = (_builtin_engine if kind == "byte_pieces" else _builtin)()
    rng = random.Random(5)
    ids = [rng.randrange(1024) for _ in range(1500)]
    got, want = _detok(kind, decode, stop), FullDecode(decode, stop)
    for t in ids:
        assert got.push(t) == want.push(t)
        if want.stopped:
            break
    assert got.flush() == want.flush() and got.sent == want.sent
    assert got._base > 0 and len(got._recent) < 600  # trimmed: constant work per token


def test_text_held_for_a_possible_stop_string_is_output_when_a_stop_token_ends_the_request(tiny_model):
    """Issue 36: a stop token ends the request while the detokenizer holds the last token's text
    (it could still have grown into the stop string, which starts with it): that text is output,
    streamed and in the completion, as the full decode of the output gives it."""
    from engine_helpers import make_engine, run_until_done
    from ninfer_jax import SamplingParams

    engine = make_engine(tiny_model)
    tok = engine.tokenizer
    prompt = tok.encode("Once upon a time")
    free = engine.generate(prompt, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)).token_ids
    k = next(i for i, t in enumerate(free) if i >= 2 and tok.decode([t], skip_special_tokens=True).strip())
    piece = tok.decode([free[k]], skip_special_tokens=True)
    # The stop id's own text is output only with include_stop_str_in_output (vLLM's meaning; without
    # it the held text before it is output: tests/engine/test_engine_stop_params.py).
    sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop_token_ids=(free[k],),
                        stop=(piece + "\u2603never",), include_stop_str_in_output=True)
    h = engine.submit(prompt, sp)
    run_until_done(engine, [h])
    got = h.result()
    assert got.finish_reason == "stop" and got.token_ids == tuple(free[:free.index(free[k]) + 1])
    want = tok.decode(list(got.token_ids), skip_special_tokens=True)
    assert want.endswith(piece) and got.text == want
    assert "".join(d.text for d in h.stream()) == want
