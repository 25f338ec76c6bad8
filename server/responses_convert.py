"""The Responses API's pieces (issue 37): its tools, its structured output, its output items and
their stream events, what the store keeps of them, the response object and the input listing.
Pure functions and one event builder: no HTTP, no engine calls (server/responses_routes.py).

Ids are OpenAI's form (`resp_…`, `msg_…`, `rs_…`, `fc_…`, `call_…`). The plain and the streamed
answer build their output items with the same builder (`OutputEvents`), so at temperature 0 the
streamed final response is the plain one.
"""
from __future__ import annotations

import hashlib
import time
import uuid
from typing import Any, Sequence

from ninfer_jax.engine.grammar import StructuredOutput
from ninfer_jax.engine.types import Completion
from server import openai_convert as oc


def new_id(prefix: str) -> str:
    """`prefix_` and 32 hex digits, as OpenAI writes its ids."""
    return f"{prefix}_{uuid.uuid4().hex}"


# Fields of OpenAI's Responses API this server cannot honour: refused (400 naming them) when set
# to anything that would matter. {name: (the values that change nothing, why)}.
UNSERVED = {
    "background": ((None, False), "background responses are not served: send stream or wait for the answer"),
    "conversation": ((None,), "conversations are not served: chain responses with previous_response_id"),
    "prompt": ((None,), "stored prompt templates are not served: send instructions and input"),
    "top_logprobs": ((None, 0), "logprobs are not served on /v1/responses (chat completions serve them)"),
}


def refuse_unserved(req) -> None:
    """The chat routes' refusals (`oc.UNSERVED`) and the Responses API's own."""
    oc.refuse_unserved(req)
    given = dict(req.model_extra or {}, background=req.background)
    for name, (neutral, why) in UNSERVED.items():
        value = given.get(name)
        if not any(type(value) is type(ok) and value == ok for ok in neutral):
            raise oc.unsupported(name, why)


def template_kwargs(req, template_source: str | None) -> dict | None:
    """`reasoning.effort` as the template's thinking switch, where the template has one
    (`enable_thinking`): "none" and "minimal" turn it off, the others on. A template without
    the switch decides itself; the effort is then accepted and ignored."""
    effort = req.reasoning.effort if req.reasoning is not None else None
    if effort is None or not template_source or "enable_thinking" not in template_source:
        return None
    return {"enable_thinking": effort not in ("none", "minimal")}


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


def _output_text(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": []}


def _reasoning_text(text: str) -> dict:
    return {"type": "reasoning_text", "text": text}


class OutputEvents:
    """One response's output items, built as its text comes (`text`, `finish`), and the stream
    events that tell it (with `sequence_number`): each reasoning or message item is added,
    its content part added, its text streamed as deltas, then its text, part and item done;
    each function call is added, its arguments sent whole as one delta, then done. `items`
    holds the finished items: the response's `output`. The last item of an incomplete
    response (cut by max_output_tokens) is `incomplete`, every other one `completed`."""

    def __init__(self):
        self.seq = 0
        self.items: list[dict] = []
        self._open: dict | None = None  # the item whose text is streaming (reasoning or message)
        self._text = ""

    def event(self, kind: str, **fields) -> dict:
        out = {"type": kind, **fields, "sequence_number": self.seq}
        self.seq += 1
        return out

    def text(self, content: str, reasoning: str) -> list[dict]:
        """The events of the next final (content delta, reasoning delta) of the output parser."""
        out: list[dict] = []
        for kind, delta in (("reasoning", reasoning), ("message", content)):
            if not delta:
                continue
            if self._open is None or self._open["type"] != kind:
                out += self._start(kind)
            self._text += delta
            where = self._where()
            name = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
            extra = {} if kind == "reasoning" else {"logprobs": []}
            out.append(self.event(name, **where, content_index=0, delta=delta, **extra))
        return out

    def finish(self, content: str, reasoning: str, calls: Sequence[dict], incomplete: bool) -> list[dict]:
        """The events of the rest of the output and of its tool calls; then `items` is whole."""
        out = self.text(content, reasoning)
        if not calls and (self._open is None or self._open["type"] != "message") \
                and not any(i["type"] == "message" for i in self.items):
            out += self._start("message")  # an answer without text or calls is one empty message
        out += self._close("incomplete" if incomplete and not calls else "completed")
        for call in oc.tool_calls_out(calls):
            item = {"type": "function_call", "id": new_id("fc"), "call_id": new_id("call"),
                    "name": call["function"]["name"], "arguments": "", "status": "in_progress"}
            index, args = len(self.items), call["function"]["arguments"]
            out.append(self.event("response.output_item.added", output_index=index, item=dict(item)))
            out.append(self.event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                                  delta=args))
            out.append(self.event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                                  arguments=args))
            item.update(arguments=args, status="completed")
            self.items.append(item)
            out.append(self.event("response.output_item.done", output_index=index, item=item))
        return out

    def partial(self) -> list[dict]:
        """The output so far (the open item `incomplete`): a failed response's."""
        return self.items + ([self._item("incomplete")] if self._open is not None else [])

    def _where(self) -> dict:
        return {"item_id": self._open["id"], "output_index": len(self.items)}

    def _item(self, status: str) -> dict:
        item = dict(self._open, status=status)
        if item["type"] == "reasoning":
            item["content"] = [_reasoning_text(self._text)]
        else:
            item["content"] = [_output_text(self._text)]
        return item

    def _start(self, kind: str) -> list[dict]:
        out = self._close("completed")
        if kind == "reasoning":
            self._open = {"type": "reasoning", "id": new_id("rs"), "summary": [], "content": []}
            part = _reasoning_text("")
        else:
            self._open = {"type": "message", "id": new_id("msg"), "status": "in_progress", "role": "assistant",
                          "content": []}
            part = _output_text("")
        item = dict(self._open, status="in_progress")
        out.append(self.event("response.output_item.added", output_index=len(self.items), item=item))
        out.append(self.event("response.content_part.added", **self._where(), content_index=0, part=part))
        return out

    def _close(self, status: str) -> list[dict]:
        if self._open is None:
            return []
        item, where = self._item(status), self._where()
        if item["type"] == "reasoning":
            out = [self.event("response.reasoning_text.done", **where, content_index=0, text=self._text)]
        else:
            out = [self.event("response.output_text.done", **where, content_index=0, text=self._text, logprobs=[])]
        out.append(self.event("response.content_part.done", **where, content_index=0, part=item["content"][0]))
        out.append(self.event("response.output_item.done", output_index=where["output_index"], item=item))
        self.items.append(item)
        self._open, self._text = None, ""
        return out


def response_output(parsed, incomplete: bool) -> list[dict]:
    """The output items of a whole answer: reasoning (its text as `reasoning_text` content: the
    model's own, not a summary), the message, then function calls; built as a stream builds them."""
    items = OutputEvents()
    items.finish(parsed.content, parsed.reasoning_content or "", parsed.tool_calls, incomplete)
    return items.items


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
            out.append({"type": "reasoning", "summary": item["summary"], "content": item["content"]})
    return out


def reasoning_tokens(done: Completion, parsed, close_id: int | None) -> int:
    """Output tokens of the reasoning block: up to its closing tag, or all when it never closed."""
    if parsed.reasoning_content is None:
        return 0
    ids = list(done.token_ids)
    return ids.index(close_id) + 1 if close_id is not None and close_id in ids else len(ids)


def usage(done: Completion, reasoning: int = 0) -> dict:
    """OpenAI's usage: `cached_tokens` what the engine reused of the prompt, `cache_write_tokens`
    what this request's saves reached beyond it."""
    u = done.usage
    written = max(0, min(u.saved_tokens, u.prompt_tokens) - u.cached_tokens)
    return {"input_tokens": u.prompt_tokens,
            "input_tokens_details": {"cached_tokens": u.cached_tokens, "cache_write_tokens": written},
            "output_tokens": u.completion_tokens, "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": u.prompt_tokens + u.completion_tokens}


def response_object(rid: str, model: str, req, *, created_at: int, status: str, output: list[dict],
                    usage: dict | None = None, error: dict | None = None) -> dict:
    """The response object at `status` (in_progress, completed, incomplete, failed), echoing the
    request's settings as OpenAI does."""
    fmt = (req.text or {}).get("format") if isinstance(req.text, dict) else None
    reasoning = req.reasoning.model_dump(include={"effort", "summary"}) if req.reasoning is not None else None
    done = status != "in_progress"
    return {"id": rid, "object": "response", "created_at": created_at, "status": status,
            "completed_at": int(time.time()) if status == "completed" else None,
            "background": False, "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens, "model": model,
            "output": output, "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": req.previous_response_id, "reasoning": reasoning, "store": req.store,
            "temperature": req.temperature, "text": {"format": fmt or {"type": "text"}},
            "tool_choice": req.tool_choice or "auto", "tools": req.tools or [], "top_p": req.top_p,
            "truncation": req.truncation or "disabled", "usage": usage if done else None,
            "metadata": req.metadata or {}}


# --- the input listing (GET /v1/responses/{id}/input_items) ----------------------------------------
_ID_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}


def _item_id(rid: str, k: int, kind: str) -> str:
    """A stable id for the k-th input item of response `rid` (the same on every listing and
    after a restart: nothing more is stored)."""
    return f"{_ID_PREFIX.get(kind, 'item')}_{hashlib.sha256(f'{rid}/{k}'.encode()).hexdigest()[:32]}"


def _parts(content: Any, role: str) -> list:
    text = "output_text" if role == "assistant" else "input_text"
    if isinstance(content, str):
        return [_output_text(content) if role == "assistant" else {"type": text, "text": content}]
    parts = []
    for part in content or []:
        if isinstance(part, dict):
            part = {k: v for k, v in part.items() if k != "cache_control"}
            if part.get("type") == "text":
                part["type"] = text
            if part.get("type") == "output_text":
                part.setdefault("annotations", [])
        parts.append(part)
    return parts


def input_listing(rid: str, raw: Sequence[dict]) -> list[dict]:
    """A request's input items as OpenAI lists them: each with its id (the caller's, where it
    sent one) and status, messages' text as input_text (output_text for assistant turns)."""
    out = []
    for k, item in enumerate(raw):
        kind = item.get("type", "message" if "role" in item else None)
        given = item.get("id")
        iid = given if isinstance(given, str) and given else _item_id(rid, k, kind)
        if kind == "message":
            role = item.get("role")
            out.append({"type": "message", "id": iid, "role": role, "status": "completed",
                        "content": _parts(item.get("content"), role)})
        elif kind in ("function_call", "function_call_output", "reasoning"):
            keep = {"function_call": ("call_id", "name", "arguments"), "function_call_output": ("call_id", "output"),
                    "reasoning": ("summary", "content")}[kind]
            entry = {"type": kind, "id": iid, **{key: item[key] for key in keep if key in item}}
            if kind == "reasoning":
                entry.setdefault("summary", [])
            entry["status"] = "completed"
            out.append(entry)
        else:
            out.append(dict(item, id=iid))
    return out


def page(items: list[dict], *, limit: int, order: str, after: str | None, before: str | None) -> dict:
    """One page of a listing (`order` asc: as sent; desc: newest first): the items after the
    item `after` and before the item `before` (ids of the listing), at most `limit` of them."""
    seq = items if order == "asc" else items[::-1]
    ids = [i["id"] for i in seq]
    for name, cursor in (("after", after), ("before", before)):
        if cursor is not None and cursor not in ids:
            raise oc.ApiError(400, f"{name}: no input item {cursor!r} in this response", param=name)
    start = ids.index(after) + 1 if after is not None else 0
    end = ids.index(before) if before is not None else len(seq)
    data = seq[start:end][:limit]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": start + len(data) < end}
