"""OpenAI's Responses API on the HTTP server (issue 37): `POST /v1/responses`, beside the chat
and completion routes of http_app.py.

A request's `input` (and, with `previous_response_id`, its stored chain: SH-5) is rendered by the
model's chat template, submitted like a chat request and read back by the same output parser; a
stored answer is what a later turn's `previous_response_id` names.
"""
from __future__ import annotations

import asyncio
from typing import Any, Callable

from fastapi import FastAPI, Request

from ninfer_jax.frontend.output_parser import THINK_OPEN, OutputStream
from server import openai_convert as oc
from server import responses_convert as rc
from server.openai_schema import ResponsesRequest


def install(app: FastAPI, front, submit: Callable[[Callable[[], Any]], Any]) -> None:
    """Add the Responses routes to `app` (`front`: the OpenAIFront; `submit`: http_app's wrapper
    that turns a submission's refusal into its API error)."""

    @app.post("/v1/responses")
    async def responses(request: Request):
        engine, req, max_context = await front.accept(request, ResponsesRequest)
        if req.stream:
            raise oc.unsupported("stream", "streamed Responses are not served yet; use /v1/chat/completions to stream")
        oc.refuse_unserved(req)
        tools = submit(lambda: rc.responses_tools(req.tools))
        structured = rc.responses_structured(req, tools)

        def run():
            sampling = oc.sampling_of(req, max_tokens=req.max_output_tokens, logprobs=0, limits=front.limits,
                                      max_context=max_context, structured=structured)
            with front.store_lock:
                rendered = engine.chat_frontend().render_responses(
                    req.input, store=front.store, previous_response_id=req.previous_response_id,
                    instructions=req.instructions, tools=tools, cache_markers=req.cache_markers)
            handle = engine.submit_rendered(rendered.prompt, sampling=sampling, request_id=rid,
                                            session=req.session or None)
            return rendered, handle

        rid = front.request_id(request, "resp")
        rendered, handle = await asyncio.to_thread(submit, run)
        think = (rendered.prompt.text or "").rstrip().endswith(THINK_OPEN)
        q = front.relay(handle)
        done = await front.completion(handle, q, request)
        out = OutputStream(think_open=think, tool_calls=req.tool_choice != "none")
        out.push(done.text)
        parsed = out.parsed()
        items = rc.response_output(parsed)
        if req.store:  # SH-5: the next turn names this one by its id
            with front.store_lock:
                front.store.put(rid, input_items=rendered.raw_input, output_items=rc.stored_output(items),
                                previous_response_id=req.previous_response_id)
        return rc.response_object(rid, front.model_name, done, items, req)
