"""OpenAI's Responses API on the HTTP server (issue 37): `POST /v1/responses` (plain and streamed),
`GET` and `DELETE /v1/responses/{id}` and `GET /v1/responses/{id}/input_items`, beside the chat
and completion routes of http_app.py.

A request's `input` (and, with `previous_response_id`, its stored chain: SH-5) is rendered by the
model's chat template, submitted like a chat request and read back by the same output parser; a
stored answer is what a later turn's `previous_response_id` names and what GET returns. Every
refusal comes before any generation, as an HTTP error; a streamed request's engine failure is
its `response.failed` event. A client that leaves cancels its request, streamed or not.

The stream helpers are this module's own, not http_app's: http_app imports this module, and the
import graph has no cycles (tests/test_import_graph.py).
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from ninfer_jax.frontend.errors import InputTooLongError, UnknownResponseError
from ninfer_jax.frontend.output_parser import THINK_CLOSE, THINK_OPEN, OutputStream
from server import openai_convert as oc
from server import responses_convert as rc
from server.openai_schema import ResponsesRequest

log = logging.getLogger("ninfer.http")


def install(app: FastAPI, front, submit: Callable[[Callable[[], Any]], Any]) -> None:
    """Add the Responses routes to `app` (`front`: the OpenAIFront; `submit`: http_app's wrapper
    that turns a submission's refusal into its API error)."""

    async def locked(fn: Callable[[], Any]):
        """`fn` on the store, under its lock, on a worker thread (a persistent store writes files)."""
        def run():
            with front.store_lock:
                return fn()
        return await asyncio.to_thread(run)

    async def stored(response_id: str, fn: Callable[[str], Any]):
        """`fn(response_id)` on the store; a response that is gone (unknown, deleted, evicted,
        expired) is a 404 saying why."""
        try:
            return await locked(lambda: fn(response_id))
        except UnknownResponseError as exc:
            raise oc.ApiError(404, str(exc), param="response_id", code="response_not_found") from None

    @app.post("/v1/responses")
    async def responses(request: Request):
        engine, req, max_context = await front.accept(request, ResponsesRequest)
        rc.refuse_unserved(req)
        tools = submit(lambda: rc.responses_tools(req.tools))
        structured = rc.responses_structured(req, tools)

        def run():
            sampling = oc.sampling_of(req, max_tokens=req.max_output_tokens, logprobs=0, limits=front.limits,
                                      max_context=max_context, structured=structured,
                                      defaults=front.generation_defaults)
            frontend = engine.chat_frontend()
            kwargs = rc.template_kwargs(req, getattr(frontend.template, "source", None))
            try:
                with front.store_lock:
                    rendered = frontend.render_responses(
                        req.input, store=front.store, previous_response_id=req.previous_response_id,
                        instructions=req.instructions, tools=tools, cache_markers=req.cache_markers,
                        template_kwargs=kwargs, truncation=req.truncation or "disabled")
            except InputTooLongError as exc:
                hint = ("" if req.truncation == "auto" else
                        "; truncation is 'disabled': send truncation 'auto' to drop the oldest turns")
                raise oc.ApiError(400, f"input: {exc} (the model's context is {max_context} tokens){hint}",
                                  param="input", code="context_length_exceeded") from None
            handle = engine.submit_rendered(rendered.prompt, sampling=sampling, request_id=rid,
                                            session=req.session or None)
            return rendered, handle, frontend.tokenizer.token_to_id(THINK_CLOSE)

        rid = front.request_id(request, "resp", rc.new_id)
        created = int(time.time())
        rendered, handle, close_id = await asyncio.to_thread(submit, run)
        think = (rendered.prompt.text or "").rstrip().endswith(THINK_OPEN)
        parse_tools = req.tool_choice != "none"

        def snapshot(status: str, **fields) -> dict:
            return rc.response_object(rid, req.model, req, created_at=created, status=status, **fields)

        def answer(done, out: OutputStream, output: list[dict]) -> dict:
            status = {"length": "incomplete", "cancelled": "cancelled"}.get(done.finish_reason, "completed")
            return snapshot(status, output=output,
                            usage=rc.usage(done, rc.reasoning_tokens(done, out.parsed(), close_id)))

        async def keep(obj: dict) -> None:
            """Store a finished answer (SH-5: the next turn names it by its id; GET returns it)."""
            if not req.store or obj["status"] not in ("completed", "incomplete"):
                return
            try:
                await locked(lambda: front.store.put(
                    rid, input_items=rendered.raw_input, output_items=rc.stored_output(obj["output"]),
                    previous_response_id=req.previous_response_id, response=obj))
            except UnknownResponseError as exc:  # its parent went while it generated: it cannot chain
                log.warning("response %r not stored: %s", rid, exc)

        q = front.relay(handle)
        if req.stream:
            return StreamingResponse(_stream(handle, q, snapshot, answer, keep, think, parse_tools),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        done = await front.completion(handle, q, request)
        out = OutputStream(think_open=think, tool_calls=parse_tools)
        out.push(done.text)
        parsed = out.parsed()
        obj = answer(done, out, rc.response_output(parsed, done.finish_reason == "length"))
        await keep(obj)
        return obj

    @app.get("/v1/responses/{response_id}")
    async def retrieve(response_id: str, request: Request):
        front.authorize(request)
        if request.query_params.get("stream", "false").lower() not in ("false", "0"):
            raise oc.unsupported("stream", "a stored response is not replayed as a stream")
        kept = await stored(response_id, front.store.get)
        if kept.response is None:
            raise oc.ApiError(404, f"response {response_id!r} has no stored response object", param="response_id",
                              code="response_not_found")
        return kept.response

    @app.delete("/v1/responses/{response_id}")
    async def delete(response_id: str, request: Request):
        front.authorize(request)
        await stored(response_id, front.store.delete)
        return {"id": response_id, "object": "response", "deleted": True}

    @app.get("/v1/responses/{response_id}/input_items")
    async def input_items(response_id: str, request: Request):
        front.authorize(request)
        query = request.query_params
        limit = query.get("limit", "20")
        if not (limit.isdigit() and 1 <= int(limit) <= 100):
            raise oc.ApiError(400, f"limit: an integer in [1, 100] expected, got {limit!r}", param="limit")
        order = query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise oc.ApiError(400, f"order: 'asc' or 'desc' expected, got {order!r}", param="order")
        kept = await stored(response_id, front.store.get)
        return rc.page(rc.input_listing(response_id, kept.input_items), limit=int(limit), order=order,
                       after=query.get("after"), before=query.get("before"))


def _sse(obj: dict) -> bytes:
    """One event as OpenAI sends it: an `event:` line naming its type, then its JSON."""
    kind = obj.get("type", "error")
    return f"event: {kind}\ndata: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()


async def _stream(handle, q: asyncio.Queue, snapshot, answer, keep, think: bool, parse_tools: bool):
    """The Responses event sequence: response.created and response.in_progress, each output
    item's events as the text comes (`rc.OutputEvents`), then response.completed (or
    response.incomplete, cut by max_output_tokens) with the whole response, stored first; an
    engine failure is response.failed. A client that leaves cancels the request."""
    ended = False
    try:
        events = rc.OutputEvents()
        for kind in ("response.created", "response.in_progress"):
            yield _sse(events.event(kind, response=snapshot("in_progress", output=[])))
        out = OutputStream(think_open=think, tool_calls=parse_tools)
        while True:
            kind, item = await q.get()
            if kind == "delta":
                for event in events.text(*out.push(item.text)):
                    yield _sse(event)
                continue
            if kind == "error" or item.finish_reason in ("error", "cancelled"):
                why = (oc.api_error(item).message if kind == "error" else
                       "the request was cancelled" if item.finish_reason == "cancelled" else
                       f"generation failed: {item.error or 'unknown error'}")
                yield _sse(events.event("response.failed", response=snapshot(
                    "failed", output=events.partial(), error={"code": "server_error", "message": why})))
                ended = True
                return
            content, reasoning, calls = out.finish()
            for event in events.finish(content, reasoning, calls, item.finish_reason == "length"):
                yield _sse(event)
            obj = answer(item, out, events.items)
            await keep(obj)
            yield _sse(events.event(f"response.{obj['status']}", response=obj))
            ended = True
            return
    finally:
        if not ended:
            handle.cancel()
