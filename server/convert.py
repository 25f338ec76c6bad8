"""Protobuf messages <-> engine values. Pure functions; no gRPC, no engine calls.

Requests become what `Engine.submit` / `Engine.submit_chat` take (OpenAI-style dicts for chat,
so the frontend does all chat validation); engine outputs become stream messages.
"""
from __future__ import annotations

import json
from typing import Any, Iterable, Mapping

from ninfer_jax.engine.grammar import StructuredOutput
from ninfer_jax.engine.types import Completion, SamplingParams, TokenDelta, TokenLogprob
from ninfer_jax.errors import RequestError
from ninfer_jax.frontend.output_parser import parse_assistant_output
from server.errors import BadRequest
from server.limits import ServerLimits
from server.proto import ninfer_pb2 as pb

_OPTIONAL_SAMPLING = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                      "frequency_penalty", "seed", "max_tokens", "ignore_eos", "logprobs", "min_tokens",
                      "include_stop_str_in_output", "prompt_logprobs")
FINISH_REASON = {
    "stop": pb.FINISH_REASON_STOP,
    "length": pb.FINISH_REASON_LENGTH,
    "cancelled": pb.FINISH_REASON_CANCELLED,
}
_EPHEMERAL = {"type": "ephemeral"}


# --- requests ------------------------------------------------------------------------------------
def sampling_from_proto(msg: pb.SamplingParams, limits: ServerLimits, max_context: int,
                        defaults: Mapping[str, Any] | None = None) -> SamplingParams | None:
    """The fields the caller set; for the unset ones `defaults` (the checkpoint's
    generation_config.json: every field is `optional`, so unset is told from a set 0), else the
    engine's own. None when nothing is set and there are no defaults. Raises RequestError (from
    SamplingParams) or BadRequest (server limits)."""
    fields: dict[str, Any] = {name: value for name, value in (defaults or {}).items()
                              if not msg.HasField(name)}
    fields.update({name: getattr(msg, name) for name in _OPTIONAL_SAMPLING if msg.HasField(name)})
    if msg.stop:
        fields["stop"] = tuple(msg.stop)
    if msg.stop_token_ids:
        fields["stop_token_ids"] = tuple(msg.stop_token_ids)
    if msg.HasField("structured_output"):
        fields["structured_output"] = structured_from_proto(msg.structured_output)
    if not fields:
        return None
    params = SamplingParams(**fields)
    limits.check_max_tokens(params.max_tokens, max_context)
    return params


def structured_from_proto(msg: pb.StructuredOutput) -> StructuredOutput:
    """RequestError naming the field for a spec that is not JSON or does not fit its kind."""
    try:
        spec = json.loads(msg.spec_json) if msg.spec_json else None
    except json.JSONDecodeError as exc:
        raise RequestError(f"sampling.structured_output.spec_json: not JSON ({exc.msg})") from None
    except RecursionError:
        raise RequestError("sampling.structured_output.spec_json: nests too deep") from None
    return StructuredOutput(msg.kind, spec)


def prompt_from_proto(req: pb.GenerateRequest, limits: ServerLimits) -> str | list[int]:
    which = req.WhichOneof("prompt")
    if which == "text":
        limits.check_chars(len(req.text), "prompt")
        return req.text
    if which == "token_ids":
        return list(req.token_ids.ids)
    raise BadRequest("prompt: set either text or token_ids")


def save_points_from_proto(req: pb.GenerateRequest) -> dict:
    """Engine.submit's explicit save points, only those the request set (the engine checks
    them against the prompt)."""
    out: dict[str, Any] = {}
    if req.HasField("recovery_point"):
        out["recovery_point"] = req.recovery_point
    if req.anchors:
        out["anchors"] = list(req.anchors)
    if req.markers:
        out["markers"] = list(req.markers)
    if req.session:
        out["session"] = req.session
    return out


def _json_object(text: str, where: str) -> dict:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadRequest(f"{where}: not valid JSON ({exc.msg})") from None
    if not isinstance(value, dict):
        raise BadRequest(f"{where}: must be a JSON object")
    return value


def _part_from_proto(p: pb.ContentPart) -> dict[str, Any]:
    """A content part as the chat frontend reads it: text, an image (bytes or a URL), or a video
    as its frames; the frontend checks the media (typed MediaErrors)."""
    kind = p.type or "text"
    if kind == "image":
        return {"type": "image", "image": p.data if p.data else p.url}
    if kind == "video":
        return {"type": "video", "video": list(p.frames), **({"fps": p.fps} if p.fps > 0 else {})}
    return {"type": kind, "text": p.text}


def message_from_proto(m: pb.ChatMessage, limits: ServerLimits, index: int = 0) -> dict:
    out: dict[str, Any] = {"role": m.role}
    if m.parts:
        limits.check_count(len(m.parts), limits.max_parts, f"messages[{index}].parts")
        parts = []
        for p in m.parts:
            part = _part_from_proto(p)
            if p.cache_control:
                part["cache_control"] = _EPHEMERAL
            parts.append(part)
        out["content"] = parts
    else:
        out["content"] = m.content if m.HasField("content") else None
    if m.name:
        out["name"] = m.name
    if m.tool_call_id:
        out["tool_call_id"] = m.tool_call_id
    if m.tool_calls:
        # The argument string goes through as given: the frontend parses it (MalformedToolCallError).
        out["tool_calls"] = [{"type": "function", **({"id": c.id} if c.id else {}),
                              "function": {"name": c.name, "arguments": c.arguments_json or "{}"}}
                             for c in m.tool_calls]
    if m.HasField("reasoning_content"):
        out["reasoning_content"] = m.reasoning_content
    if m.cache_control:
        out["cache_control"] = _EPHEMERAL
    return out


def tool_from_proto(t: pb.Tool, index: int) -> dict:
    fn: dict[str, Any] = {"name": t.name}
    if t.description:
        fn["description"] = t.description
    fn["parameters"] = _json_object(t.parameters_json, f"tools[{index}].parameters_json")
    out: dict[str, Any] = {"type": "function", "function": fn}
    if t.cache_control:
        out["cache_control"] = _EPHEMERAL
    return out


def marker_from_proto(m: pb.CacheMarker, index: int) -> dict:
    which = m.WhichOneof("target")
    if which == "message":
        return {"message": m.message, **({"part": m.part} if m.HasField("part") else {})}
    if m.HasField("part"):
        raise BadRequest(f"cache_markers[{index}]: part needs message")
    if which == "tool":
        return {"tool": m.tool}
    if which == "tools" and m.tools:
        return {"tools": True}
    raise BadRequest(f"cache_markers[{index}]: set message, tool or tools")


def chat_from_proto(req: pb.ChatRequest, limits: ServerLimits) -> dict:
    """Keyword arguments for `Engine.submit_chat` (sampling and request_id excluded)."""
    limits.check_count(len(req.messages), limits.max_messages, "messages")
    limits.check_count(len(req.tools), limits.max_tools, "tools")
    chars = sum(len(m.content) + sum(len(p.text) for p in m.parts) for m in req.messages)
    limits.check_chars(chars, "messages")
    return {
        "messages": [message_from_proto(m, limits, i) for i, m in enumerate(req.messages)],
        "tools": [tool_from_proto(t, k) for k, t in enumerate(req.tools)] or None,
        "session": req.session or None,
        "cache_markers": [marker_from_proto(m, k) for k, m in enumerate(req.cache_markers)] or None,
    }


# --- responses -----------------------------------------------------------------------------------
def logprobs_to_proto(items: Iterable[TokenLogprob]) -> list[pb.TokenLogprob]:
    return [pb.TokenLogprob(token_id=lp.token_id, logprob=lp.logprob,
                            top=[pb.TopLogprob(token_id=t, logprob=v) for t, v in lp.top],
                            **({"rank": lp.rank} if lp.rank is not None else {}))
            for lp in items]


def delta_fields(request_id: str, delta: TokenDelta) -> dict:
    return {"request_id": request_id, "token_ids": list(delta.token_ids), "text": delta.text,
            "logprobs": logprobs_to_proto(delta.logprobs)}


def final_fields(done: Completion) -> dict:
    u = done.usage
    out = {"request_id": done.request_id, "finish_reason": FINISH_REASON[done.finish_reason],
           "usage": pb.Usage(prompt_tokens=u.prompt_tokens, cached_tokens=u.cached_tokens,
                             completion_tokens=u.completion_tokens)}
    if done.prompt_logprobs is not None:  # the first prompt token has no entry (nothing predicts it)
        out["prompt_logprobs"] = logprobs_to_proto(lp for lp in done.prompt_logprobs if lp is not None)
    return out


def assistant_to_proto(text: str) -> pb.AssistantMessage:
    parsed = parse_assistant_output(text)
    msg = pb.AssistantMessage(content=parsed.content)
    if parsed.reasoning_content is not None:
        msg.reasoning_content = parsed.reasoning_content
    for call in parsed.tool_calls:
        fn = call["function"]
        msg.tool_calls.add(id=call.get("id", ""), name=fn["name"], arguments_json=json.dumps(fn["arguments"]))
    return msg

