"""A small Python client for the `ninfer.v1.NInfer` service.

    with NInferClient("127.0.0.1:50051", token=None) as client:
        for piece in client.generate_stream("Hello", sampling={"max_tokens": 16}):
            print(piece.text, end="")
        result = client.generate([1, 2, 3], sampling={"temperature": 0})
        reply = client.chat([{"role": "user", "content": "Hi"}])
        client.tokenize("text"), client.model_info(), client.stats(), client.health()

Streaming calls return the gRPC call: iterate it for messages, `.cancel()` it to cancel the
request on the server. Failures raise `grpc.RpcError` with the server's status code. A request
the server would refuse as INVALID_ARGUMENT (bad sampling values, a prompt of the wrong type,
a malformed message, a bad request_id, a value the protocol cannot carry) is refused before it
is sent, with `ClientRequestError`: also a `grpc.RpcError`, code INVALID_ARGUMENT, and the
server's text as its details (server/validate.py). `wait_serving()` waits out the server's
warm-up (health NOT_SERVING).
Imports only grpc and the generated stubs (no JAX), so a client starts fast.
"""
from __future__ import annotations

import dataclasses
import json
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from server import validate
from server.proto import ninfer_pb2 as pb
from server.proto import ninfer_pb2_grpc as pb_grpc
from server.validate import ClientRequestError  # noqa: F401 - part of the client's API

def usage_dict(u: pb.Usage) -> dict:
    return {"prompt_tokens": u.prompt_tokens, "cached_tokens": u.cached_tokens,
            "completion_tokens": u.completion_tokens}


FINISH_NAMES = {pb.FINISH_REASON_STOP: "stop", pb.FINISH_REASON_LENGTH: "length",
                pb.FINISH_REASON_CANCELLED: "cancelled", pb.FINISH_REASON_UNSPECIFIED: ""}


@dataclasses.dataclass
class Result:
    request_id: str
    token_ids: list[int]
    text: str
    finish_reason: str
    usage: dict
    logprobs: list = dataclasses.field(default_factory=list)
    message: dict | None = None  # chat: the parsed assistant message
    first_token_s: float | None = None
    prompt_logprobs: list | None = None  # asked for: None (the first prompt token) then one entry per token


# --- Python values -> protobuf -------------------------------------------------------------------
# Every builder checks its input first (server.validate) and raises ClientRequestError, never a
# protobuf ValueError/TypeError, for a value the server would refuse or the wire cannot carry.
def sampling_to_proto(sampling: Any) -> pb.SamplingParams | None:
    """A dict of SamplingParams fields, a SamplingParams, or None (the server's defaults)."""
    fields = validate.check_sampling(sampling)
    if fields is None:
        return None
    msg = pb.SamplingParams()
    for key, value in fields.items():
        if key in ("stop", "stop_token_ids"):
            getattr(msg, key).extend(value)
        elif key == "structured_output":
            msg.structured_output.kind, msg.structured_output.spec_json = value
        else:
            setattr(msg, key, value)
    return msg


def _content_to_proto(msg: pb.ChatMessage, content: Any, where: str) -> None:
    if content is None:
        return
    if isinstance(content, str):
        msg.content = content
        return
    parts = validate.check_list(content, f"{where}.content", "parts (or text)")
    for j, part in enumerate(parts):
        pw = f"{where}.content[{j}]"
        if isinstance(part, str):
            part = {"type": "text", "text": part}
        part = validate.check_mapping(part, pw, "a part (text, or a mapping with type and text)")
        kind = validate.check_text(part.get("type"), f"{pw}.type") or "text"
        marker = part.get("cache_control") is not None
        if kind in ("image", "image_url", "input_image"):  # bytes, or a data: / file:// URL
            source = part.get("image", part.get("image_url"))
            if isinstance(source, Mapping):
                source = source.get("url")
            if isinstance(source, (bytes, bytearray)):
                msg.parts.add(type="image", data=bytes(source), cache_control=marker)
            else:
                msg.parts.add(type="image", url=validate.check_text(source, f"{pw}.image") or "", cache_control=marker)
        elif kind == "video":
            frames = validate.check_list(part.get("video"), f"{pw}.video", "frames (encoded images)")
            if not all(isinstance(f, (bytes, bytearray)) for f in frames):
                raise validate.ClientRequestError(f"{pw}.video", "frames must be encoded image bytes")
            msg.parts.add(type="video", frames=[bytes(f) for f in frames], fps=float(part.get("fps") or 0),
                          cache_control=marker)
        else:
            msg.parts.add(type=kind, text=validate.check_text(part.get("text"), f"{pw}.text") or "",
                          cache_control=marker)


def message_to_proto(m: Mapping[str, Any], index: int = 0) -> pb.ChatMessage:
    where = f"messages[{index}]"
    m = validate.check_mapping(m, where, "a message (a mapping with role and content)")
    msg = pb.ChatMessage(role=validate.check_text(m.get("role"), f"{where}.role") or "",
                         name=validate.check_text(m.get("name"), f"{where}.name") or "",
                         tool_call_id=validate.check_text(m.get("tool_call_id"), f"{where}.tool_call_id") or "",
                         cache_control=m.get("cache_control") is not None)
    _content_to_proto(msg, m.get("content"), where)
    if m.get("reasoning_content") is not None:
        msg.reasoning_content = validate.check_text(m["reasoning_content"], f"{where}.reasoning_content")
    for j, call in enumerate(validate.check_list(m.get("tool_calls"), f"{where}.tool_calls", "tool calls")):
        cw = f"{where}.tool_calls[{j}]"
        call = validate.check_mapping(call, cw, "a tool call (a mapping)")
        fn = validate.check_mapping(call.get("function", call), f"{cw}.function", "a mapping with name and arguments")
        args = fn.get("arguments", {})
        msg.tool_calls.add(id=validate.check_text(call.get("id"), f"{cw}.id") or "",
                           name=validate.check_text(fn.get("name"), f"{cw}.function.name") or "",
                           arguments_json=args if isinstance(args, str) else
                           validate.to_json(args, f"{cw}.function.arguments"))
    return msg


def tool_to_proto(t: Mapping[str, Any], index: int = 0) -> pb.Tool:
    where = f"tools[{index}]"
    t = validate.check_mapping(t, where, "a tool (a mapping)")
    fn = validate.check_mapping(t.get("function", t), f"{where}.function", "a mapping with name and parameters")
    params = fn.get("parameters")
    if params is not None and not isinstance(params, Mapping):
        raise validate.ClientRequestError(f"{where}.parameters_json", "must be a JSON object")
    return pb.Tool(name=validate.check_text(fn.get("name"), f"{where}.name") or "",
                   description=validate.check_text(fn.get("description"), f"{where}.description") or "",
                   parameters_json=validate.to_json(dict(params or {}), f"{where}.parameters_json"),
                   cache_control=t.get("cache_control") is not None)


def marker_to_proto(m: Mapping[str, Any], index: int = 0) -> pb.CacheMarker:
    where = f"cache_markers[{index}]"
    m = validate.check_mapping(m, where, "a marker ({'message': i}, {'message': i, 'part': j}, "
                                         "{'tool': k} or {'tools': True})")
    if "message" in m:
        part = {"part": validate.check_int32(m["part"], f"{where}.part")} if "part" in m else {}
        return pb.CacheMarker(message=validate.check_int32(m["message"], f"{where}.message"), **part)
    if "tool" in m:
        return pb.CacheMarker(tool=validate.check_int32(m["tool"], f"{where}.tool"))
    return pb.CacheMarker(tools=bool(m.get("tools")))


def generate_request(prompt: Any, *, sampling: Any = None, request_id: str = "", recovery_point: int | None = None,
                     anchors: Any = None, markers: Any = None, session: str | None = None) -> pb.GenerateRequest:
    """The GenerateRequest for these values, checked (ClientRequestError) without sending it."""
    prompt = validate.check_prompt(prompt)
    req = pb.GenerateRequest(request_id=validate.check_request_id(request_id),
                             session=validate.check_text(session, "session") or "")
    if recovery_point is not None:
        req.recovery_point = validate.check_int32(recovery_point, "recovery_point")
    for name, values in (("anchors", anchors), ("markers", markers)):
        items = validate.check_list(values, name, "token frontiers")
        if len(items) > 4:
            raise validate.ClientRequestError(name, f"at most 4 token frontiers, got {len(items)}")
        getattr(req, name).extend(validate.check_int32(f, f"{name}[{i}]") for i, f in enumerate(items))
    if isinstance(prompt, str):
        req.text = prompt
    else:
        req.token_ids.ids.extend(prompt)
    params = sampling_to_proto(sampling)
    if params is not None:
        req.sampling.CopyFrom(params)
    return req


def chat_request(messages: Any, *, tools: Any = None, session: str | None = None, cache_markers: Any = None,
                 sampling: Any = None, request_id: str = "") -> pb.ChatRequest:
    """The ChatRequest for these values, checked (ClientRequestError) without sending it."""
    req = pb.ChatRequest(
        messages=[message_to_proto(m, i) for i, m in enumerate(validate.check_messages(messages))],
        tools=[tool_to_proto(t, k) for k, t in enumerate(validate.check_list(tools, "tools", "tools"))],
        session=validate.check_text(session, "session") or "",
        cache_markers=[marker_to_proto(m, k) for k, m in
                       enumerate(validate.check_list(cache_markers, "cache_markers", "markers"))],
        request_id=validate.check_request_id(request_id))
    params = sampling_to_proto(sampling)
    if params is not None:
        req.sampling.CopyFrom(params)
    return req


def assistant_message(msg: pb.AssistantMessage) -> dict:
    """The parsed assistant message of a final ChatResponse, as a client sends it back next turn."""
    out: dict[str, Any] = {"role": "assistant", "content": msg.content}
    if msg.HasField("reasoning_content"):
        out["reasoning_content"] = msg.reasoning_content
    if msg.tool_calls:
        out["tool_calls"] = [{"type": "function", **({"id": c.id} if c.id else {}),
                              "function": {"name": c.name, "arguments": json.loads(c.arguments_json or "{}")}}
                             for c in msg.tool_calls]
        if not msg.content:
            out["content"] = None
    return out


def collect(stream: Iterable, *, clock=None) -> Result:
    """Drain a Generate/Chat stream into one Result (text, ids, finish reason, usage)."""
    clock = clock or time.perf_counter
    start = clock()
    ids: list[int] = []
    text: list[str] = []
    logprobs: list = []
    first = None
    final = None
    rid = ""
    for msg in stream:
        rid = msg.request_id or rid
        if msg.token_ids and first is None:
            first = clock() - start
        ids.extend(msg.token_ids)
        text.append(msg.text)
        logprobs.extend(msg.logprobs)
        if msg.finish_reason != pb.FINISH_REASON_UNSPECIFIED:
            final = msg
    if final is None:
        raise RuntimeError("the stream ended without a final message")
    message = None
    if isinstance(final, pb.ChatResponse) and final.HasField("message"):
        message = assistant_message(final.message)
    prompt_lps = [None, *final.prompt_logprobs] if final.prompt_logprobs else None
    return Result(rid, ids, "".join(text), FINISH_NAMES[final.finish_reason], usage_dict(final.usage),
                  logprobs, message, first, prompt_lps)


class NInferClient:
    # Reconnect soon after a refused connection (gRPC's default backoff grows to 120 s), so a
    # client waiting for a server that is starting notices it within about a second.
    CHANNEL_OPTIONS = (("grpc.initial_reconnect_backoff_ms", 200), ("grpc.min_reconnect_backoff_ms", 200),
                       ("grpc.max_reconnect_backoff_ms", 1000))

    def __init__(self, target: str = "127.0.0.1:50051", *, token: str | None = None,
                 timeout: float | None = None, max_message_bytes: int = 8 << 20):
        token = validate.check_token(token)
        self.target = target
        self.timeout = timeout
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.channel = grpc.insecure_channel(target, options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes), *self.CHANNEL_OPTIONS])
        self.stub = pb_grpc.NInferStub(self.channel)
        self._health = health_pb2_grpc.HealthStub(self.channel)

    def __enter__(self) -> "NInferClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.channel.close()

    def _kw(self, timeout: float | None) -> dict:
        return {"metadata": self._metadata, "timeout": timeout if timeout is not None else self.timeout}

    def wait_ready(self, timeout: float = 60.0) -> None:
        grpc.channel_ready_future(self.channel).result(timeout=timeout)

    def wait_serving(self, timeout: float, *, poll_s: float = 0.2,
                     on_wait: Callable[[str], None] | None = None) -> str:
        """Poll the health service until the server reports SERVING or `timeout` seconds pass.

        Returns "SERVING" (also for a server without a health service: its calls will tell);
        "NOT_SERVING" when it answers but does not serve: still warming up when the time ran
        out, or at once when it never will (its engine failed, it is shutting down, or the
        token is refused); "UNREACHABLE" when nothing answered. `on_wait(state)` is called once,
        the first time the answer is not SERVING and time is left to wait."""
        deadline = time.monotonic() + max(0.0, timeout)
        told = False
        while True:
            call_s = min(max(deadline - time.monotonic(), 0.1), 5.0)  # one probe's own deadline
            state = self._probe(call_s)
            if state == "SERVING" or (state == "NOT_SERVING" and not self._warming_up(call_s)):
                return state
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return state
            if not told and on_wait is not None:
                on_wait(state)
                told = True
            time.sleep(min(poll_s, remaining))

    def _probe(self, timeout: float) -> str:
        try:
            status = self.health(timeout=timeout)
        except grpc.RpcError as exc:
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                return "UNREACHABLE"
            return "SERVING"  # no health service (UNIMPLEMENTED) or no such name: let the call tell
        return "SERVING" if status == "SERVING" else "NOT_SERVING"

    def _warming_up(self, timeout: float) -> bool:
        """Health says NOT_SERVING: is that the warm-up (worth waiting for)? GetStats answers
        UNAVAILABLE "warming up" exactly then; it answers once the engine failed, and refuses
        otherwise when the server shuts down or rejects the token."""
        try:
            self.stub.GetStats(pb.GetStatsRequest(), metadata=self._metadata, timeout=timeout)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                return validate.WARMING_UP in (exc.details() or "") or is_unreachable(exc)
            return exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        return False

    # --- generation --------------------------------------------------------------------------
    def generate_stream(self, prompt: str | Sequence[int], *, sampling: Any = None, request_id: str = "",
                        timeout: float | None = None, **save_points):
        """`save_points`: recovery_point, anchors, markers, session (Engine.submit's)."""
        req = generate_request(prompt, sampling=sampling, request_id=request_id, **save_points)
        return self.stub.Generate(req, **self._kw(timeout))

    def generate(self, prompt, **kwargs) -> Result:
        return collect(self.generate_stream(prompt, **kwargs))

    def chat_stream(self, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Mapping] | None = None,
                    session: str | None = None, cache_markers: Sequence[Mapping] | None = None,
                    sampling: Any = None, request_id: str = "", timeout: float | None = None):
        req = chat_request(messages, tools=tools, session=session, cache_markers=cache_markers,
                           sampling=sampling, request_id=request_id)
        return self.stub.Chat(req, **self._kw(timeout))

    def chat(self, messages, **kwargs) -> Result:
        return collect(self.chat_stream(messages, **kwargs))

    # --- unary -------------------------------------------------------------------------------
    def tokenize(self, text: str, *, add_special_tokens: bool = False, timeout: float | None = None) -> list[int]:
        req = pb.TokenizeRequest(text=validate.check_text(text, "text", optional=False),
                                 add_special_tokens=bool(add_special_tokens))
        return list(self.stub.Tokenize(req, **self._kw(timeout)).token_ids)

    def model_info(self, timeout: float | None = None) -> dict:
        info = self.stub.GetModelInfo(pb.GetModelInfoRequest(), **self._kw(timeout))
        return {"name": info.name, "model_type": info.model_type, "vocab_size": info.vocab_size,
                "max_context": info.max_context, "max_concurrency": info.max_concurrency, "dtype": info.dtype,
                "eos_token_ids": list(info.eos_token_ids), "server_version": info.server_version}

    def stats(self, timeout: float | None = None) -> dict[str, int | float]:
        s = self.stub.GetStats(pb.GetStatsRequest(), **self._kw(timeout))
        return {**dict(s.counters), **dict(s.values)}

    def health(self, service: str = "", timeout: float | None = 5.0) -> str:
        """"SERVING", "NOT_SERVING", ... for `service` ("" = the whole server)."""
        resp = self._health.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)


def is_unreachable(exc: grpc.RpcError) -> bool:
    """A call that failed because no server answered at the address (refused, unresolvable),
    as opposed to an UNAVAILABLE answer from the server itself (warming up, shutting down)."""
    if exc.code() != grpc.StatusCode.UNAVAILABLE:
        return False
    details = (exc.details() or "").lower()
    return any(s in details for s in ("failed to connect", "connection refused", "errors resolving",
                                      "dns resolution failed", "name resolution", "connect failed"))
