"""Anthropic Messages API bodies <-> engine values (issue 37). Pure functions: no HTTP, no engine.

A `POST /v1/messages` body becomes the chat messages, tools, template switches and
`SamplingParams` the OpenAI path already serves (one renderer, one output parser, one engine
path), and an engine completion becomes a `message` object or its stream of events. Errors are
Anthropic's shape, `{"type": "error", "error": {"type", "message"}}`, with its statuses
(`AnthropicError.of` maps the engine's and the OpenAI layer's errors onto them).

- `system` (a string or text blocks), `user` / `assistant` turns of `text`, `image` (base64 or
  URL), `thinking`, `tool_use` and `tool_result` blocks; `cache_control` on a system, tool or
  content block is the frontend's explicit marker at that block's end (SH-1; at most four, as
  Anthropic allows; the frontend refuses a fifth).
- `tools` (`name`, `description`, `input_schema`), `tool_choice` auto / any / tool / none (any
  and tool hold the output to tool calls with the grammar engine, none renders the tools but
  reads no call), `thinking` enabled / disabled (the template's `enable_thinking`),
  `stop_sequences`, `max_tokens` (required), `metadata`, `output_config.format` (a JSON schema
  the output is held to); `temperature` (0..1), `top_p` and `top_k`, which clients before 2026
  send; the request-level `cache_control` (a marker at the last cacheable block).
- `usage`: `cache_read_input_tokens` is what the engine reused, `cache_creation_input_tokens`
  what this request saved beyond that (the furthest prompt frontier its captures kept),
  `input_tokens` the rest: the three add up to the prompt's tokens, as Anthropic counts them.
"""
from __future__ import annotations

import json
import uuid
from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ninfer_jax.engine.types import Completion
from server import openai_convert as oc

# Anthropic's error types by HTTP status (its documented set; 529 is its "overloaded").
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 415: "invalid_request_error",
               429: "rate_limit_error", 499: "invalid_request_error", 500: "api_error", 503: "overloaded_error",
               529: "overloaded_error"}
# Fields of the Anthropic API this server does not serve: set to anything but their neutral value,
# a 400 names them (never served as if they had not been sent).
UNSERVED = {"container": ((None,), "code execution containers are not served"),
            "mcp_servers": ((None, []), "MCP servers are not served"),
            "context_management": ((None,), "context management is not served"),
            "service_tier": ((None, "auto", "standard_only"), "one service tier is served"),
            "speed": ((None, "standard"), "one speed is served"),
            "inference_geo": ((None,), "inference runs on this server"),
            "diagnostics": ((None,), "cache-miss diagnostics are not served")}


class AnthropicError(oc.ApiError):
    """An error answer in Anthropic's shape (an `ApiError`, so the shared submission wrapper
    passes it through as it is)."""

    def __init__(self, status: int, message: str, type: str | None = None):
        fallback = "invalid_request_error" if status < 500 else "api_error"  # 405, 411... are the client's
        super().__init__(status, message, type=type or ERROR_TYPES.get(status, fallback))

    def body(self) -> dict:
        return {"type": "error", "error": {"type": self.type, "message": self.message}}

    @classmethod
    def of(cls, exc: BaseException) -> "AnthropicError":
        """The answer for any error the routes meet: a full queue is Anthropic's 529."""
        if isinstance(exc, AnthropicError):
            return exc
        api = oc.api_error(exc)
        if api.status == 429 and api.code == "queue_full":
            return cls(529, api.message, "overloaded_error")
        return cls(api.status, api.message)


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")


class CountTokensRequest(_Body):
    """What `count_tokens` reads: the prompt's parts of a Messages body."""

    model: str = Field(min_length=1)
    messages: list[dict] = Field(min_length=1)
    system: Union[str, list[dict], None] = None
    tools: Optional[list[dict]] = None
    tool_choice: Optional[dict] = None
    thinking: Optional[dict] = None
    cache_control: Optional[dict] = None  # automatic caching: a marker at the last cacheable block


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)
    stop_sequences: Optional[list[str]] = None
    temperature: Optional[float] = Field(default=None, ge=0, le=1)
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    metadata: Optional[dict] = None
    stream: bool = False
    output_config: Optional[dict] = None  # {"format": {"type": "json_schema", "schema": ...}}


def parse(model_cls, data: dict):
    """`data` as `model_cls`; a 400 naming the first bad field."""
    try:
        return model_cls.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise AnthropicError(400, f"{where}: {first['msg']}" if where else first["msg"]) from None


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


# --- requests ------------------------------------------------------------------------------------
def _bad(where: str, why: str) -> AnthropicError:
    return AnthropicError(400, f"{where}: {why}")


def _marker(block: dict) -> dict:
    """The block's `cache_control`, checked ({"type": "ephemeral"}, an optional ttl)."""
    cc = block.get("cache_control")
    if cc is None:
        return {}
    if not isinstance(cc, dict) or cc.get("type") != "ephemeral":
        raise _bad("cache_control", f"must be {{\"type\": \"ephemeral\"}}, got {cc!r}")
    return {"cache_control": cc}


def _text_of(blocks: Any, where: str) -> str:
    """The text of a string or of text blocks (a tool result's content)."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise _bad(where, "must be a string or a list of text blocks")
    out = []
    for k, b in enumerate(blocks):
        if not isinstance(b, dict) or b.get("type") != "text" or not isinstance(b.get("text"), str):
            raise _bad(f"{where}[{k}]", "a tool result here holds text blocks only")
        out.append(b["text"])
    return "".join(out)


def _image(block: dict, where: str) -> dict:
    src = block.get("source")
    if not isinstance(src, dict):
        raise _bad(f"{where}.source", "an image needs a source")
    if src.get("type") == "base64":
        media, data = src.get("media_type"), src.get("data")
        if not isinstance(media, str) or not media.startswith("image/") or not isinstance(data, str):
            raise _bad(f"{where}.source", "a base64 image needs media_type image/... and data")
        url = f"data:{media};base64,{data}"
    elif src.get("type") == "url" and isinstance(src.get("url"), str):
        url = src["url"]
    else:
        raise _bad(f"{where}.source.type", "must be base64 or url")
    return {"type": "image_url", "image_url": {"url": url}, **_marker(block)}


def _system(system: Any) -> list[dict]:
    if system is None or system == "":
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}]
    parts = []
    for k, b in enumerate(system):
        if not isinstance(b, dict) or b.get("type") != "text" or not isinstance(b.get("text"), str):
            raise _bad(f"system[{k}]", "system blocks must be text blocks")
        parts.append({"type": "text", "text": b["text"], **_marker(b)})
    return [{"role": "system", "content": parts}]


def _user(content: Any, i: int) -> list[dict]:
    """A user turn: its tool results become tool messages (in order, first), the rest one user message."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    if not isinstance(content, list) or not content:
        raise _bad(f"messages[{i}].content", "must be a string or a non-empty list of blocks")
    tools, parts = [], []
    for k, b in enumerate(content):
        where = f"messages[{i}].content[{k}]"
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text" and isinstance(b.get("text"), str):
            parts.append({"type": "text", "text": b["text"], **_marker(b)})
        elif kind == "image":
            parts.append(_image(b, where))
        elif kind == "tool_result":
            if not isinstance(b.get("tool_use_id"), str):
                raise _bad(f"{where}.tool_use_id", "a tool result names its tool_use id")
            if parts:
                raise _bad(where, "tool results come before any other content of the turn")
            tools.append({"role": "tool", "tool_call_id": b["tool_use_id"],
                          "content": _text_of(b.get("content", ""), f"{where}.content"), **_marker(b)})
        else:
            raise _bad(f"{where}.type", f"a user turn holds text, image and tool_result blocks, got {kind!r}")
    return tools + ([{"role": "user", "content": parts}] if parts else [])


def _assistant(content: Any, i: int) -> dict:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    if not isinstance(content, list):
        raise _bad(f"messages[{i}].content", "must be a string or a list of blocks")
    text, thinking, calls, marker = [], [], [], {}
    for k, b in enumerate(content):
        where = f"messages[{i}].content[{k}]"
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text" and isinstance(b.get("text"), str):
            text.append(b["text"])
            marker = _marker(b) or marker
        elif kind == "thinking" and isinstance(b.get("thinking"), str):
            thinking.append(b["thinking"])
        elif kind == "tool_use":
            if not isinstance(b.get("id"), str) or not isinstance(b.get("name"), str) \
                    or not isinstance(b.get("input", {}), dict):
                raise _bad(where, "a tool_use block has an id, a name and an input object")
            calls.append({"id": b["id"], "type": "function",
                          "function": {"name": b["name"], "arguments": b.get("input", {})}})
            marker = _marker(b) or marker
        else:
            raise _bad(f"{where}.type", f"an assistant turn holds text, thinking and tool_use blocks, got {kind!r}")
    msg: dict = {"role": "assistant", "content": "".join(text) or (None if calls else ""), **marker}
    if thinking:
        msg["reasoning_content"] = "".join(thinking)
    if calls:
        msg["tool_calls"] = calls
    return msg


def _tools(tools: Optional[list]) -> list[dict] | None:
    if not tools:
        return None
    out = []
    for k, t in enumerate(tools):
        if not isinstance(t, dict) or not isinstance(t.get("name"), str) or not t["name"]:
            raise _bad(f"tools[{k}]", "a tool has a name")
        if t.get("type") not in (None, "custom"):
            raise _bad(f"tools[{k}].type", f"server tools ({t['type']!r}) are not served: give custom tools")
        schema = t.get("input_schema")
        if not isinstance(schema, dict):
            raise _bad(f"tools[{k}].input_schema", "a tool has an input_schema object")
        fn = {"name": t["name"], "parameters": schema}
        if isinstance(t.get("description"), str):
            fn["description"] = t["description"]
        out.append({"type": "function", "function": fn, **_marker(t)})
    return out


def _tool_choice(choice: Optional[dict], tools: list | None) -> tuple[Any, bool]:
    """(the OpenAI-layer tool_choice, whether tool calls are read from the output)."""
    if choice is None:
        return None, True
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind not in ("auto", "any", "tool", "none"):
        raise _bad("tool_choice.type", f"must be auto, any, tool or none, got {kind!r}")
    if choice.get("disable_parallel_tool_use") and kind in ("auto", "any"):
        raise _bad("tool_choice.disable_parallel_tool_use", "served with tool_choice tool (one call of that tool)")
    if kind == "none":
        return "none", False
    if kind == "auto":
        return None, True
    if not tools:
        raise _bad("tool_choice", f"{kind!r} needs tools")
    if kind == "any":
        return "required", True
    if not isinstance(choice.get("name"), str):
        raise _bad("tool_choice.name", "tool_choice tool names the tool")
    return {"type": "function", "function": {"name": choice["name"]}}, True


def _thinking(thinking: Optional[dict], max_tokens: int | None) -> dict | None:
    """The template switch for `thinking` (absent: the template's default). `budget_tokens` is
    checked as Anthropic checks it; the reasoning is bounded by `max_tokens` as a whole."""
    if thinking is None:
        return None
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if kind == "disabled":
        return {"enable_thinking": False}
    if kind not in ("enabled", "adaptive", "between_tools"):
        raise _bad("thinking.type", f"must be enabled, adaptive, between_tools or disabled, got {kind!r}")
    if thinking.get("display") not in (None, "summarized", "omitted"):
        raise _bad("thinking.display", "must be summarized or omitted")
    budget = thinking.get("budget_tokens")
    if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool) or budget < 1024
                               or (max_tokens is not None and budget >= max_tokens)):
        raise _bad("thinking.budget_tokens", "must be an int >= 1024 and below max_tokens")
    return {"enable_thinking": True}


def _output_format(config: Optional[dict]):
    """`output_config.format` json_schema: the output held to the schema (the grammar engine)."""
    if config is None:
        return None
    if not isinstance(config, dict):
        raise _bad("output_config", "must be an object")
    if config.get("effort") is not None:
        raise _bad("output_config.effort", "effort levels are not served")
    fmt = config.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise _bad("output_config.format", "must be {\"type\": \"json_schema\", \"schema\": {...}}")
    return oc._structure("output_config.format", "json_schema", fmt["schema"])


def chat_of(req) -> dict:
    """The chat arguments of a Messages or count_tokens body: messages, tools, template switches,
    the OpenAI-layer tool_choice and whether calls are read."""
    messages = _system(req.system)
    for i, m in enumerate(req.messages):
        role = m.get("role") if isinstance(m, dict) else None
        if role == "user":
            messages += _user(m.get("content"), i)
        elif role == "assistant":
            messages.append(_assistant(m.get("content"), i))
        else:
            raise _bad(f"messages[{i}].role", f"must be user or assistant, got {role!r}")
    tools = _tools(req.tools)
    choice, read_calls = _tool_choice(req.tool_choice, tools)
    if req.cache_control is not None:
        _marker({"cache_control": req.cache_control})
    omitted = isinstance(req.thinking, dict) and req.thinking.get("display") == "omitted"
    return {"messages": messages, "tools": tools, "tool_choice": choice, "read_calls": read_calls,
            "template_kwargs": _thinking(req.thinking, getattr(req, "max_tokens", None)),
            # Anthropic's caching is explicit: blocks' cache_control only, unless the request asks
            # for its automatic marker (at the last cacheable block: the frontend's OpenAI default)
            "marker_policy": "openai_default" if req.cache_control is not None else "none",
            "omit_thinking": omitted}


class _Sampling:
    """The OpenAI-layer view of a Messages body that `oc.sampling_of` reads."""

    def __init__(self, req, structured):
        self.temperature, self.top_p, self.top_k = req.temperature, req.top_p, req.top_k
        self.stop = req.stop_sequences or None
        self.structured = structured


def refuse_unserved(req) -> None:
    for name, value in (req.model_extra or {}).items():
        if name in UNSERVED and not any(type(value) is type(ok) and value == ok for ok in UNSERVED[name][0]):
            raise _bad(name, UNSERVED[name][1])


def sampling_of(req, chat: dict, limits, max_context: int, defaults=None):
    """SamplingParams of a Messages body: its sampling fields, stop sequences, max_tokens and the
    structured output its tool_choice asks for (any / tool); `defaults` for the sampling fields it
    leaves unset (the checkpoint's generation_config.json, `oc.sampling_of`)."""
    found = [f for f in (_output_format(getattr(req, "output_config", None)),
                         oc.tool_choice_of("tool_choice", chat["tool_choice"], chat["tools"],
                                         lambda c: (c.get("function") or {}).get("name"))
                         if chat["tool_choice"] not in (None, "none") else None) if f is not None]
    if len(found) > 1:
        raise _bad("output_config.format", "one structured output per request: not with tool_choice any or tool")
    structured = found[0][1] if found else None
    return oc.sampling_of(_Sampling(req, structured), max_tokens=req.max_tokens, logprobs=0, limits=limits,
                          max_context=max_context, structured=structured, defaults=defaults)


# --- responses -----------------------------------------------------------------------------------
def usage(done: Completion) -> dict:
    u = done.usage
    read = u.cached_tokens
    created = max(0, min(u.saved_tokens, u.prompt_tokens) - read)
    return {"input_tokens": u.prompt_tokens - read - created, "cache_read_input_tokens": read,
            "cache_creation_input_tokens": created, "output_tokens": u.completion_tokens}


def stop_reason(done: Completion, calls) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence)."""
    if done.finish_reason == "length":
        return "max_tokens", None
    if calls:
        return "tool_use", None
    if done.stop_sequence is not None:
        return "stop_sequence", done.stop_sequence
    return "end_turn", None


def tool_use_blocks(calls) -> list[dict]:
    """The parsed calls as tool_use blocks, each with an id of its own (the conversation's later
    tool_result names it)."""
    return [{"type": "tool_use", "id": new_id("toolu"), "name": c["function"]["name"],
             "input": c["function"]["arguments"]} for c in calls]


def content_blocks(parsed, omit_thinking: bool = False) -> list[dict]:
    """thinking (its text left out with `display: omitted`), text, then tool_use blocks."""
    out: list[dict] = []
    if parsed.reasoning_content is not None:
        out.append({"type": "thinking", "thinking": "" if omit_thinking else parsed.reasoning_content,
                    "signature": ""})
    if parsed.content or not parsed.tool_calls:
        out.append({"type": "text", "text": parsed.content})
    return out + tool_use_blocks(parsed.tool_calls)


def message(mid: str, model: str, done: Completion, parsed, omit_thinking: bool = False) -> dict:
    reason, sequence = stop_reason(done, parsed.tool_calls)
    return {"id": mid, "type": "message", "role": "assistant", "model": model,
            "content": content_blocks(parsed, omit_thinking), "stop_reason": reason, "stop_sequence": sequence,
            "usage": usage(done)}


def event(kind: str, **fields) -> bytes:
    """One server-sent event of the Messages stream."""
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields}, separators=(',', ':'))}\n\n".encode()
