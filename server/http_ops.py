"""Operations endpoints and request ids of the HTTP server (issue 37), beside http_app.py's API
routes: `GET /v1/models/{id}`, vLLM's `POST /tokenize` and `/detokenize`, and `RequestIds`, the
middleware that puts every answer's `X-Request-Id` on it (docs/http.md, Request ids)."""
from __future__ import annotations

import asyncio
import re
from typing import Any, Callable

from fastapi import FastAPI, Request

from server import openai_convert as oc
from server.openai_schema import DetokenizeRequest, TokenizeRequest

REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


class RequestIds:
    """ASGI middleware: every HTTP answer, plain or streamed, carries `X-Request-Id` — the id the
    route used for the request (`OpenAIFront.request_id`), else the one the client sent, else a
    new one. Pure ASGI (it only adds a header to the response's start), so a route still sees its
    client's disconnect."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        state = scope.setdefault("state", {})
        given = next((v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"x-request-id"), None)

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                rid = state.get("request_id") or (given if given and REQUEST_ID.fullmatch(given) else None) \
                    or oc.new_id("req")
                message = dict(message, headers=[*message.get("headers", ()), (b"x-request-id", rid.encode())])
            await send(message)

        await self.app(scope, receive, send_with_id)


async def _aux_request(front, request: Request, model_cls):
    """The token, a ready engine and the body of a /tokenize or /detokenize call (its model, if
    named, must be this server's)."""
    front.authorize(request)
    engine = front.ready_engine()
    req = front.validate(model_cls, await front.json_body(request))
    if req.model is not None:
        front.check_model(req.model)
    return engine, req


def install(app: FastAPI, front, submit: Callable[[Callable[[], Any]], Any]) -> None:
    """Add the operations routes to `app` (`front`: the OpenAIFront; `submit`: http_app's wrapper
    that turns a refusal into its API error)."""

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str, request: Request):
        front.authorize(request)
        engine = front.ready_engine()
        if model_id != front.model_name:
            raise oc.ApiError(404, f"the model {model_id!r} does not exist; this server serves {front.model_name!r}",
                              param="model", code="model_not_found")
        return {"id": front.model_name, "object": "model", "created": front.created, "owned_by": "ninfer",
                "max_model_len": int(engine.model_info().get("max_context", 0))}

    @app.post("/tokenize")
    async def tokenize(request: Request):
        """vLLM's: `{"prompt": text}` or `{"messages": [...], "tools"?: [...]}` (the prompt the
        chat template renders, generation prompt included) -> the token ids and their count."""
        engine, req = await _aux_request(front, request, TokenizeRequest)
        if (req.prompt is None) == (req.messages is None):
            raise oc.ApiError(400, "tokenize: send either prompt or messages", param="prompt")

        def run():
            if req.prompt is not None:
                front.limits.check_chars(len(req.prompt), "prompt")
                return list(engine.tokenizer.encode(req.prompt))
            return list(engine.chat_frontend().render_chat(req.messages, tools=req.tools or None).token_ids)

        ids = await asyncio.to_thread(submit, run)
        return {"count": len(ids), "max_model_len": int(engine.model_info()["max_context"]), "tokens": ids}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        """vLLM's: `{"tokens": [ids]}` -> `{"prompt": text}` (ids outside the vocabulary: 400)."""
        engine, req = await _aux_request(front, request, DetokenizeRequest)
        vocab = int(engine.model_info().get("vocab_size") or 0)
        bad = next((t for t in req.tokens if t < 0 or (vocab and t >= vocab)), None)
        if bad is not None:
            raise oc.ApiError(400, f"tokens: id {bad} outside the vocabulary [0, {vocab})", param="tokens")
        return {"prompt": await asyncio.to_thread(submit, lambda: engine.tokenizer_decode(req.tokens))}
