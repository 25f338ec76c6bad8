"""Responses-style input: the store of past responses and item normalisation (SH-5).

A request names `previous_response_id`; its stored history (every earlier input and output, root
first) is expanded, this request's input is appended, and the whole is normalised into chat
messages before the marker policy runs. The store keeps each request's input exactly as the
caller sent it: the automatic marker chosen for a request lives only in that request's
rendering, never in the stored raw input, so later turns do not inherit it. Explicit
`cache_control` hints of expanded history are dropped too: markers belong to the request that
names them (at most four, SH-2).
"""
from __future__ import annotations

import copy
import dataclasses
import json
import logging
import os
import tempfile
import time
import urllib.parse
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .errors import (EvictedResponseError, ExpiredResponseError, MalformedInputError, MalformedToolCallError,
                     UnknownResponseError)

log = logging.getLogger("ninfer.frontend.responses")

DEFAULT_MAX_RESPONSES = 1024  # CFG-7: stored Responses have their own bound


def _freeze(value: Any, where: str) -> Any:
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError) as exc:
        raise MalformedInputError(f"{where}: not JSON-serialisable ({exc})") from exc


def input_items(value: str | Sequence[Any]) -> list[dict]:
    """A Responses `input`: a string is one user message; otherwise a list of items."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if not isinstance(value, (list, tuple)):
        raise MalformedInputError("input must be a string or a list of items")
    items = _freeze(list(value), "input")
    for k, item in enumerate(items):
        if not isinstance(item, dict):
            raise MalformedInputError(f"input[{k}]: an item must be a mapping")
    return items


@dataclass(frozen=True)
class StoredResponse:
    response_id: str
    previous_response_id: str | None
    input_items: tuple[dict, ...]  # this request's input as sent (the chain's history, the input listing)
    output_items: tuple[dict, ...]  # its output in the form the frontend reads back (SH-5)
    response: dict | None = None  # the whole response object, as the create returned it
    stored_at: float = 0.0  # the store's clock when it was stored
    size: int = 0  # bytes of its stored JSON (the byte budget counts these)

    def record(self) -> dict:
        return {"version": 1, "response_id": self.response_id, "previous_response_id": self.previous_response_id,
                "input_items": list(self.input_items), "output_items": list(self.output_items),
                "response": self.response, "stored_at": self.stored_at}


def _from_record(rec: Any, size: int) -> StoredResponse:
    """A stored file's record back (ValueError, KeyError or TypeError when it is not one)."""
    if not isinstance(rec, dict) or rec.get("version") != 1:
        raise ValueError("not a stored response record (version 1)")
    rid, prev, response = rec["response_id"], rec["previous_response_id"], rec["response"]
    items = [rec["input_items"], rec["output_items"]]
    if not isinstance(rid, str) or not (prev is None or isinstance(prev, str)) \
            or not (response is None or isinstance(response, dict)) \
            or not all(isinstance(v, list) and all(isinstance(i, dict) for i in v) for v in items):
        raise ValueError("a field of the wrong type")
    return StoredResponse(rid, prev, tuple(items[0]), tuple(items[1]), response, float(rec["stored_at"]), size)


_TOMBSTONES = 4096  # why a response is gone, kept for this many ids (its 404 then says why)


class ResponsesStore:
    """Stored responses, bounded three ways (CFG-7): at most `max_responses` and `max_bytes` of
    stored JSON (the least recently used evicted first), each kept `ttl_s` seconds after it was
    stored (None: until evicted). With `directory`, each response is also one JSON file there,
    written atomically (a temp file, then `os.replace`) and all read back when the store is
    built, so chains survive a restart; eviction, expiry and deletion remove the file. A
    response that is gone raises a typed error saying why: `EvictedResponseError` (the budget;
    or, for one larger than the whole byte budget, never stored), `ExpiredResponseError`, else
    `UnknownResponseError` (never stored, deleted). Not thread-safe: the caller holds a lock."""

    def __init__(self, max_responses: int = DEFAULT_MAX_RESPONSES, *, max_bytes: int | None = None,
                 ttl_s: float | None = None, directory: str | os.PathLike | None = None,
                 clock: Callable[[], float] = time.time):
        if max_responses < 1:
            raise ValueError("max_responses must be positive")
        if max_bytes is not None and max_bytes < 1:
            raise ValueError("max_bytes must be positive")
        if ttl_s is not None and not ttl_s > 0:
            raise ValueError("ttl_s must be positive")
        self.max_responses, self.max_bytes, self.ttl_s = max_responses, max_bytes, ttl_s
        self.clock = clock  # wall-clock by default: stored times are compared across restarts
        self.directory = Path(directory) if directory is not None else None
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()  # least recently used first
        self._by_age: dict[str, float] = {}  # stored_at, oldest first (expiry sweeps from the front)
        self._bytes = 0
        self._gone: OrderedDict[str, tuple[type[UnknownResponseError], str]] = OrderedDict()
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._load()

    def __len__(self) -> int:
        self._expire()
        return len(self._items)

    def __contains__(self, response_id: str) -> bool:
        self._expire()
        return response_id in self._items

    @property
    def bytes(self) -> int:
        return self._bytes

    # --- storing ----------------------------------------------------------------------------
    def put(self, response_id: str, *, input_items: Sequence[Mapping[str, Any]],
            output_items: Sequence[Mapping[str, Any]], previous_response_id: str | None = None,
            response: Mapping[str, Any] | None = None) -> StoredResponse | None:
        """Store a response (its chain's parent must still be stored). None when it alone
        exceeds the byte budget: not stored, with a logged warning, and a later lookup says so."""
        self._expire()
        if previous_response_id is not None:
            self.get(previous_response_id)  # in use: not the next to be evicted
        stored = StoredResponse(response_id, previous_response_id,
                                tuple(_freeze(list(input_items), "input_items")),
                                tuple(_freeze(list(output_items), "output_items")),
                                _freeze(dict(response), "response") if response is not None else None,
                                float(self.clock()))
        data = json.dumps(stored.record(), separators=(",", ":")).encode()
        stored = dataclasses.replace(stored, size=len(data))
        self._drop(response_id)
        if self.max_bytes is not None and stored.size > self.max_bytes:
            why = (f"response {response_id!r} was not stored: its {stored.size} bytes exceed the whole store "
                   f"budget of {self.max_bytes} bytes")
            log.warning(why)
            self._bury(response_id, EvictedResponseError, why)
            return None
        self._gone.pop(response_id, None)
        self._add(stored)
        self._write(stored, data)
        self._evict(keep=response_id)
        return stored

    def delete(self, response_id: str) -> None:
        """Forget a response (and its file); a later lookup is an `UnknownResponseError`."""
        self._live(response_id)
        self._drop(response_id)
        self._bury(response_id, UnknownResponseError, f"response {response_id!r} was deleted")

    # --- reading ----------------------------------------------------------------------------
    def get(self, response_id: str) -> StoredResponse:
        stored = self._live(response_id)
        self._items.move_to_end(response_id)
        return stored

    def history(self, response_id: str) -> list[dict]:
        """Every stored input and output item from the root of the chain to `response_id`."""
        chain: list[StoredResponse] = []
        seen: set[str] = set()
        cursor: str | None = response_id
        while cursor is not None:
            if cursor in seen:
                raise UnknownResponseError(f"response chain through {cursor!r} is cyclic")
            seen.add(cursor)
            stored = self.get(cursor)
            chain.append(stored)
            cursor = stored.previous_response_id
        items: list[dict] = []
        for stored in reversed(chain):
            items.extend(copy.deepcopy(list(stored.input_items)))
            items.extend(copy.deepcopy(list(stored.output_items)))
        return items

    # --- bookkeeping ------------------------------------------------------------------------
    def _live(self, response_id: str) -> StoredResponse:
        self._expire()
        stored = self._items.get(response_id)
        if stored is not None:
            return stored
        kind, why = self._gone.get(response_id, (UnknownResponseError, f"unknown response id {response_id!r}"))
        raise kind(why)

    def _add(self, stored: StoredResponse) -> None:
        self._items[stored.response_id] = stored
        self._by_age[stored.response_id] = stored.stored_at
        self._bytes += stored.size

    def _drop(self, response_id: str) -> None:
        stored = self._items.pop(response_id, None)
        if stored is None:
            return
        del self._by_age[response_id]
        self._bytes -= stored.size
        if self.directory is not None:
            try:
                self._path(response_id).unlink(missing_ok=True)
            except OSError as exc:
                log.warning("could not remove the stored response file of %r: %s", response_id, exc)

    def _bury(self, response_id: str, kind: type[UnknownResponseError], why: str) -> None:
        self._gone[response_id] = (kind, why)
        self._gone.move_to_end(response_id)
        while len(self._gone) > _TOMBSTONES:
            self._gone.popitem(last=False)

    def _evict(self, keep: str | None = None) -> None:
        """Least recently used first, until both budgets hold (never `keep`, which fits alone)."""
        while self._items and (len(self._items) > self.max_responses
                               or (self.max_bytes is not None and self._bytes > self.max_bytes)):
            victim = next(iter(self._items))
            if victim == keep:
                if len(self._items) == 1:
                    return
                self._items.move_to_end(victim)
                continue
            self._drop(victim)
            self._bury(victim, EvictedResponseError,
                       f"response {victim!r} was evicted: the store keeps at most {self.max_responses} responses"
                       + (f" and {self.max_bytes} bytes" if self.max_bytes is not None else "")
                       + ", least recently used first")

    def _expire(self) -> None:
        if self.ttl_s is None:
            return
        deadline = self.clock() - self.ttl_s
        while self._by_age:
            oldest, at = next(iter(self._by_age.items()))
            if at > deadline:
                return
            self._drop(oldest)
            self._bury(oldest, ExpiredResponseError, f"response {oldest!r} expired {self.ttl_s:g} s after it was stored")

    # --- persistence ------------------------------------------------------------------------
    def _path(self, response_id: str) -> Path:
        return self.directory / (urllib.parse.quote(response_id, safe="") + ".json")

    def _write(self, stored: StoredResponse, data: bytes) -> None:
        """One file per response, replaced atomically: a reader never sees half of one. A write
        that fails leaves the response in memory only (logged): the request that made it stands."""
        if self.directory is None:
            return
        try:
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".", suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, self._path(stored.response_id))
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError as exc:
            log.warning("could not write stored response %r to %s: %s", stored.response_id, self.directory, exc)

    def _load(self) -> None:
        """Every stored file, oldest first; unreadable ones skipped with a warning; then expiry
        and the budgets, as if they had been stored in this process."""
        found = []
        for path in sorted(self.directory.glob("*.json")):
            try:
                data = path.read_bytes()
                stored = _from_record(json.loads(data), len(data))
                if path != self._path(stored.response_id):
                    raise ValueError("its response id does not match the file name")
            except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
                log.warning("skipping unreadable stored response %s: %s", path, exc)
                continue
            found.append(stored)
        for stored in sorted(found, key=lambda s: s.stored_at):
            self._add(stored)
        self._expire()
        self._evict()


def strip_cache_control(items: Sequence[Mapping[str, Any]]) -> list[dict]:
    out = []
    for item in items:
        item = {k: v for k, v in item.items() if k != "cache_control"}
        if isinstance(item.get("content"), list):
            item["content"] = [
                {k: v for k, v in part.items() if k != "cache_control"} if isinstance(part, Mapping) else part
                for part in item["content"]
            ]
        out.append(item)
    return out


def _reasoning_text(item: Mapping[str, Any]) -> str:
    texts = []
    for key in ("summary", "content"):
        parts = item.get(key) or []
        if not isinstance(parts, (list, tuple)):
            raise MalformedInputError(f"a reasoning item's {key} must be a list of parts, got {type(parts).__name__}")
        for part in parts:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                texts.append(part["text"])
    return "\n".join(texts)


def items_to_messages(items: Sequence[Mapping[str, Any]]) -> list[dict]:
    """Normalise Responses items into chat messages (validated later by `normalize_messages`)."""
    messages: list[dict] = []
    reasoning: list[str] = []
    for k, item in enumerate(items):
        where = f"input item {k}"
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            msg = {key: value for key, value in item.items() if key != "type"}
            if msg.get("role") == "assistant" and reasoning:
                msg["reasoning_content"] = "\n".join(reasoning)
                reasoning = []
            messages.append(msg)
        elif kind == "reasoning":
            reasoning.append(_reasoning_text(item))
        elif kind == "function_call":
            name, args, call_id = item.get("name"), item.get("arguments"), item.get("call_id")
            if not isinstance(name, str) or args is None:
                raise MalformedToolCallError(f"{where}: a function_call needs a name and arguments")
            call = {"type": "function", "function": {"name": name, "arguments": args}}
            if call_id is not None:
                call["id"] = call_id
            last = messages[-1] if messages else None
            if last is not None and last.get("role") == "assistant" and not reasoning:
                last.setdefault("tool_calls", []).append(call)
            else:
                msg = {"role": "assistant", "content": None, "tool_calls": [call]}
                if reasoning:
                    msg["reasoning_content"] = "\n".join(reasoning)
                    reasoning = []
                messages.append(msg)
        elif kind == "function_call_output":
            output = item.get("output")
            if not isinstance(output, str):
                raise MalformedToolCallError(f"{where}: a function_call_output needs a string output")
            msg = {"role": "tool", "content": output}
            if item.get("call_id") is not None:
                msg["tool_call_id"] = item["call_id"]
            messages.append(msg)
        else:
            raise MalformedInputError(f"{where}: unsupported item type {kind!r}")
    return messages
