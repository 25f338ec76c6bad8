"""`--request_log=FILE`: one JSON line per finished engine request of the HTTP API (issue 37).

Every generation route (chat, completions, Responses, Anthropic Messages; each of n choices)
reads its engine request through `OpenAIFront.relay`, whose thread gets the `Completion` when the
request ends: it hands it to `RequestLog.write` there, so one hook covers every route, streamed
or not, finished, cut at max_tokens, cancelled by a client that left or failed. The file is opened
(append, line-buffered) when the server is built, before the model loads, so a path that cannot
be written is refused at start (`check_writable`); lines are written whole under a lock.

A line (docs/http.md, Operations): `time` (Unix seconds at the end), `request_id` (the engine's:
the HTTP id, `ID-1`, ... for choices), `http_request_id` and `path` (the HTTP request it served),
`finish_reason` (the engine's: stop, length, cancelled, error), `prompt_tokens`, `cached_tokens`,
`saved_tokens`, `completion_tokens`, `timing` (`queue_s` submit -> first admission, `ttft_s`
submit -> first token, `total_s` submit -> end, `max_output_gap_s`: on the engine's clock),
`hit` (the recovery point it bound from: kind, input_kind, frontier, takeover, private; null
when nothing was reused), `pauses` (times it was preempted) and `error` (a failure's message).
"""
from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

log = logging.getLogger("ninfer.http")


def check_writable(path: str) -> None:
    """OSError (naming the path) when `path` cannot be opened for appending."""
    with open(path, "a", encoding="utf-8"):
        pass


def record(done: Any, *, http_request_id: str | None = None, path: str | None = None) -> dict:
    """The request log's line for one finished engine request (a `Completion`)."""
    u = done.usage
    return {"time": round(time.time(), 3), "request_id": done.request_id, "http_request_id": http_request_id,
            "path": path, "finish_reason": done.finish_reason, "prompt_tokens": u.prompt_tokens,
            "cached_tokens": u.cached_tokens, "saved_tokens": u.saved_tokens,
            "completion_tokens": u.completion_tokens,
            "timing": {"queue_s": _seconds(done, "admitted_s"), "ttft_s": _seconds(done, "ttft_s"),
                       "total_s": _seconds(done, "completion_s"), "max_output_gap_s": _seconds(done, "max_output_gap_s")},
            "hit": done.hit, "pauses": done.pauses, "error": done.error}


def _seconds(done: Any, name: str) -> float | None:
    value = getattr(done, name)
    return None if value is None else round(value, 6)


class RequestLog:
    def __init__(self, path: str):
        self.path = path
        self._file = open(path, "a", encoding="utf-8", buffering=1)  # line-buffered: each line lands whole
        self._lock = threading.Lock()
        self._failed = False

    def write(self, done: Any, **context: Any) -> None:
        """Append `done`'s line; a write that fails (a full disk) is logged once and never fails
        the request."""
        line = json.dumps(record(done, **context), separators=(",", ":"))
        with self._lock:
            if self._file.closed:
                return
            try:
                self._file.write(line + "\n")
            except (OSError, ValueError) as exc:
                if not self._failed:
                    self._failed = True
                    log.warning("request log %s: a line was not written: %s", self.path, exc)

    def close(self) -> None:
        with self._lock:
            self._file.close()
