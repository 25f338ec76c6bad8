"""Operations of the HTTP server (issue 37), beside http_app.py's API routes: `GET /v1/models/{id}`,
vLLM's `POST /tokenize` and `/detokenize`; the middleware (`install_middleware`): `RequestIds`,
which puts every answer's `X-Request-Id` on it, `AccessLog`, one line per request on the logger
"ninfer.http.access", and Starlette's CORS middleware with `--cors_origins`; and `Traffic`, what
one HTTP request's generations did, which the relay fills in (docs/http.md, Operations).

The middleware is pure ASGI (each only wraps `send`), so a route still sees its client's
disconnect. Order, outermost first: AccessLog (it sees the final status and id), RequestIds (a
CORS preflight gets an id too), CORS."""
from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any, Callable

from fastapi import FastAPI, Request
from starlette.middleware.cors import CORSMiddleware

from server import openai_convert as oc
from server.openai_schema import DetokenizeRequest, TokenizeRequest

REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
ACCESS = logging.getLogger("ninfer.http.access")
CORS_METHODS = ("GET", "POST", "DELETE", "OPTIONS")


class Traffic:
    """One HTTP request's generations: when it came in, when its first token came out of the
    engine, and the Completion of each engine request it ran (n choices: several). Kept in the
    request's ASGI state (`state["traffic"]`); the front finds it by request id from the relay
    threads (`OpenAIFront.relay`), which fill it in before the route sees the end."""

    __slots__ = ("path", "started", "first_token", "dones", "request_id", "__weakref__")

    def __init__(self, path: str, started: float | None = None):
        self.path = path
        self.started = time.monotonic() if started is None else started
        self.first_token: float | None = None
        self.dones: list = []
        self.request_id: str | None = None

    def token(self) -> None:
        if self.first_token is None:
            self.first_token = time.monotonic()

    def summary(self) -> str:
        """The access log's generation fields: tokens summed over the engine requests, and TTFT
        (request arrival -> its first token out of the engine); "" when nothing generated."""
        out = []
        if self.dones:
            us = [d.usage for d in self.dones]
            out.append(f"prompt_tokens={sum(u.prompt_tokens for u in us)} "
                       f"cached_tokens={sum(u.cached_tokens for u in us)} "
                       f"completion_tokens={sum(u.completion_tokens for u in us)}")
        if self.first_token is not None:
            out.append(f"ttft_s={self.first_token - self.started:.4f}")
        return " ".join(out)


class AccessLog:
    """ASGI middleware: one line per HTTP request on the logger "ninfer.http.access" (INFO) when
    its answer has ended — a stream when its last chunk went out, or the client left:

        127.0.0.1:51234 "POST /v1/chat/completions" 200 id=chatcmpl-... prompt_tokens=40 \
            cached_tokens=32 completion_tokens=16 ttft_s=0.0123 duration_s=0.1540

    The generation fields are there when the request ran one (`Traffic.summary`)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        traffic = Traffic(scope.get("path", ""))
        scope.setdefault("state", {})["traffic"] = traffic
        answer: dict = {}

        async def send_logged(message):
            if message["type"] == "http.response.start":
                answer["status"] = message["status"]
                answer["id"] = next((v.decode("latin-1") for k, v in message.get("headers", ())
                                     if k.lower() == b"x-request-id"), None)
            await send(message)

        try:
            await self.app(scope, receive, send_logged)
        finally:
            if ACCESS.isEnabledFor(logging.INFO):
                rid = answer.get("id") or scope["state"].get("request_id")  # an error no answer went out for
                ACCESS.info(access_line(scope, answer.get("status", 500), rid, traffic))


def access_line(scope, status: int, request_id: str | None, traffic: Traffic) -> str:
    client = scope.get("client")
    where = f"{client[0]}:{client[1]}" if client else "-"
    fields = [where, f'"{scope.get("method", "-")} {scope.get("path", "")}"', str(status), f"id={request_id or '-'}",
              traffic.summary(), f"duration_s={time.monotonic() - traffic.started:.4f}"]
    return " ".join(f for f in fields if f)


def install_middleware(app: FastAPI, settings) -> None:
    """RequestIds always; AccessLog unless `settings.access_log` is off; CORS with
    `settings.cors_origins` (none: no CORS headers at all). A CORS preflight (OPTIONS with
    Origin and Access-Control-Request-Method) is answered by the CORS middleware: no token."""
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.cors_origins),
                           allow_methods=list(CORS_METHODS), allow_headers=["*"], expose_headers=["X-Request-Id"])
    app.add_middleware(RequestIds)  # add_middleware puts each outside the ones before it
    if settings.access_log:
        app.add_middleware(AccessLog)


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


def model_card(front, name: str, engine) -> dict:
    """One entry of `GET /v1/models` (and `/v1/models/{id}`): a served name."""
    return {"id": name, "object": "model", "created": front.created, "owned_by": "ninfer",
            "max_model_len": int(engine.model_info().get("max_context", 0))}


def install(app: FastAPI, front, submit: Callable[[Callable[[], Any]], Any]) -> None:
    """Add the operations routes to `app` (`front`: the OpenAIFront; `submit`: http_app's wrapper
    that turns a refusal into its API error)."""

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str, request: Request):
        front.authorize(request)
        engine = front.ready_engine()
        front.check_model(model_id)
        return model_card(front, model_id, engine)

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
