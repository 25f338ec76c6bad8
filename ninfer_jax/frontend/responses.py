"""Responses-style input: a small in-memory store of past responses and item normalisation (SH-5).

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
import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .errors import MalformedInputError, MalformedToolCallError, UnknownResponseError

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
    input_items: tuple[dict, ...]
    output_items: tuple[dict, ...]


class ResponsesStore:
    """Bounded in-memory store; the least recently used response is evicted first."""

    def __init__(self, max_responses: int = DEFAULT_MAX_RESPONSES):
        if max_responses < 1:
            raise ValueError("max_responses must be positive")
        self.max_responses = max_responses
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, response_id: str) -> bool:
        return response_id in self._items

    def put(self, response_id: str, *, input_items: Sequence[Mapping[str, Any]],
            output_items: Sequence[Mapping[str, Any]], previous_response_id: str | None = None) -> StoredResponse:
        if previous_response_id is not None and previous_response_id not in self._items:
            raise UnknownResponseError(f"unknown previous_response_id {previous_response_id!r}")
        stored = StoredResponse(response_id, previous_response_id,
                                tuple(_freeze(list(input_items), "input_items")),
                                tuple(_freeze(list(output_items), "output_items")))
        self._items[response_id] = stored
        self._items.move_to_end(response_id)
        while len(self._items) > self.max_responses:
            self._items.popitem(last=False)
        return stored

    def get(self, response_id: str) -> StoredResponse:
        stored = self._items.get(response_id)
        if stored is None:
            raise UnknownResponseError(f"unknown previous_response_id {response_id!r}")
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
