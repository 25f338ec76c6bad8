"""The Responses API's pieces (issue 37): its tools, its structured output, its output items,
what the store keeps of them and the response object. The routes are server/responses_routes.py."""
from __future__ import annotations

import time
from typing import Sequence

from ninfer_jax.engine.grammar import StructuredOutput
from ninfer_jax.engine.types import Completion
from server import openai_convert as oc


def responses_structured(req, tools: Sequence[dict] | None) -> StructuredOutput | None:
    """A Responses request's structured output: `text.format` json_object / json_schema (its
    schema at the top of the format object), `tool_choice` required or {"type": "function", "name"}."""
    fmt = (req.text or {}).get("format") if isinstance(req.text, dict) else None
    return oc.structured_of(req, response_format=oc.format_choice("text.format", fmt, lambda f: f.get("schema")),
                         tool_choice=oc.tool_choice_of("tool_choice", req.tool_choice, tools,
                                                  lambda c: c.get("name") or (c.get("function") or {}).get("name")))


def responses_tools(tools: Sequence[dict] | None) -> list[dict] | None:
    """Responses tools ({"type": "function", "name", "description", "parameters"}) as chat tools."""
    if not tools:
        return None
    out = []
    for k, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") != "function":
            raise oc.unsupported(f"tools[{k}]", "only function tools are served")
        if "function" in t:  # already in the chat shape
            out.append(t)
            continue
        fn = {key: t[key] for key in ("name", "description", "parameters") if key in t}
        out.append({"type": "function", "function": fn})
    return out


def response_output(parsed) -> list[dict]:
    """The output items of a Responses answer: reasoning, the message, then function calls."""
    items: list[dict] = []
    if parsed.reasoning_content is not None:
        items.append({"type": "reasoning", "id": oc.new_id("rs"),
                      "summary": [{"type": "summary_text", "text": parsed.reasoning_content}]})
    if parsed.content or not parsed.tool_calls:
        items.append({"type": "message", "id": oc.new_id("msg"), "status": "completed", "role": "assistant",
                      "content": [{"type": "output_text", "text": parsed.content, "annotations": []}]})
    for call in oc.tool_calls_out(parsed.tool_calls):
        items.append({"type": "function_call", "id": oc.new_id("fc"), "call_id": call["id"],
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
