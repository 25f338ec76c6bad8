"""OpenAI API bodies <-> engine values. Pure functions: no HTTP, no engine calls.

Requests become `SamplingParams` and the arguments of `Engine.submit_chat` / `submit` /
`submit_rendered`; engine completions become `chat.completion`, `text_completion` and
`response` objects and their streamed chunks. Errors become the API's error object
(`{"error": {"message", "type", "param", "code"}}`) with an HTTP status (`ApiError`).
"""
from __future__ import annotations

import json
import time
import uuid
from typing import Any, Sequence

from ninfer_jax.engine.types import Completion, SamplingParams, TokenLogprob
from ninfer_jax.errors import (CapacityError, EngineClosedError, EngineFailure, NInferError, QueueFullError,
                               RequestError)
from ninfer_jax.frontend.errors import FrontendError, InputTooLongError, UnknownResponseError
from server.errors import BadRequest
from server.limits import ServerLimits

FINISH = {"stop": "stop", "length": "length", "cancelled": "stop"}


class ApiError(Exception):
    """An error answer: HTTP status and the API's error object."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def _param(message: str) -> str | None:
    """The field a "field: why" message names ("sampling.seed: ..." -> "seed")."""
    head, sep, _ = message.partition(":")
    if not sep or " " in head.strip():
        return None
    return head.strip().removeprefix("sampling.")


def api_error(exc: BaseException) -> ApiError:
    """The answer for an engine, frontend or server exception (the table of docs/http.md)."""
    if isinstance(exc, ApiError):
        return exc
    text = str(exc)
    if isinstance(exc, QueueFullError):
        return ApiError(429, text, type="rate_limit_error", code="queue_full")
    if isinstance(exc, CapacityError):  # RES-6: this request can never fit this engine
        return ApiError(413, f"{type(exc).__name__}: {text}", code="capacity_exceeded")
    if isinstance(exc, (EngineClosedError, EngineFailure)):
        return ApiError(503, text, type="server_error", code="unavailable")
    if isinstance(exc, UnknownResponseError):
        return ApiError(404, text, param="previous_response_id", code="response_not_found")
    if isinstance(exc, InputTooLongError) or (isinstance(exc, RequestError) and "max_context" in text):
        return ApiError(400, f"{type(exc).__name__}: {text}", param=_param(text), code="context_length_exceeded")
    if isinstance(exc, (RequestError, BadRequest)):
        return ApiError(400, f"{type(exc).__name__}: {text}", param=_param(text))
    if isinstance(exc, (FrontendError, NInferError)):
        return ApiError(400, f"{type(exc).__name__}: {text}")
    return ApiError(500, f"internal error ({type(exc).__name__})", type="server_error")


def unsupported(param: str, why: str) -> ApiError:
    return ApiError(400, f"{param}: {why}", param=param, code="unsupported_parameter")


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


# --- requests ------------------------------------------------------------------------------------
_NO_GRAMMAR = "not served yet: structured output needs constrained decoding"
# Fields of vLLM's OpenAI server (and a few of OpenAI's) that this server does not honour: a
# request that sets one to anything but its neutral value is refused naming it, never served
# as if it had not been sent. {name: (the values that change nothing, why)}.
UNSERVED: dict[str, tuple[tuple, str]] = {
    "prompt_logprobs": ((None, 0), "not served yet: prompt logprobs need every prefill position's logits"),
    "guided_json": ((None,), _NO_GRAMMAR), "guided_regex": ((None,), _NO_GRAMMAR),
    "guided_choice": ((None,), _NO_GRAMMAR), "guided_grammar": ((None,), _NO_GRAMMAR),
    "guided_decoding_backend": ((None,), _NO_GRAMMAR), "guided_whitespace_pattern": ((None,), _NO_GRAMMAR),
    "structured_outputs": ((None,), _NO_GRAMMAR),
    "use_beam_search": ((None, False), "beam search is not served"),
    "length_penalty": ((None, 1, 1.0), "beam search is not served"),
    "bad_words": ((None, []), "not supported by this engine"),
    "allowed_token_ids": ((None,), "not supported by this engine"),
    "logits_processors": ((None, []), "not supported by this engine"),
    "truncate_prompt_tokens": ((None,), "prompts are never truncated: a prompt that does not fit is refused"),
    "continue_final_message": ((None, False), "not supported by this engine"),
    "add_generation_prompt": ((None, True), "the prompt always ends with the assistant's generation prompt"),
    "chat_template": ((None,), "the model's own template renders every request"),
    "documents": ((None, []), "not supported by this engine"),
    "mm_processor_kwargs": ((None, {}), "not supported by this engine"),
    "skip_special_tokens": ((None, True), "special tokens are always skipped in text"),
    "spaces_between_special_tokens": ((None, True), "special tokens are always skipped in text"),
    "return_tokens_as_token_ids": ((None, False), "not supported by this engine"),
    "priority": ((None, 0), "requests have no priorities"),
    "functions": ((None, []), "the legacy functions API is not served: send tools"),
    "function_call": ((None, "auto", "none"), "the legacy functions API is not served: send tools"),
    "prediction": ((None,), "predicted outputs are not served"),
    "modalities": ((None, ["text"]), "only text output is served"),
    "audio": ((None,), "only text output is served"),
    "reasoning_effort": ((None,), "not served: use chat_template_kwargs (enable_thinking) where the template has it"),
    "web_search_options": ((None,), "not supported by this engine"),
}


def _common_refusals(req) -> None:
    if req.n not in (None, 1):
        raise unsupported("n", "only n=1 is served (one choice per request)")
    if req.logit_bias:
        raise unsupported("logit_bias", "not supported by this engine")
    refuse_unserved(req)


def refuse_unserved(req) -> None:
    """A 400 naming the first field of `UNSERVED` the request sets to a value that would matter."""
    for name, value in (req.model_extra or {}).items():
        if name in UNSERVED and not _neutral(value, UNSERVED[name][0]):
            raise unsupported(name, UNSERVED[name][1])


def _neutral(value, neutral: tuple) -> bool:
    """`value` is one of the values that change nothing (of the same type: `true` is not `1`)."""
    return any(type(value) is type(ok) and value == ok for ok in neutral)


def sampling_of(req, *, max_tokens: int | None, logprobs: int, limits: ServerLimits, max_context: int,
                seed: int | None = None) -> SamplingParams:
    """SamplingParams from the fields a request set (the engine's defaults for the rest).
    RequestError (SamplingParams' own checks) or BadRequest (server limits) on bad values."""
    fields: dict[str, Any] = {}
    for name in ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                 "repetition_penalty", "ignore_eos", "min_tokens", "include_stop_str_in_output"):
        value = getattr(req, name, None)
        if value is not None:
            fields[name] = value
    if getattr(req, "stop_token_ids", None):
        fields["stop_token_ids"] = tuple(req.stop_token_ids)
    seed = getattr(req, "seed", None) if seed is None else seed
    if seed is not None:
        fields["seed"] = seed
    stop = getattr(req, "stop", None)
    if stop:
        fields["stop"] = (stop,) if isinstance(stop, str) else tuple(stop)
    if max_tokens is not None:
        fields["max_tokens"] = max_tokens
    if logprobs:
        fields["logprobs"] = logprobs
    params = SamplingParams(**fields)
    limits.check_max_tokens(params.max_tokens, max_context)
    return params


def chat_request(req, limits: ServerLimits, max_context: int) -> tuple[dict, SamplingParams, int | None]:
    """(keyword arguments of `submit_chat` without sampling, SamplingParams, top_logprobs)."""
    _common_refusals(req)
    choice = req.tool_choice
    if choice not in (None, "auto", "none"):
        raise unsupported("tool_choice", "only 'auto' and 'none' are served (no constrained decoding)")
    fmt = (req.response_format or {}).get("type", "text")
    if fmt != "text":
        raise unsupported("response_format", f"type {fmt!r} is not served (no constrained decoding)")
    if req.max_tokens is not None and req.max_completion_tokens is not None \
            and req.max_tokens != req.max_completion_tokens:
        raise ApiError(400, "max_tokens and max_completion_tokens disagree; set one", param="max_tokens")
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    top = None
    if req.logprobs:
        top = req.top_logprobs or 0
        if not 0 <= top <= 20:
            raise ApiError(400, f"top_logprobs: must lie in [0, 20], got {top}", param="top_logprobs")
    elif req.top_logprobs:
        raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    limits.check_count(len(req.messages), limits.max_messages, "messages")
    for i, m in enumerate(req.messages):  # the same per-message part limit as gRPC's
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):
            limits.check_count(len(content), limits.max_parts, f"messages[{i}].content")
    limits.check_count(len(req.tools or ()), limits.max_tools, "tools")
    sampling = sampling_of(req, max_tokens=max_tokens, logprobs=max(top or 0, 1) if top is not None else 0,
                           limits=limits, max_context=max_context)
    kwargs = {"messages": req.messages, "tools": req.tools or None, "session": req.session or None,
              "cache_markers": req.cache_markers or None, "anchors": req.anchors or None,
              "template_kwargs": req.chat_template_kwargs or None}
    return kwargs, sampling, top


def completion_request(req, limits: ServerLimits, max_context: int) -> tuple[str | list[int], SamplingParams, int | None]:
    _common_refusals(req)
    if req.echo:
        raise unsupported("echo", "not supported by this engine")
    if req.best_of not in (None, 1):
        raise unsupported("best_of", "only best_of=1 is served")
    if req.suffix:
        raise unsupported("suffix", "not supported by this engine")
    prompt = req.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise unsupported("prompt", "one prompt per request (send a batch as separate requests)")
        prompt = prompt[0]
    if isinstance(prompt, str):
        limits.check_chars(len(prompt), "prompt")
    elif not prompt:
        raise ApiError(400, "prompt: empty", param="prompt")
    top = req.logprobs
    if top is not None and not 0 <= top <= 20:
        raise ApiError(400, f"logprobs: must lie in [0, 20], got {top}", param="logprobs")
    sampling = sampling_of(req, max_tokens=req.max_tokens, logprobs=max(top, 1) if top is not None else 0,
                           limits=limits, max_context=max_context)
    return prompt, sampling, top


def responses_tools(tools: Sequence[dict] | None) -> list[dict] | None:
    """Responses tools ({"type": "function", "name", "description", "parameters"}) as chat tools."""
    if not tools:
        return None
    out = []
    for k, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") != "function":
            raise unsupported(f"tools[{k}]", "only function tools are served")
        if "function" in t:  # already in the chat shape
            out.append(t)
            continue
        fn = {key: t[key] for key in ("name", "description", "parameters") if key in t}
        out.append({"type": "function", "function": fn})
    return out


# --- responses -----------------------------------------------------------------------------------
def usage(done: Completion) -> dict:
    u = done.usage
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens}}


def _piece(decode, token_id: int) -> tuple[str, list[int]]:
    text = decode([token_id]) if decode is not None else str(token_id)
    return text, list(text.encode("utf-8"))


def chat_logprobs(items: Sequence[TokenLogprob], top: int, decode) -> list[dict]:
    out = []
    for lp in items:
        token, raw = _piece(decode, lp.token_id)
        entry = {"token": token, "logprob": lp.logprob, "bytes": raw, "top_logprobs": []}
        for t, v in lp.top[:top]:
            tt, tb = _piece(decode, t)
            entry["top_logprobs"].append({"token": tt, "logprob": v, "bytes": tb})
        out.append(entry)
    return out


def completion_logprobs(items: Sequence[TokenLogprob], top: int, decode, offset: int = 0) -> dict:
    tokens, values, tops, offsets = [], [], [], []
    for lp in items:
        token, _ = _piece(decode, lp.token_id)
        tokens.append(token)
        values.append(lp.logprob)
        tops.append({_piece(decode, t)[0]: v for t, v in lp.top[:top]})
        offsets.append(offset)
        offset += len(token)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


def tool_calls_out(calls: Sequence[dict]) -> list[dict]:
    """Parsed calls (arguments as objects) in the API's shape (arguments as a JSON string)."""
    return [{"id": c.get("id") or new_id("call"), "type": "function",
             "function": {"name": c["function"]["name"], "arguments": json.dumps(c["function"]["arguments"])}}
            for c in calls]


def finish_reason(done: Completion, calls: Sequence[dict]) -> str:
    if calls and done.finish_reason == "stop":
        return "tool_calls"
    return FINISH.get(done.finish_reason, "stop")


def chat_completion(rid: str, model: str, done: Completion, parsed, top: int | None, decode) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content or (None if parsed.tool_calls else "")}
    if parsed.reasoning_content is not None:
        message["reasoning_content"] = parsed.reasoning_content
    if parsed.tool_calls:
        message["tool_calls"] = tool_calls_out(parsed.tool_calls)
    choice = {"index": 0, "message": message, "finish_reason": finish_reason(done, parsed.tool_calls),
              "logprobs": {"content": chat_logprobs(done.logprobs, top, decode)} if top is not None else None}
    return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [choice], "usage": usage(done)}


def chat_chunk(rid: str, model: str, created: int, delta: dict, *, finish: str | None = None,
               logprobs: list | None = None) -> dict:
    choice = {"index": 0, "delta": delta, "finish_reason": finish,
              "logprobs": {"content": logprobs} if logprobs is not None else None}
    return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [choice]}


def usage_chunk(rid: str, model: str, created: int, done: Completion, obj: str = "chat.completion.chunk") -> dict:
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [], "usage": usage(done)}


def text_completion(rid: str, model: str, done: Completion, top: int | None, decode) -> dict:
    choice = {"index": 0, "text": done.text, "finish_reason": FINISH.get(done.finish_reason, "stop"),
              "logprobs": completion_logprobs(done.logprobs, top, decode) if top is not None else None}
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [choice], "usage": usage(done)}


def text_chunk(rid: str, model: str, created: int, text: str, *, finish: str | None = None,
               logprobs: dict | None = None) -> dict:
    return {"id": rid, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": logprobs}]}


def response_output(parsed) -> list[dict]:
    """The output items of a Responses answer: reasoning, the message, then function calls."""
    items: list[dict] = []
    if parsed.reasoning_content is not None:
        items.append({"type": "reasoning", "id": new_id("rs"),
                      "summary": [{"type": "summary_text", "text": parsed.reasoning_content}]})
    if parsed.content or not parsed.tool_calls:
        items.append({"type": "message", "id": new_id("msg"), "status": "completed", "role": "assistant",
                      "content": [{"type": "output_text", "text": parsed.content, "annotations": []}]})
    for call in tool_calls_out(parsed.tool_calls):
        items.append({"type": "function_call", "id": new_id("fc"), "call_id": call["id"],
                      "name": call["function"]["name"], "arguments": call["function"]["arguments"],
                      "status": "completed"})
    return items


def stored_output(items: Sequence[dict]) -> list[dict]:
    """What the Responses store keeps of the output items (the frontend reads them back, SH-5)."""
    out = []
    for item in items:
        if item["type"] == "message":
            out.append({"type": "message", "role": "assistant",
                        "content": "".join(p["text"] for p in item["content"])})
        elif item["type"] == "function_call":
            out.append({"type": "function_call", "call_id": item["call_id"], "name": item["name"],
                        "arguments": item["arguments"]})
        else:
            out.append({"type": "reasoning", "summary": item["summary"]})
    return out


def response_object(rid: str, model: str, done: Completion, items: list[dict], req) -> dict:
    u = done.usage
    incomplete = done.finish_reason == "length"
    return {"id": rid, "object": "response", "created_at": int(time.time()), "model": model,
            "status": "incomplete" if incomplete else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "error": None, "output": items, "previous_response_id": req.previous_response_id,
            "instructions": req.instructions, "store": req.store, "parallel_tool_calls": True,
            "tool_choice": req.tool_choice or "auto", "tools": req.tools or [],
            "temperature": req.temperature, "top_p": req.top_p, "max_output_tokens": req.max_output_tokens,
            "text": {"format": {"type": "text"}},
            "usage": {"input_tokens": u.prompt_tokens, "input_tokens_details": {"cached_tokens": u.cached_tokens},
                      "output_tokens": u.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": u.prompt_tokens + u.completion_tokens}}
