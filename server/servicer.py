"""The `ninfer.v1.NInfer` servicer: RPCs over an engine with the `ninfer_jax.Engine` surface.

Every streaming RPC registers its request handle while it runs. The handle is cancelled when the
call ends for any reason other than normal completion (client cancel, disconnect, deadline,
server shutdown), through both the call's termination callback and the generator's `finally`,
so the engine frees the request's resources at once. Before the engine exists (warm-up) and
once draining starts (shutdown) every RPC answers UNAVAILABLE; after the engine failed (TXN-2:
its cleanup ended every request with an error, so open streams end INTERNAL) new requests
answer UNAVAILABLE too, while GetStats and GetModelInfo still answer.
"""
from __future__ import annotations

import logging
import uuid
from typing import Any, Callable, Iterator

import grpc

from server import convert
from server.errors import DuplicateRequestId, status_for
from server.limits import ServerLimits
from server.running import RunningRequests
from server.proto import ninfer_pb2 as pb
from server.proto import ninfer_pb2_grpc as pb_grpc
from server.validate import WARMING_UP

log = logging.getLogger("ninfer.server")


def generation_defaults(engine) -> dict:
    """The engine's sampling defaults (a checkpoint's generation_config.json), {} for an engine
    that has none to tell."""
    get = getattr(engine, "generation_defaults", None)
    return dict(get()) if get is not None else {}


SERVER_VERSION = "ninfer.v1/0.1.0"


class NInferServicer(RunningRequests, pb_grpc.NInferServicer):
    def __init__(self, limits: ServerLimits | None = None):
        RunningRequests.__init__(self)
        self.limits = limits or ServerLimits()
        self.engine: Any = None  # set once warm-up finishes
        self._ids: set[str] = set()  # request ids of the streams now running here
        self._max_context = 0
        self._defaults: dict = {}  # the checkpoint's sampling defaults (generation_config.json)

    # --- lifecycle ---------------------------------------------------------------------------
    def attach(self, engine: Any) -> None:
        self._max_context = int(engine.model_info()["max_context"])
        self._defaults = generation_defaults(engine)
        self.engine = engine

    # --- helpers -----------------------------------------------------------------------------
    def _engine(self, context: grpc.ServicerContext, *, observe: bool = False):
        if self._closing:
            context.abort(grpc.StatusCode.UNAVAILABLE, "server is shutting down")
        if self.engine is None:
            context.abort(grpc.StatusCode.UNAVAILABLE, WARMING_UP)  # a waiting client looks for it
        failure = getattr(self.engine, "failure", None)  # TXN-2: set once by the engine's failure cleanup
        if failure is not None and not observe:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"the engine failed and takes no requests: {failure}")
        return self.engine

    @staticmethod
    def _fail(context: grpc.ServicerContext, exc: BaseException):
        code, message = status_for(exc)
        if code == grpc.StatusCode.INTERNAL:
            log.exception("internal error in an RPC", exc_info=exc)
        context.abort(code, message)

    def _call(self, context, fn: Callable[[], Any]):
        try:
            return fn()
        except Exception as exc:  # every failure becomes a status; abort raises
            self._fail(context, exc)

    def _submit(self, requested_id: str, submit: Callable[[str], Any]):
        """Reserve a request id unique among this server's running requests, then submit.

        The engine cancels by id, so two running requests must never share one: a caller's id is
        refused while it is in use (ALREADY_EXISTS), and ids the server picks cannot collide."""
        rid = self.limits.check_request_id(requested_id) or f"rpc-{uuid.uuid4().hex}"
        with self._idle:
            if rid in self._ids:
                raise DuplicateRequestId(f"request_id: {rid!r} names a request that is still running")
            self._ids.add(rid)
        try:
            handle = submit(rid)
        except BaseException:
            with self._idle:
                self._ids.discard(rid)
            raise
        if handle.request_id != rid:  # an engine that renamed it: track the name it streams under
            with self._idle:
                self._ids.discard(rid)
                self._ids.add(handle.request_id)
        return handle

    def _stream(self, handle, context: grpc.ServicerContext, response_cls, *, chat: bool) -> Iterator:
        """Relay the handle's deltas, then the final message; cancel the request if cut short."""
        finished = False
        failure: BaseException | None = None
        done = None
        with self._idle:
            self._active.add(handle)
        try:
            context.add_callback(lambda: finished or handle.cancel())
            if not context.is_active():  # the caller left before the callback was in place
                handle.cancel()
            for delta in handle.stream():
                yield response_cls(**convert.delta_fields(handle.request_id, delta))
            done = handle.result()
            if done.finish_reason != "error":
                final = convert.final_fields(done)
                if chat:
                    final["message"] = convert.assistant_to_proto(done.text)
                finished = True
                yield response_cls(**final)
        except Exception as exc:  # noqa: BLE001 - reported as a status below, after clean-up
            failure = exc
        finally:
            if not finished:
                handle.cancel()
            with self._idle:
                self._active.discard(handle)
                self._ids.discard(handle.request_id)
                self._idle.notify_all()
        # context.abort raises, so it runs only after the clean-up above.
        if failure is not None:
            self._fail(context, failure)
        if done is not None and done.finish_reason == "error":
            context.abort(grpc.StatusCode.INTERNAL, f"generation failed: {done.error or 'unknown error'}")

    # --- RPCs --------------------------------------------------------------------------------
    def Generate(self, request: pb.GenerateRequest, context):
        engine = self._engine(context)

        def submit():
            prompt = convert.prompt_from_proto(request, self.limits)
            sampling = convert.sampling_from_proto(request.sampling, self.limits, self._max_context,
                                                    self._defaults)
            saves = convert.save_points_from_proto(request)
            return self._submit(request.request_id, lambda rid: engine.submit(prompt, sampling, request_id=rid,
                                                                              **saves))

        handle = self._call(context, submit)
        yield from self._stream(handle, context, pb.GenerateResponse, chat=False)

    def Chat(self, request: pb.ChatRequest, context):
        engine = self._engine(context)

        def submit():
            kwargs = convert.chat_from_proto(request, self.limits)
            sampling = convert.sampling_from_proto(request.sampling, self.limits, self._max_context,
                                                    self._defaults)
            messages = kwargs.pop("messages")
            return self._submit(request.request_id, lambda rid: engine.submit_chat(
                messages, sampling=sampling, request_id=rid, **kwargs))

        handle = self._call(context, submit)
        yield from self._stream(handle, context, pb.ChatResponse, chat=True)

    def Tokenize(self, request: pb.TokenizeRequest, context):
        engine = self._engine(context)

        if engine.tokenizer is None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "this model ships no tokenizer: send token ids")

        def encode():
            self.limits.check_chars(len(request.text), "text")
            ids = engine.tokenizer.encode(request.text, add_special_tokens=request.add_special_tokens)
            return pb.TokenizeResponse(token_ids=ids)

        return self._call(context, encode)

    def GetModelInfo(self, request, context):
        engine = self._engine(context, observe=True)

        def info():
            i = engine.model_info()
            return pb.ModelInfo(name=str(i.get("name", "")), model_type=str(i.get("model_type", "")),
                                vocab_size=int(i.get("vocab_size", 0)), max_context=int(i.get("max_context", 0)),
                                max_concurrency=int(i.get("max_concurrency", 0)), dtype=str(i.get("dtype", "")),
                                eos_token_ids=[int(t) for t in i.get("eos_token_ids", ())],
                                server_version=SERVER_VERSION)

        return self._call(context, info)

    def GetStats(self, request, context):
        engine = self._engine(context, observe=True)  # after a failure: the last counters, failed=1

        def stats():
            out = pb.Stats()
            for key, value in engine.stats().items():
                if isinstance(value, (bool, int)):
                    out.counters[key] = int(value)
                elif isinstance(value, float):
                    out.values[key] = value
                elif isinstance(value, list) and all(isinstance(v, int) for v in value):
                    for i, v in enumerate(value):  # spec_accepted_by_position -> ..._1, _2, ...
                        out.counters[f"{key}_{i + 1}"] = v
            return out

        return self._call(context, stats)
