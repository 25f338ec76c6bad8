"""Anthropic's Messages API on the HTTP server (issue 37): `POST /v1/messages` (plain and
streamed) and `POST /v1/messages/count_tokens`, beside the OpenAI routes of http_app.py.

A Messages body is checked whole (the shared body checks, then anthropic_convert's), rendered by
the model's chat template like a chat request, submitted with the same engine call and read back
with the same output parser. Every error, on these paths, is Anthropic's error object
(`error_response`); a full queue is its 529 `overloaded_error`. A client that leaves cancels
its request, streamed or not.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from ninfer_jax.frontend.output_parser import THINK_OPEN, OutputStream
from server import anthropic_convert as ac

PREFIX = "/v1/messages"


def error_response(exc: BaseException, headers=None) -> JSONResponse:
    err = ac.AnthropicError.of(exc)
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


def install(app: FastAPI, front, submit: Callable[[Callable[[], Any]], Any]) -> None:
    """Add the Messages routes to `app` (`front`: the OpenAIFront; `submit`: http_app's wrapper
    that turns a submission's refusal into its API error)."""

    async def accept(request: Request, model_cls):
        front.authorize(request)
        engine = front.ready_engine()
        req = ac.parse(model_cls, await front.json_body(request))
        front.check_model(req.model)
        ac.refuse_unserved(req)
        return engine, req

    def render(engine, chat: dict):
        return engine.chat_frontend().render_chat(chat["messages"], tools=chat["tools"],
                                                  marker_policy=chat["marker_policy"],
                                                  template_kwargs=chat["template_kwargs"])

    @app.post(PREFIX + "/count_tokens")
    async def count_tokens(request: Request):
        try:
            engine, req = await accept(request, ac.CountTokensRequest)
            chat = ac.chat_of(req)
            rendered = await asyncio.to_thread(submit, lambda: render(engine, chat))
        except Exception as exc:  # noqa: BLE001 - every refusal in Anthropic's shape
            return error_response(exc)
        return {"input_tokens": len(rendered.token_ids)}

    @app.post(PREFIX)
    async def messages(request: Request):
        try:
            engine, req = await accept(request, ac.MessagesRequest)
            chat = ac.chat_of(req)
            max_context = int(engine.model_info()["max_context"])
            sampling = submit(lambda: ac.sampling_of(req, chat, front.limits, max_context,
                                                     front.generation_defaults))
            rendered = await asyncio.to_thread(submit, lambda: render(engine, chat))
            mid = front.request_id(request, "msg", ac.new_id)
            handle = await asyncio.to_thread(submit, lambda: engine.submit_rendered(
                rendered, sampling=sampling, request_id=mid))
        except Exception as exc:  # noqa: BLE001
            return error_response(exc)
        think = (rendered.text or "").rstrip().endswith(THINK_OPEN)
        q = front.relay(handle)
        if not req.stream:
            try:
                done = await front.completion(handle, q, request)
            except Exception as exc:  # noqa: BLE001
                return error_response(exc)
            out = OutputStream(think_open=think, tool_calls=chat["read_calls"])
            out.push(done.text)
            return ac.message(mid, req.model, done, out.parsed(), chat["omit_thinking"])
        return StreamingResponse(_stream(handle, q, mid, req.model, len(rendered.token_ids), think,
                                         chat["read_calls"], chat["omit_thinking"]),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


class _Blocks:
    """The open content block of a stream: one at a time, indexed in order."""

    def __init__(self):
        self.index = -1
        self.open: str | None = None

    def start(self, kind: str, block: dict) -> list[bytes]:
        out = self.stop()
        self.index += 1
        self.open = kind
        return out + [ac.event("content_block_start", index=self.index, content_block=block)]

    def delta(self, delta: dict) -> bytes:
        return ac.event("content_block_delta", index=self.index, delta=delta)

    def stop(self) -> list[bytes]:
        if self.open is None:
            return []
        out = []
        if self.open == "thinking":
            out.append(self.delta({"type": "signature_delta", "signature": ""}))
        self.open = None
        return out + [ac.event("content_block_stop", index=self.index)]


async def _stream(handle, q: asyncio.Queue, mid: str, model: str, prompt_tokens: int, think: bool, read_calls: bool,
                  omit_thinking: bool):
    """Anthropic's event sequence: message_start, ping, each content block (start, deltas, stop:
    thinking, text, then each tool_use with its input as one input_json_delta), message_delta
    with the stop reason and usage, message_stop. An engine error ends the stream with an
    `error` event; a client that leaves cancels the request."""
    ended = False
    try:
        yield ac.event("message_start", message={
            "id": mid, "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": prompt_tokens, "output_tokens": 0, "cache_read_input_tokens": 0,
                      "cache_creation_input_tokens": 0}})
        yield ac.event("ping")
        out = OutputStream(think_open=think, tool_calls=read_calls)
        blocks = _Blocks()

        def emit(content: str, reasoning: str) -> list[bytes]:
            chunks = []
            if reasoning:
                if blocks.open != "thinking":
                    chunks += blocks.start("thinking", {"type": "thinking", "thinking": "", "signature": ""})
                if not omit_thinking:
                    chunks.append(blocks.delta({"type": "thinking_delta", "thinking": reasoning}))
            if content:
                if blocks.open != "text":
                    chunks += blocks.start("text", {"type": "text", "text": ""})
                chunks.append(blocks.delta({"type": "text_delta", "text": content}))
            return chunks

        while True:
            kind, item = await q.get()
            if kind == "delta":
                for chunk in emit(*out.push(item.text)):
                    yield chunk
                continue
            if kind == "error" or item.finish_reason == "error":
                err = ac.AnthropicError.of(item) if kind == "error" else ac.AnthropicError(
                    500, f"generation failed: {item.error or 'unknown error'}")
                yield ac.event("error", error=err.body()["error"])
                ended = True
                return
            content, reasoning, calls = out.finish()
            for chunk in emit(content, reasoning):
                yield chunk
            if blocks.index < 0 and not calls:  # an empty answer still has its (empty) text block
                for chunk in blocks.start("text", {"type": "text", "text": ""}):
                    yield chunk
            for call in ac.tool_use_blocks(calls):
                for chunk in blocks.start("tool_use", dict(call, input={})):
                    yield chunk
                yield blocks.delta({"type": "input_json_delta", "partial_json": json.dumps(call["input"])})
            for chunk in blocks.stop():
                yield chunk
            reason, sequence = ac.stop_reason(item, calls)
            yield ac.event("message_delta", delta={"stop_reason": reason, "stop_sequence": sequence},
                           usage=ac.usage(item))
            yield ac.event("message_stop")
            ended = True
            return
    finally:
        if not ended:
            handle.cancel()
