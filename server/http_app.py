"""The OpenAI-compatible HTTP API on FastAPI: `/v1/chat/completions`, `/v1/completions`,
`/v1/responses`, `/v1/models`, `/health`, `/metrics` (docs/http.md); Anthropic's `/v1/messages`
and `/v1/messages/count_tokens` beside them (server/anthropic_routes.py).

`OpenAIFront` holds what the routes share: the engine (attached after warm-up, like the gRPC
servicer), the bearer token, the limits, the Responses store and the requests now running.
Every request is checked whole before it reaches the engine (body size, JSON, the pydantic
model, the model name, the engine's own checks at submission); a refusal is the API's error
object with its HTTP status. Rendering and tokenising run on worker threads, not the event
loop, so a long prompt does not hold up other streams. Each running request has a relay thread that moves its deltas
from the engine's handle onto the event loop, so no worker thread blocks on a request that
is still queued. A request ends in the engine when its client goes: a disconnected stream
(Starlette cancels the generator) or a client that leaves a non-streaming call (a task waits for
the disconnect beside the output) cancels it.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
import threading
import time
import weakref
from typing import Any, AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from ninfer_jax.frontend.output_parser import THINK_OPEN, OutputStream
from ninfer_jax.frontend.responses import ResponsesStore
from server import anthropic_routes, http_ops, responses_routes
from server import openai_convert as oc
from server.http_settings import HttpSettings
from server.limits import ServerLimits
from server.metrics import registry_for
from server.request_log import RequestLog
from server.running import RunningRequests
from server.openai_schema import ChatCompletionRequest, CompletionRequest
from server.validate import WARMING_UP

log = logging.getLogger("ninfer.http")


class OpenAIFront(RunningRequests):
    def __init__(self, limits: ServerLimits | None = None, *, token: str | None = None,
                 settings: HttpSettings | None = None):
        super().__init__()
        self.limits = limits or ServerLimits()
        self.settings = settings or HttpSettings()
        self.engine: Any = None
        self.token = token
        self.generation_defaults: dict = {}  # the checkpoint's sampling defaults, set by `attach`
        # Each HTTP request's Traffic by request id, for the relay threads (gone with the request)
        self._traffic: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self.request_log = RequestLog(self.settings.request_log) if self.settings.request_log else None
        self.store = ResponsesStore(self.settings.max_responses, max_bytes=self.settings.responses_max_bytes,
                                    ttl_s=self.settings.responses_ttl_s, directory=self.settings.responses_store)
        self.store_lock = threading.Lock()  # submissions render on worker threads
        self.created = int(time.time())
        self.registry = registry_for(lambda: self.engine)

    # --- lifecycle (called by server.app.InferenceServer) -------------------------------------
    def attach(self, engine: Any) -> None:
        get = getattr(engine, "generation_defaults", None)
        self.generation_defaults = dict(get()) if get is not None else {}
        self.engine = engine

    def close(self) -> None:
        """The request log's file (after the last request ended)."""
        if self.request_log is not None:
            self.request_log.close()

    # --- shared checks ------------------------------------------------------------------------
    @property
    def model_names(self) -> tuple[str, ...]:
        """The names a request's `model` may give (`--served_model_name`, else the model's own)."""
        if self.settings.served_model_names:
            return self.settings.served_model_names
        return (str(self.engine.model_info().get("name", "")),) if self.engine is not None else ()

    @property
    def model_name(self) -> str:
        """The first served name (the one an answer reports when no request named one)."""
        return next(iter(self.model_names), "")

    def authorize(self, request: Request) -> None:
        """The bearer token (`Authorization: Bearer <token>`) or, as Anthropic's clients send it,
        `x-api-key: <token>`."""
        if self.token is None:
            return
        supplied = request.headers.get("authorization", "")
        key = request.headers.get("x-api-key")
        if key is not None and hmac.compare_digest(key.encode(), self.token.encode()):
            return
        if not hmac.compare_digest(supplied.encode(), f"Bearer {self.token}".encode()):
            why = ("missing bearer token (header 'Authorization: Bearer <token>' or 'x-api-key: <token>')"
                   if not supplied and key is None else "wrong bearer token or API key")
            raise oc.ApiError(401, why, type="authentication_error", code="invalid_api_key")

    def ready_engine(self):
        if self._closing:
            raise oc.ApiError(503, "server is shutting down", type="server_error", code="unavailable")
        if self.engine is None:
            raise oc.ApiError(503, WARMING_UP, type="server_error", code="unavailable")
        failure = getattr(self.engine, "failure", None)
        if failure is not None:
            raise oc.ApiError(503, f"the engine failed and takes no requests: {failure}", type="server_error",
                              code="unavailable")
        return self.engine

    async def accept(self, request: Request, model_cls):
        """Every check a generation request passes before any work: the token, a ready engine,
        its body as `model_cls`. Returns (engine, the request, the engine's max_context)."""
        self.authorize(request)
        engine = self.ready_engine()
        req = await self.body(request, model_cls)
        return engine, req, int(engine.model_info()["max_context"])

    async def body(self, request: Request, model_cls):
        """The request body as `model_cls`: 413 past the size limit, 400 for bad JSON or fields."""
        req = self.validate(model_cls, await self.json_body(request))
        self.check_model(req.model)
        return req

    @staticmethod
    def validate(model_cls, data: dict):
        """`data` as `model_cls`: a 400 naming the first bad field."""
        try:
            return model_cls.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            param = ".".join(str(p) for p in first["loc"]) or None
            raise oc.ApiError(400, f"{param}: {first['msg']}" if param else first["msg"], param=param) from None

    def request_id(self, request: Request, prefix: str, new: Callable[[str], str] = oc.new_id) -> str:
        """The request's id: its `X-Request-Id` header when it sends one (then the engine's request
        id as well, so logs, metrics and gRPC name the same request), else a new `prefix` id.
        Recorded for the response's `X-Request-Id` header (`RequestIds`)."""
        given = request.headers.get("x-request-id")
        if given is not None and not http_ops.REQUEST_ID.fullmatch(given):
            raise oc.ApiError(400, "X-Request-Id: 1 to 128 characters of letters, digits and ._:- expected",
                              param="X-Request-Id")
        rid = given or new(prefix)
        request.state.request_id = rid
        traffic = getattr(request.state, "traffic", None)  # AccessLog's; else one for the request log
        if traffic is None:
            traffic = request.state.traffic = http_ops.Traffic(request.url.path)
        traffic.request_id = rid
        self._traffic[rid] = traffic  # the relay of the engine request of this id finds it
        return rid

    def check_model(self, name: str) -> None:
        if name not in self.model_names:
            served = ", ".join(map(repr, self.model_names))
            raise oc.ApiError(404, f"the model {name!r} does not exist; this server serves {served}",
                              param="model", code="model_not_found")

    async def json_body(self, request: Request) -> dict:
        """The request body as a JSON object: 413 past the size limit, 415 for another content
        type, 400 for bad JSON (too deep, a lone surrogate, NaN)."""
        limit = self.limits.max_message_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise oc.ApiError(413, f"request body of {declared} bytes exceeds the server limit of {limit}",
                              code="request_too_large")
        raw = bytearray()
        try:
            async for chunk in request.stream():
                raw += chunk
                if len(raw) > limit:
                    raise oc.ApiError(413, f"request body exceeds the server limit of {limit} bytes",
                                      code="request_too_large")
        except ClientDisconnect:  # gone while sending: nobody reads an answer, nothing ran
            raise oc.ApiError(499, "client closed the connection while sending its body") from None
        kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if kind and kind != "application/json" and not kind.endswith("+json"):
            raise oc.ApiError(415, f"the body must be application/json, not {kind}", code="unsupported_media_type")
        try:
            data = json.loads(raw, parse_constant=_no_constant)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise oc.ApiError(400, f"the body is not valid JSON: {exc}", code="invalid_json") from None
        except RecursionError:  # nested past the parser's own limit
            raise oc.ApiError(400, f"the body nests deeper than {MAX_JSON_DEPTH} levels", code="invalid_json") from None
        if not isinstance(data, dict):
            raise oc.ApiError(400, "the body must be a JSON object", code="invalid_json")
        check_json(data)
        return data

    # --- running a request --------------------------------------------------------------------
    def relay(self, handle, started: asyncio.Event | None = None, traffic=None) -> asyncio.Queue:
        """A queue of ("delta", TokenDelta) items then one ("done", Completion) or ("error", exc),
        fed by a thread that reads the handle (the engine's deltas never wait for the loop).
        `started` is set at the first item (the prompt is prefilled, or the request ended). The
        thread records the first token and the Completion in the HTTP request's `traffic`
        (default: the one registered under the handle's id) and the request log (`finished`)."""
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        traffic = traffic if traffic is not None else self._traffic.get(handle.request_id)
        with self._idle:
            self._active.add(handle)

        def put(item) -> None:
            q.put_nowait(item)
            if started is not None:
                started.set()

        def run():
            try:
                for delta in handle.stream():
                    if traffic is not None and delta.token_ids:
                        traffic.token()
                    loop.call_soon_threadsafe(put, ("delta", delta))
                done = handle.result()
                self.finished(done, traffic)
                loop.call_soon_threadsafe(put, ("done", done))
            except BaseException as exc:  # noqa: BLE001 - handed to the request's coroutine
                try:
                    loop.call_soon_threadsafe(put, ("error", exc))
                except RuntimeError:
                    pass  # the loop is gone (server stopped)
            finally:
                with self._idle:
                    self._active.discard(handle)
                    self._idle.notify_all()

        threading.Thread(target=run, name=f"ninfer-http-{handle.request_id}", daemon=True).start()
        return q

    def finished(self, done, traffic) -> None:
        """An engine request ended (on its relay thread, before its route sees the end): into
        its HTTP request's traffic (the access log) and the request log."""
        if traffic is not None:
            traffic.dones.append(done)
        try:
            if self.request_log is not None:
                self.request_log.write(done, http_request_id=getattr(traffic, "request_id", None),
                                       path=getattr(traffic, "path", None))
        except Exception:  # noqa: BLE001 - the log never fails a request
            log.exception("request log: no line for %s", done.request_id)

    async def wait_done(self, handle, q: asyncio.Queue, request: Request) -> tuple[list, Any]:
        """Every delta and the completion; cancels the request the moment its client leaves (a
        task waits for the connection's `http.disconnect` beside the deltas, so a request that
        keeps generating is cancelled as promptly as a quiet one)."""
        deltas = []
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            while True:
                got = asyncio.ensure_future(q.get())
                await asyncio.wait({got, gone}, return_when=asyncio.FIRST_COMPLETED)
                if not got.done():
                    got.cancel()
                    handle.cancel()
                    raise oc.ApiError(499, "client closed the connection")
                kind, item = got.result()
                if kind == "delta":
                    deltas.append(item)
                elif kind == "done":
                    return deltas, item
                else:
                    raise item
        finally:
            gone.cancel()

    async def completion(self, handle, q: asyncio.Queue, request: Request):
        """The finished request, or the API error it ended with (its deltas are not needed)."""
        return (await self.completions([(handle, q)], request))[0]

    async def completions(self, runs: list, request: Request) -> list:
        """The finished requests of `runs` [(handle, queue)] (the n choices of one request), or the
        API error the first failing one ended with; a client that leaves cancels them all."""
        try:
            dones = []
            for handle, q in runs:  # each waits on its own queue; a disconnect cancels the rest too
                try:
                    dones.append((await self.wait_done(handle, q, request))[1])
                except BaseException:
                    for other, _ in runs:
                        other.cancel()
                    raise
        except oc.ApiError:
            raise
        except Exception as exc:  # noqa: BLE001 - an engine failure is an API error too
            raise oc.api_error(exc) from None
        failed = next((d for d in dones if d.finish_reason == "error"), None)
        if failed is not None:
            raise _engine_failed(failed)
        return dones

    async def start_choices(self, n: int, submit_one: Callable[[int], Any]) -> list:
        """Submit the n choices of one request, [(handle, relay queue)]: the first, then, once its
        prompt is prefilled (its first token, or its end), the others, which find the prompt's
        save in the cache instead of prefilling it again. A refusal cancels what was submitted."""
        runs: list = []
        try:
            for i in range(n):
                handle = await asyncio.to_thread(_submit, lambda: submit_one(i))
                started = asyncio.Event() if i == 0 and n > 1 else None
                traffic = self._traffic.get(runs[0][0].request_id) if runs else None  # choices: the first's
                runs.append((handle, self.relay(handle, started, traffic)))
                if started is not None:
                    await started.wait()
        except BaseException:
            for handle, _ in runs:
                handle.cancel()
            raise
        return runs


def _no_constant(name: str):
    """NaN and Infinity are not JSON (Python's parser takes them; no answer could carry them back)."""
    raise json.JSONDecodeError(f"{name} is not a JSON value", name, 0)


async def _disconnected(request: Request) -> None:
    """Returns when the client has gone. The body is read already, so the next ASGI message is
    the disconnect (the server sends it when the connection closes)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _sse(obj: Any) -> bytes:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()


def _engine_failed(done) -> oc.ApiError:
    return oc.ApiError(500, f"generation failed: {done.error or 'unknown error'}", type="server_error")


def _submit(fn: Callable[[], Any]):
    """Run a submission step; an exception becomes the API error it maps to."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - every refusal is an API error
        raise oc.api_error(exc) from None


MAX_JSON_DEPTH = 64  # no request needs more; deeper bodies are refused before any model is built
_SURROGATE = re.compile("[\ud800-\udfff]")


def check_json(data) -> None:
    """400 for a body nested deeper than MAX_JSON_DEPTH or holding a string with a lone UTF-16
    surrogate (valid JSON escapes, but no text: encoding it later would fail mid-request)."""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise oc.ApiError(400, f"the body nests deeper than {MAX_JSON_DEPTH} levels", code="invalid_json")
        if isinstance(value, str):
            if _SURROGATE.search(value):
                raise oc.ApiError(400, "the body holds a string with a lone UTF-16 surrogate (not text)",
                                  code="invalid_json")
        elif isinstance(value, dict):
            for k, v in value.items():
                stack.append((k, depth))
                stack.append((v, depth + 1))
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)


def build_app(front: OpenAIFront) -> FastAPI:
    app = FastAPI(title="NInfer-JAX OpenAI-compatible API", docs_url=None, redoc_url=None, openapi_url=None)
    http_ops.install_middleware(app, front.settings)

    @app.exception_handler(oc.ApiError)
    async def _api_error(request: Request, exc: oc.ApiError):
        if request.url.path.startswith(anthropic_routes.PREFIX):  # that API's own error shape
            return anthropic_routes.error_response(exc)
        return JSONResponse(exc.body(), status_code=exc.status)

    anthropic_routes.install(app, front, _submit)
    responses_routes.install(app, front, _submit)
    http_ops.install(app, front, _submit)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        # 404 (no such path), 405 (wrong method) and the like, in the API's error shape
        codes = {404: "not_found", 405: "method_not_allowed"}
        err = oc.ApiError(exc.status_code, f"{exc.detail}: {request.method} {request.url.path}",
                          code=codes.get(exc.status_code))
        if request.url.path.startswith(anthropic_routes.PREFIX):
            return anthropic_routes.error_response(err, headers=getattr(exc, "headers", None))
        return JSONResponse(err.body(), status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        log.exception("internal error in HTTP request %s", getattr(request.state, "request_id", "-"), exc_info=exc)
        err = oc.api_error(exc)
        if request.url.path.startswith(anthropic_routes.PREFIX):
            return anthropic_routes.error_response(err)
        return JSONResponse(err.body(), status_code=err.status)

    @app.get("/health")
    async def health():
        try:
            front.ready_engine()
        except oc.ApiError as exc:
            return JSONResponse({"status": "unavailable", "reason": exc.message}, status_code=503)
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics(request: Request):
        front.authorize(request)
        data = await asyncio.to_thread(generate_latest, front.registry)
        return Response(data, media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models(request: Request):
        front.authorize(request)
        engine = front.ready_engine()
        return {"object": "list", "data": [http_ops.model_card(front, name, engine) for name in front.model_names]}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        engine, req, max_context = await front.accept(request, ChatCompletionRequest)
        kwargs, sampling, top = _submit(lambda: oc.chat_request(req, front.limits, max_context,
                                                               front.generation_defaults))
        rid = front.request_id(request, "chatcmpl")

        def render():
            frontend = engine.chat_frontend()
            rendered = frontend.render_chat(kwargs["messages"], tools=kwargs["tools"],
                                            cache_markers=kwargs["cache_markers"],
                                            template_kwargs=kwargs["template_kwargs"])
            anchored = None
            if kwargs["anchors"]:
                anchored = frontend.render_chat(kwargs["messages"], tools=kwargs["tools"],
                                                cache_markers=kwargs["anchors"], marker_policy="none",
                                                template_kwargs=kwargs["template_kwargs"])
            return rendered, anchored

        rendered, anchored = await asyncio.to_thread(_submit, render)
        samplings = oc.choice_samplings(sampling, req.n or 1)
        runs = await front.start_choices(len(samplings), lambda i: engine.submit_rendered(
            rendered, sampling=samplings[i], request_id=_choice_id(rid, i), session=kwargs["session"],
            anchors=anchored, **({"prompt_anchor": True} if i == 0 and len(samplings) > 1 else {})))
        parse_tools = req.tool_choice != "none"
        think = (rendered.text or "").rstrip().endswith(THINK_OPEN)
        decode = getattr(engine, "tokenizer_decode", None)
        if not req.stream:
            dones = await front.completions(runs, request)
            parsed = []
            for done in dones:
                out = OutputStream(think_open=think, tool_calls=parse_tools)
                out.push(done.text)
                parsed.append(out.parsed())
            return oc.chat_completion(rid, req.model, dones, parsed, top, decode)
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return StreamingResponse(_chat_stream(runs, req.model, rid, think, parse_tools, top, decode, include_usage),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    @app.post("/v1/completions")
    async def completions(request: Request):
        engine, req, max_context = await front.accept(request, CompletionRequest)
        prompt, sampling, top = _submit(lambda: oc.completion_request(req, front.limits, max_context,
                                                                     front.generation_defaults))
        rid = front.request_id(request, "cmpl")
        saves = {k: v for k, v in (("session", req.session), ("anchors", req.anchors), ("markers", req.markers),
                                   ("recovery_point", req.recovery_point)) if v}
        samplings = oc.choice_samplings(sampling, req.n or 1)
        runs = await front.start_choices(len(samplings), lambda i: engine.submit(
            prompt, samplings[i], request_id=_choice_id(rid, i), **saves))
        decode = getattr(engine, "tokenizer_decode", None)
        if not req.stream:
            dones = await front.completions(runs, request)
            return oc.text_completion(rid, req.model, dones, top, decode)
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return StreamingResponse(_text_stream(runs, req.model, rid, top, decode, include_usage),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    return app


def _choice_id(rid: str, i: int) -> str:
    """The engine request id of choice i (the API's own id for the first)."""
    return rid if i == 0 else f"{rid}-{i}"


async def _merged(runs: list) -> AsyncIterator[tuple[int, str, Any]]:
    """(choice, kind, item) of every run's relay queue as they come, until each has ended."""
    gets = {asyncio.ensure_future(q.get()): i for i, (_, q) in enumerate(runs)}
    try:
        while gets:
            ready, _ = await asyncio.wait(gets, return_when=asyncio.FIRST_COMPLETED)
            for got in sorted(ready, key=gets.get):  # the same order whenever several are ready
                i = gets.pop(got)
                kind, item = got.result()
                yield i, kind, item
                if kind == "delta":
                    gets[asyncio.ensure_future(runs[i][1].get())] = i
    finally:
        for got in gets:
            got.cancel()


def _cancelling(stream):
    """Wrap a response generator: unless it ran to its end, its requests are cancelled at once
    (the client went away, or the server stops), not when the generator is collected."""
    async def run(runs, *args):
        ended = False
        try:
            async for chunk in stream(runs, *args):
                yield chunk
            ended = True
        finally:
            if not ended:
                for handle, _ in runs:
                    handle.cancel()
    return run


@_cancelling
async def _chat_stream(runs, model, rid, think, parse_tools, top, decode, include_usage):
    """The choices' chunks as they come (each names its choice's index), a finish chunk per choice,
    then the usage of all (n) and [DONE]; `model`: the name the request gave."""
    created = int(time.time())
    outs = [OutputStream(think_open=think, tool_calls=parse_tools) for _ in runs]
    dones: list = [None] * len(runs)
    for i in range(len(runs)):
        yield _sse(oc.chat_chunk(rid, model, created, {"role": "assistant", "content": ""}, index=i))
    async for i, kind, item in _merged(runs):
        if kind == "delta":
            content, reasoning = outs[i].push(item.text)
            lps = oc.chat_logprobs(item.logprobs, top, decode) if top is not None else None
            delta = {}
            if reasoning:
                delta["reasoning_content"] = reasoning
            if content:
                delta["content"] = content
            if delta or lps:
                yield _sse(oc.chat_chunk(rid, model, created, delta, logprobs=lps, index=i))
        elif kind == "done":
            if item.finish_reason == "error":
                yield _sse(_engine_failed(item).body())
                return
            dones[i] = item
            content, reasoning, calls = outs[i].finish()
            delta = {}
            if reasoning:
                delta["reasoning_content"] = reasoning
            if content:
                delta["content"] = content
            if calls:
                delta["tool_calls"] = [dict(c, index=k) for k, c in enumerate(oc.tool_calls_out(calls))]
            if delta:
                yield _sse(oc.chat_chunk(rid, model, created, delta, index=i))
            yield _sse(oc.chat_chunk(rid, model, created, {}, finish=oc.finish_reason(item, calls), index=i))
        else:
            yield _sse(oc.api_error(item).body())
            return
    if include_usage:
        yield _sse(oc.usage_chunk(rid, model, created, dones))
    yield b"data: [DONE]\n\n"


@_cancelling
async def _text_stream(runs, model, rid, top, decode, include_usage):
    created = int(time.time())
    offsets = [0] * len(runs)
    dones: list = [None] * len(runs)
    async for i, kind, item in _merged(runs):
        if kind == "delta":
            lps = oc.completion_logprobs(item.logprobs, top, decode, offsets[i]) if top is not None else None
            offsets[i] += len(item.text)
            if item.text or lps:
                yield _sse(oc.text_chunk(rid, model, created, item.text, logprobs=lps, index=i))
        elif kind == "done":
            if item.finish_reason == "error":
                yield _sse(_engine_failed(item).body())
                return
            dones[i] = item
            yield _sse(oc.text_chunk(rid, model, created, "", finish=oc.FINISH.get(item.finish_reason, "stop"),
                                     index=i))
        else:
            yield _sse(oc.api_error(item).body())
            return
    if include_usage:
        yield _sse(oc.usage_chunk(rid, model, created, dones, obj="text_completion"))
    yield b"data: [DONE]\n\n"
