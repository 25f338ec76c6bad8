"""The OpenAI-compatible HTTP API on FastAPI: `/v1/chat/completions`, `/v1/completions`,
`/v1/responses`, `/v1/models`, `/health`, `/metrics` (docs/http.md).

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
from typing import Any, AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from ninfer_jax.frontend.output_parser import THINK_OPEN, OutputStream
from ninfer_jax.frontend.responses import ResponsesStore
from server import openai_convert as oc
from server.limits import ServerLimits
from server.metrics import registry_for
from server.running import RunningRequests
from server.openai_schema import ChatCompletionRequest, CompletionRequest, ResponsesRequest
from server.validate import WARMING_UP

log = logging.getLogger("ninfer.http")


class OpenAIFront(RunningRequests):
    def __init__(self, limits: ServerLimits | None = None, *, token: str | None = None,
                 served_model_name: str | None = None, max_responses: int = 1024):
        super().__init__()
        self.limits = limits or ServerLimits()
        self.engine: Any = None
        self.token = token
        self.served_model_name = served_model_name
        self.store = ResponsesStore(max_responses)
        self.store_lock = threading.Lock()  # submissions render on worker threads
        self.created = int(time.time())
        self.registry = registry_for(lambda: self.engine)

    # --- lifecycle (called by server.app.InferenceServer) -------------------------------------
    def attach(self, engine: Any) -> None:
        self.engine = engine

    # --- shared checks ------------------------------------------------------------------------
    @property
    def model_name(self) -> str:
        if self.served_model_name:
            return self.served_model_name
        return str(self.engine.model_info().get("name", "")) if self.engine is not None else ""

    def authorize(self, request: Request) -> None:
        if self.token is None:
            return
        supplied = request.headers.get("authorization", "")
        if not hmac.compare_digest(supplied.encode(), f"Bearer {self.token}".encode()):
            why = "missing bearer token (header 'Authorization: Bearer <token>')" if not supplied else "wrong bearer token"
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
        limit = self.limits.max_message_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise oc.ApiError(413, f"request body of {declared} bytes exceeds the server limit of {limit}",
                              code="request_too_large")
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > limit:
                raise oc.ApiError(413, f"request body exceeds the server limit of {limit} bytes",
                                  code="request_too_large")
        kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if kind and kind != "application/json" and not kind.endswith("+json"):
            raise oc.ApiError(415, f"the body must be application/json, not {kind}", code="unsupported_media_type")
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise oc.ApiError(400, f"the body is not valid JSON: {exc}", code="invalid_json") from None
        except RecursionError:  # nested past the parser's own limit
            raise oc.ApiError(400, f"the body nests deeper than {MAX_JSON_DEPTH} levels", code="invalid_json") from None
        if not isinstance(data, dict):
            raise oc.ApiError(400, "the body must be a JSON object", code="invalid_json")
        check_json(data)
        try:
            req = model_cls.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            param = ".".join(str(p) for p in first["loc"]) or None
            raise oc.ApiError(400, f"{param}: {first['msg']}" if param else first["msg"], param=param) from None
        if req.model != self.model_name:
            raise oc.ApiError(404, f"the model {req.model!r} does not exist; this server serves {self.model_name!r}",
                              param="model", code="model_not_found")
        return req

    # --- running a request --------------------------------------------------------------------
    def relay(self, handle) -> asyncio.Queue:
        """A queue of ("delta", TokenDelta) items then one ("done", Completion) or ("error", exc),
        fed by a thread that reads the handle (the engine's deltas never wait for the loop)."""
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        with self._idle:
            self._active.add(handle)

        def run():
            try:
                for delta in handle.stream():
                    loop.call_soon_threadsafe(q.put_nowait, ("delta", delta))
                loop.call_soon_threadsafe(q.put_nowait, ("done", handle.result()))
            except BaseException as exc:  # noqa: BLE001 - handed to the request's coroutine
                try:
                    loop.call_soon_threadsafe(q.put_nowait, ("error", exc))
                except RuntimeError:
                    pass  # the loop is gone (server stopped)
            finally:
                with self._idle:
                    self._active.discard(handle)
                    self._idle.notify_all()

        threading.Thread(target=run, name=f"ninfer-http-{handle.request_id}", daemon=True).start()
        return q

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
        try:
            _, done = await self.wait_done(handle, q, request)
        except oc.ApiError:
            raise
        except Exception as exc:  # noqa: BLE001 - an engine failure is an API error too
            raise oc.api_error(exc) from None
        if done.finish_reason == "error":
            raise _engine_failed(done)
        return done


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

    @app.exception_handler(oc.ApiError)
    async def _api_error(request: Request, exc: oc.ApiError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        # 404 (no such path), 405 (wrong method) and the like, in the API's error shape
        codes = {404: "not_found", 405: "method_not_allowed"}
        err = oc.ApiError(exc.status_code, f"{exc.detail}: {request.method} {request.url.path}",
                          code=codes.get(exc.status_code))
        return JSONResponse(err.body(), status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        log.exception("internal error in an HTTP request", exc_info=exc)
        err = oc.api_error(exc)
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
        info = engine.model_info()
        return {"object": "list", "data": [{"id": front.model_name, "object": "model", "created": front.created,
                                            "owned_by": "ninfer", "max_model_len": int(info.get("max_context", 0))}]}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        engine, req, max_context = await front.accept(request, ChatCompletionRequest)
        kwargs, sampling, top = _submit(lambda: oc.chat_request(req, front.limits, max_context))
        rid = oc.new_id("chatcmpl")

        def submit():
            frontend = engine.chat_frontend()
            rendered = frontend.render_chat(kwargs["messages"], tools=kwargs["tools"],
                                            cache_markers=kwargs["cache_markers"],
                                            template_kwargs=kwargs["template_kwargs"])
            anchored = None
            if kwargs["anchors"]:
                anchored = frontend.render_chat(kwargs["messages"], tools=kwargs["tools"],
                                                cache_markers=kwargs["anchors"], marker_policy="none",
                                                template_kwargs=kwargs["template_kwargs"])
            handle = engine.submit_rendered(rendered, sampling=sampling, request_id=rid, session=kwargs["session"],
                                            anchors=anchored)
            return rendered, handle

        rendered, handle = await asyncio.to_thread(_submit, submit)
        parse_tools = req.tool_choice != "none"
        think = (rendered.text or "").rstrip().endswith(THINK_OPEN)
        decode = getattr(engine, "tokenizer_decode", None)
        q = front.relay(handle)
        if not req.stream:
            done = await front.completion(handle, q, request)
            out = OutputStream(think_open=think, tool_calls=parse_tools)
            out.push(done.text)
            parsed = out.parsed()
            return oc.chat_completion(rid, front.model_name, done, parsed, top, decode)
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return StreamingResponse(_chat_stream(handle, front, q, rid, think, parse_tools, top, decode, include_usage),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    @app.post("/v1/completions")
    async def completions(request: Request):
        engine, req, max_context = await front.accept(request, CompletionRequest)
        prompt, sampling, top = _submit(lambda: oc.completion_request(req, front.limits, max_context))
        rid = oc.new_id("cmpl")
        saves = {k: v for k, v in (("session", req.session), ("anchors", req.anchors), ("markers", req.markers),
                                   ("recovery_point", req.recovery_point)) if v}
        handle = await asyncio.to_thread(_submit, lambda: engine.submit(prompt, sampling, request_id=rid,
                                                                             **saves))
        decode = getattr(engine, "tokenizer_decode", None)
        q = front.relay(handle)
        if not req.stream:
            done = await front.completion(handle, q, request)
            return oc.text_completion(rid, front.model_name, done, top, decode)
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return StreamingResponse(_text_stream(handle, front, q, rid, top, decode, include_usage),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    @app.post("/v1/responses")
    async def responses(request: Request):
        engine, req, max_context = await front.accept(request, ResponsesRequest)
        if req.stream:
            raise oc.unsupported("stream", "streamed Responses are not served yet; use /v1/chat/completions to stream")
        oc.refuse_unserved(req)
        tools = _submit(lambda: oc.responses_tools(req.tools))
        structured = oc.responses_structured(req, tools)

        def submit():
            sampling = oc.sampling_of(req, max_tokens=req.max_output_tokens, logprobs=0, limits=front.limits,
                                      max_context=max_context, structured=structured)
            with front.store_lock:
                rendered = engine.chat_frontend().render_responses(
                    req.input, store=front.store, previous_response_id=req.previous_response_id,
                    instructions=req.instructions, tools=tools, cache_markers=req.cache_markers)
            handle = engine.submit_rendered(rendered.prompt, sampling=sampling, request_id=rid,
                                            session=req.session or None)
            return rendered, handle

        rid = oc.new_id("resp")
        rendered, handle = await asyncio.to_thread(_submit, submit)
        think = (rendered.prompt.text or "").rstrip().endswith(THINK_OPEN)
        q = front.relay(handle)
        done = await front.completion(handle, q, request)
        out = OutputStream(think_open=think, tool_calls=req.tool_choice != "none")
        out.push(done.text)
        parsed = out.parsed()
        items = oc.response_output(parsed)
        if req.store:  # SH-5: the next turn names this one by its id
            with front.store_lock:
                front.store.put(rid, input_items=rendered.raw_input, output_items=oc.stored_output(items),
                                previous_response_id=req.previous_response_id)
        return oc.response_object(rid, front.model_name, done, items, req)

    return app


async def _events(handle, q: asyncio.Queue) -> AsyncIterator[tuple[str, Any]]:
    """The relay's items, up to and including the end."""
    while True:
        kind, item = await q.get()
        yield kind, item
        if kind != "delta":
            return


def _cancelling(stream):
    """Wrap a response generator: unless it ran to its end, its request is cancelled at once
    (the client went away, or the server stops), not when the generator is collected."""
    async def run(handle, *args):
        ended = False
        try:
            async for chunk in stream(handle, *args):
                yield chunk
            ended = True
        finally:
            if not ended:
                handle.cancel()
    return run


@_cancelling
async def _chat_stream(handle, front, q, rid, think, parse_tools, top, decode, include_usage):
    model, created = front.model_name, int(time.time())
    out = OutputStream(think_open=think, tool_calls=parse_tools)
    yield _sse(oc.chat_chunk(rid, model, created, {"role": "assistant", "content": ""}))
    async for kind, item in _events(handle, q):
        if kind == "delta":
            content, reasoning = out.push(item.text)
            lps = oc.chat_logprobs(item.logprobs, top, decode) if top is not None else None
            delta = {}
            if reasoning:
                delta["reasoning_content"] = reasoning
            if content:
                delta["content"] = content
            if delta or lps:
                yield _sse(oc.chat_chunk(rid, model, created, delta, logprobs=lps))
        elif kind == "done":
            if item.finish_reason == "error":
                yield _sse(_engine_failed(item).body())
                return
            content, reasoning, calls = out.finish()
            delta = {}
            if reasoning:
                delta["reasoning_content"] = reasoning
            if content:
                delta["content"] = content
            if calls:
                delta["tool_calls"] = [dict(c, index=i) for i, c in enumerate(oc.tool_calls_out(calls))]
            if delta:
                yield _sse(oc.chat_chunk(rid, model, created, delta))
            yield _sse(oc.chat_chunk(rid, model, created, {}, finish=oc.finish_reason(item, calls)))
            if include_usage:
                yield _sse(oc.usage_chunk(rid, model, created, item))
            yield b"data: [DONE]\n\n"
        else:
            yield _sse(oc.api_error(item).body())
            return


@_cancelling
async def _text_stream(handle, front, q, rid, top, decode, include_usage):
    model, created = front.model_name, int(time.time())
    offset = 0
    async for kind, item in _events(handle, q):
        if kind == "delta":
            lps = oc.completion_logprobs(item.logprobs, top, decode, offset) if top is not None else None
            offset += len(item.text)
            if item.text or lps:
                yield _sse(oc.text_chunk(rid, model, created, item.text, logprobs=lps))
        elif kind == "done":
            if item.finish_reason == "error":
                yield _sse(_engine_failed(item).body())
                return
            yield _sse(oc.text_chunk(rid, model, created, "", finish=oc.FINISH.get(item.finish_reason, "stop")))
            if include_usage:
                yield _sse(oc.usage_chunk(rid, model, created, item, obj="text_completion"))
            yield b"data: [DONE]\n\n"
        else:
            yield _sse(oc.api_error(item).body())
            return
