"""Incremental detokenisation with stop strings, for streaming.

Text is released only when it is final: not while the last character is an incomplete
multi-byte sequence, and not while its tail could still become a stop string. A stop string
ends the request; the text before it is the output (the stop string itself too with
`include_stop`). With `min_tokens`, stop strings count only from the text of that token on
(vLLM's min_tokens): before it, text is released as it settles.

Each token costs a constant amount, not the output's length (decoding every id each time made
streaming quadratic): it decodes a short window that starts one settled step back, so a
decoder that treats a sequence's first token specially (a leading-space rule) sees the same
context on both sides of the difference; a window is settled once its text ends on a whole
character. Only the text a stop string could still span is kept. A decoder whose window text
does not extend its context's text falls back to decoding everything, so the text released is
always the full decode's.

A byte-level tokenizer offers its per-id byte strings (`Tokenizer.byte_pieces`); then no
tokenizer call is made at all: the bytes go through an incremental UTF-8 decoder, and a
character still incomplete counts as the one U+FFFD the full decode would end with, so the
releases are the same as the windowed path's.
"""
from __future__ import annotations

import codecs
from typing import Callable, Sequence

_TRIM = 256  # settled characters dropped in batches, not one slice per token


class Detokenizer:
    def __init__(self, decode: Callable[[Sequence[int]], str] | None, stop: Sequence[str] = (),
                 pieces: Sequence[bytes] | None = None, *, min_tokens: int = 0, include_stop: bool = False):
        self._decode = decode
        self._pieces_of = pieces if decode is not None else None  # id → bytes (byte-level fast path)
        # The incremental UTF-8 decoder's own work, without its wrapper: the bytes of an
        # incomplete last character wait here (None: no byte-level fast path).
        self._utf8: bytes | None = b"" if self._pieces_of is not None else None
        self._stop = tuple(stop)
        self._keep = max((len(s) for s in self._stop), default=0)  # released text a stop may span
        self._ids: list[int] = []
        self._prefix = 0  # the window's first id: context only, its text is already settled
        self._read = 0  # ids before this one are settled
        self._base = 0  # where `_recent` starts in the full text
        self._recent = ""  # the settled text from `_base` on
        self._windowed = True
        self._sent = 0  # characters released
        self._pieces: list[str] = []
        self.stopped = False
        self.stop_hit: str | None = None  # the stop string that ended the output
        self._include_stop = include_stop
        self._min_tokens = min_tokens
        self._pushed = 0  # tokens pushed
        self._armed_at = 0 if min_tokens <= 1 else None  # where stop strings may start (full-text index)

    @property
    def sent(self) -> str:
        """The text already released."""
        return "".join(self._pieces)

    def _text(self) -> str:
        """The full text of every id so far, from `_base` on."""
        ids = self._ids
        if self._windowed:
            context = self._decode(ids[self._prefix:self._read]) if self._read > self._prefix else ""
            window = self._decode(ids[self._prefix:])
            if window.startswith(context):
                new = window[len(context):]
                if new and not new.endswith("\ufffd"):
                    self._recent += new
                    self._prefix, self._read = self._read, len(ids)
                    return self._recent
                return self._recent + new
            self._windowed = False  # not prefix-stable: the full decode is the text
        return self._decode(ids)[self._base:]

    def _bytes_text(self, token: int | None) -> str:
        """The fast path's full text from `_base`: the token's bytes decoded incrementally; a
        pending incomplete character reads as the U+FFFD the full decode would show."""
        if token is None:  # the end: an incomplete character is final
            self._recent += codecs.utf_8_decode(self._utf8, "replace", True)[0]
            self._utf8 = b""
            return self._recent
        data = self._utf8 + self._pieces_of[token] if self._utf8 else self._pieces_of[token]
        text, used = codecs.utf_8_decode(data, "replace", False)
        self._utf8 = data[used:]
        self._recent += text
        return self._recent + "\ufffd" if self._utf8 else self._recent

    def push(self, token: int) -> str:
        """Add one token; return the newly final text (possibly empty)."""
        if self._decode is None:
            return ""
        self._pushed += 1
        if self._armed_at is None and self._pushed >= self._min_tokens:
            self._armed_at = self._sent  # min_tokens reached: stops may start in this token's text
        if self._utf8 is not None:
            full = self._bytes_text(token)
        else:
            self._ids.append(token)
            full = self._text()
        armed = self._armed_at is not None
        if self._stop and armed:
            start = max(0, self._sent - self._base - self._keep, self._armed_at - self._base)
            hits = [(i, -len(s)) for s, i in ((s, full.find(s, start)) for s in self._stop) if i >= 0]
            if hits:
                self.stopped = True
                at, longest = min(hits)  # the first stop string, the longest of those starting there
                self.stop_hit = full[at:at - longest]
                return self._release(full, at - longest if self._include_stop else at)
        hold = 1 if full.endswith("\ufffd") else 0
        for s in self._stop if armed else ():  # the longest tail that could still grow into a stop string
            for n in range(min(len(s) - 1, len(full)), hold, -1):
                if full.endswith(s[:n]):
                    hold = n
                    break
        return self._release(full, len(full) - hold)

    def flush(self) -> str:
        """At the end of generation: everything not yet released (a held stop prefix is text)."""
        if self._decode is None or self.stopped:
            return ""
        full = self._bytes_text(None) if self._utf8 is not None else self._text()
        return self._release(full, len(full))

    def _release(self, full: str, end: int) -> str:
        """Release `full[..end]` (indices from `_base`) beyond what was released."""
        begin = self._sent - self._base
        if end <= begin:
            return ""
        new = full[begin:end]
        self._sent += len(new)
        self._pieces.append(new)
        cut = min(len(self._recent), self._sent - self._base - self._keep)
        if cut >= _TRIM and self._windowed:
            self._recent = self._recent[cut:]
            self._base += cut
        return new
