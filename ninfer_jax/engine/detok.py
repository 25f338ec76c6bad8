"""Incremental detokenisation with stop strings, for streaming.

Text is released only when it is final: not while the last character is an incomplete
multi-byte sequence, and not while its tail could still become a stop string. A stop string
ends the request; the text before it is the output (the stop string itself is not).
"""
from __future__ import annotations

from typing import Callable, Sequence


class Detokenizer:
    def __init__(self, decode: Callable[[Sequence[int]], str] | None, stop: Sequence[str] = ()):
        self._decode = decode
        self._stop = tuple(stop)
        self._ids: list[int] = []
        self.sent = ""  # text already released
        self.stopped = False

    def push(self, token: int) -> str:
        """Add one token; return the newly final text (possibly empty)."""
        self._ids.append(token)
        if self._decode is None:
            return ""
        full = self._decode(self._ids)
        if self._stop:
            start = max(0, len(self.sent) - max(len(s) for s in self._stop))
            hits = [i for i in (full.find(s, start) for s in self._stop) if i >= 0]
            if hits:
                self.stopped = True
                return self._release(full[:min(hits)])
        hold = 1 if full.endswith("\ufffd") else 0
        for s in self._stop:  # the longest tail that could still grow into a stop string
            for n in range(min(len(s) - 1, len(full)), hold, -1):
                if full.endswith(s[:n]):
                    hold = n
                    break
        return self._release(full[:len(full) - hold])

    def flush(self) -> str:
        """At the end of generation: everything not yet released (a held stop prefix is text)."""
        if self._decode is None or self.stopped:
            return ""
        return self._release(self._decode(self._ids))

    def _release(self, text: str) -> str:
        if len(text) <= len(self.sent):
            return ""
        new = text[len(self.sent):]
        self.sent = text
        return new
