"""OpenAI API bodies <-> engine values. Pure functions: no HTTP, no engine calls.

Requests become `SamplingParams` and the arguments of `Engine.submit_chat` / `submit` /
`submit_rendered`; engine completions become `chat.completion`, `text_completion` and
`response` objects and their streamed chunks. Errors become the API's error object
(`{"error": {"message", "type", "param", "code"}}`) with an HTTP status (`ApiError`).
"""
from __future__ import annotations

import dataclasses
import json
import time
import uuid
from typing import Any, Mapping, Sequence

from ninfer_jax.engine.grammar import StructuredOutput
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
# Fields of vLLM's OpenAI server (and a few of OpenAI's) that this server does not honour: a
# request that sets one to anything but its neutral value is refused naming it, never served
# as if it had not been sent. {name: (the values that change nothing, why)}.
UNSERVED: dict[str, tuple[tuple, str]] = {
    "guided_decoding_backend": ((None, "auto", "llguidance", "guidance"), "the grammar engine is llguidance"),
    "guided_whitespace_pattern": ((None,), "JSON is written on one line (`, ` and `: `); no other pattern"),
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


MAX_CHOICES = 8  # n: choices of one request (the first prefills the prompt, the others reuse it)


def _common_refusals(req) -> None:
    if req.n is not None and (isinstance(req.n, bool) or not 1 <= req.n <= MAX_CHOICES):
        raise ApiError(400, f"n: must lie in [1, {MAX_CHOICES}], got {req.n!r}", param="n")
    if req.logit_bias:
        raise unsupported("logit_bias", "not supported by this engine")
    if req.stream and req.prompt_logprobs is not None:
        raise unsupported("prompt_logprobs", "not streamed: they come with the whole answer (send stream: false)")
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
                seed: int | None = None, structured: StructuredOutput | None = None,
                defaults: Mapping[str, Any] | None = None) -> SamplingParams:
    """SamplingParams from the fields a request set; for the rest `defaults` (the checkpoint's
    generation_config.json: `engine.generation_defaults()`), else the engine's own. RequestError
    (SamplingParams' own checks) or BadRequest (server limits) on bad values."""
    fields: dict[str, Any] = {"structured_output": structured} if structured is not None else {}
    for name in ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                 "repetition_penalty", "ignore_eos", "min_tokens", "include_stop_str_in_output", "prompt_logprobs"):
        value = getattr(req, name, None)
        if value is None and defaults:
            value = defaults.get(name)
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


# --- structured output ---------------------------------------------------------------------------
def _structure(field: str, kind: str, spec: Any = None) -> tuple[str, StructuredOutput]:
    """(the request field, its StructuredOutput); a bad spec is a 400 naming the field."""
    try:
        return field, StructuredOutput(kind, spec)
    except RequestError as exc:
        why = str(exc).split(": ", 1)[-1]
        raise ApiError(400, f"{field}: {why}", param=field) from None


def format_choice(field: str, fmt: Any, schema_of) -> tuple[str, StructuredOutput] | None:
    """`response_format` (chat) or `text.format` (Responses): text (none), json_object, json_schema."""
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise ApiError(400, f"{field}: must be an object such as {{\"type\": \"text\"}}, got {type(fmt).__name__}",
                       param=field)
    kind = fmt.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return _structure(field, "json_object")
    if kind == "json_schema":
        schema = schema_of(fmt)
        if not isinstance(schema, dict):
            raise ApiError(400, f"{field}: json_schema needs its schema object", param=field)
        return _structure(field, "json_schema", schema)
    raise unsupported(field, f"type {kind!r} is not served (text, json_object, json_schema are)")


def tool_choice_of(field: str, choice: Any, tools: Sequence[dict] | None,
                 name_of) -> tuple[str, StructuredOutput] | None:
    """"required" or a named function: the output is tool calls (engine/grammar.py tool_calls)."""
    if choice in (None, "auto", "none"):
        return None
    if not tools:
        raise ApiError(400, f"{field}: {choice!r} needs tools", param=field)
    name = None
    if choice != "required":
        name = name_of(choice) if isinstance(choice, dict) else None
        if not isinstance(name, str) or not name:
            raise ApiError(400, f"{field}: must be 'none', 'auto', 'required' or a named function", param=field)
        if name not in {(t.get("function") or {}).get("name") for t in tools if isinstance(t, dict)}:
            raise ApiError(400, f"{field}: function {name!r} is not among the tools", param=field)
    return _structure(field, "tool_calls", {"tools": list(tools), "name": name})


def _guided(extra: dict) -> list[tuple[str, StructuredOutput]]:
    """vLLM's guided_json / guided_regex / guided_choice / guided_grammar (Lark) and its
    structured_outputs object ({"json" | "regex" | "choice" | "grammar" | "json_object": ...})."""
    out = []
    for field, kind in (("guided_json", "json_schema"), ("guided_regex", "regex"), ("guided_choice", "choice"),
                        ("guided_grammar", "lark")):
        if extra.get(field) is not None:
            out.append(_structure(field, kind, extra[field]))
    so = extra.get("structured_outputs")
    if so is not None:
        keys = {"json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "lark",
                "json_object": "json_object"}
        given = [k for k in keys if isinstance(so, dict) and so.get(k) not in (None, False)]
        if len(given) != 1:
            raise ApiError(400, f"structured_outputs: set exactly one of {sorted(keys)}", param="structured_outputs")
        k = given[0]
        out.append(_structure("structured_outputs", keys[k], None if k == "json_object" else so[k]))
    return out


def structured_of(req, *, response_format=None, tool_choice=None) -> StructuredOutput | None:
    """The one structured output a request asks for (response_format / text.format, tool_choice
    required or named, vLLM's guided fields): a 400 when it asks for two."""
    found = [f for f in (response_format, tool_choice) if f is not None] + _guided(req.model_extra or {})
    if len(found) > 1:
        names = ", ".join(field for field, _ in found)
        raise ApiError(400, f"{found[1][0]}: one structured output per request; this one sets {names}",
                       param=found[1][0])
    return found[0][1] if found else None


def chat_request(req, limits: ServerLimits, max_context: int,
                 defaults: Mapping[str, Any] | None = None) -> tuple[dict, SamplingParams, int | None]:
    """(keyword arguments of `submit_chat` without sampling, SamplingParams, top_logprobs);
    `defaults`: the sampling defaults of the fields the request leaves unset (`sampling_of`)."""
    _common_refusals(req)
    structured = structured_of(
        req, response_format=format_choice("response_format", req.response_format,
                                              lambda f: (f.get("json_schema") or {}).get("schema")),
        tool_choice=tool_choice_of("tool_choice", req.tool_choice, req.tools,
                                 lambda c: (c.get("function") or {}).get("name")))
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
                           limits=limits, max_context=max_context, structured=structured, defaults=defaults)
    kwargs = {"messages": req.messages, "tools": req.tools or None, "session": req.session or None,
              "cache_markers": req.cache_markers or None, "anchors": req.anchors or None,
              "template_kwargs": req.chat_template_kwargs or None}
    return kwargs, sampling, top


def completion_request(req, limits: ServerLimits, max_context: int,
                       defaults: Mapping[str, Any] | None = None) -> tuple[str | list[int], SamplingParams, int | None]:
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
                           limits=limits, max_context=max_context, structured=structured_of(req), defaults=defaults)
    return prompt, sampling, top


# --- answers -------------------------------------------------------------------------------------
def choice_samplings(sampling: SamplingParams, n: int) -> list[SamplingParams]:
    """The n choices' sampling: choice i draws with seed + i when a seed is set (so the choices
    differ and each is reproducible), else each with its own random seed."""
    if sampling.seed is None:
        return [sampling] * n
    return [dataclasses.replace(sampling, seed=(sampling.seed + i) % 2 ** 63) for i in range(n)]


def usage(dones: Completion | Sequence[Completion]) -> dict:
    """The prompt counted once (as OpenAI counts it for n choices) with the first choice's cached
    tokens, and the tokens of every choice."""
    dones = [dones] if isinstance(dones, Completion) else list(dones)
    first = dones[0].usage
    completion = sum(d.usage.completion_tokens for d in dones)
    return {"prompt_tokens": first.prompt_tokens, "completion_tokens": completion,
            "total_tokens": first.prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": first.cached_tokens}}


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


def prompt_logprobs_out(done: Completion, decode) -> list | None:
    """vLLM's prompt_logprobs: per prompt token None (the first) or {token id: {logprob, rank,
    decoded_token}} of the token itself and the top ones asked for."""
    if done.prompt_logprobs is None:
        return None
    out: list = []
    for entry in done.prompt_logprobs:
        if entry is None:
            out.append(None)
            continue
        ranked = {entry.token_id: (entry.logprob, entry.rank)}
        for k, (t, v) in enumerate(entry.top):
            ranked.setdefault(t, (v, k + 1))
        out.append({str(t): {"logprob": v, "rank": r, "decoded_token": _piece(decode, t)[0]}
                    for t, (v, r) in ranked.items()})
    return out


def chat_completion(rid: str, model: str, dones: Sequence[Completion], parsed: Sequence, top: int | None,
                    decode) -> dict:
    """One choice per completion, in order (n)."""
    choices = []
    for i, (done, p) in enumerate(zip(dones, parsed)):
        message: dict[str, Any] = {"role": "assistant", "content": p.content or (None if p.tool_calls else "")}
        if p.reasoning_content is not None:
            message["reasoning_content"] = p.reasoning_content
        if p.tool_calls:
            message["tool_calls"] = tool_calls_out(p.tool_calls)
        choices.append({"index": i, "message": message, "finish_reason": finish_reason(done, p.tool_calls),
                        "logprobs": {"content": chat_logprobs(done.logprobs, top, decode)} if top is not None
                        else None})
    out = {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
           "choices": choices, "usage": usage(dones)}
    if dones[0].prompt_logprobs is not None:  # vLLM puts the prompt's once, at the top
        out["prompt_logprobs"] = prompt_logprobs_out(dones[0], decode)
    return out


def chat_chunk(rid: str, model: str, created: int, delta: dict, *, finish: str | None = None,
               logprobs: list | None = None, index: int = 0) -> dict:
    choice = {"index": index, "delta": delta, "finish_reason": finish,
              "logprobs": {"content": logprobs} if logprobs is not None else None}
    return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [choice]}


def usage_chunk(rid: str, model: str, created: int, dones, obj: str = "chat.completion.chunk") -> dict:
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [], "usage": usage(dones)}


def text_completion(rid: str, model: str, dones: Sequence[Completion], top: int | None, decode) -> dict:
    choices = [{"index": i, "text": done.text, "finish_reason": FINISH.get(done.finish_reason, "stop"),
                "logprobs": completion_logprobs(done.logprobs, top, decode) if top is not None else None,
                **({"prompt_logprobs": prompt_logprobs_out(done, decode)} if done.prompt_logprobs is not None
                   else {})}
               for i, done in enumerate(dones)]
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": choices, "usage": usage(dones)}


def text_chunk(rid: str, model: str, created: int, text: str, *, finish: str | None = None,
               logprobs: dict | None = None, index: int = 0) -> dict:
    return {"id": rid, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": index, "text": text, "finish_reason": finish, "logprobs": logprobs}]}
