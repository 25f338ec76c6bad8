"""A small Python client for the `ninfer.v1.NInfer` service.

    with NInferClient("127.0.0.1:50051", token=None) as client:
        for piece in client.generate_stream("Hello", sampling={"max_tokens": 16}):
            print(piece.text, end="")
        result = client.generate([1, 2, 3], sampling={"temperature": 0})
        reply = client.chat([{"role": "user", "content": "Hi"}])
        client.tokenize("text"), client.model_info(), client.stats(), client.health()

Streaming calls return the gRPC call: iterate it for messages, `.cancel()` it to cancel the
request on the server. Failures raise `grpc.RpcError` with the server's status code.
Imports only grpc and the generated stubs (no JAX), so a client starts fast.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Iterable, Mapping, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from server.proto import ninfer_pb2 as pb
from server.proto import ninfer_pb2_grpc as pb_grpc

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


# --- Python values -> protobuf -------------------------------------------------------------------
def sampling_to_proto(sampling: Any) -> pb.SamplingParams | None:
    """A dict of SamplingParams fields, a SamplingParams, or None (the server's defaults)."""
    if sampling is None:
        return None
    if dataclasses.is_dataclass(sampling):
        sampling = {f.name: getattr(sampling, f.name) for f in dataclasses.fields(sampling)}
    msg = pb.SamplingParams()
    for key, value in sampling.items():
        if value is None:
            continue
        if key in ("stop", "stop_token_ids"):
            getattr(msg, key).extend([value] if isinstance(value, str) else value)
        else:
            setattr(msg, key, value)
    return msg


def _content_to_proto(msg: pb.ChatMessage, content: Any) -> None:
    if content is None:
        return
    if isinstance(content, str):
        msg.content = content
        return
    for part in content:
        if isinstance(part, str):
            part = {"type": "text", "text": part}
        msg.parts.add(type=part.get("type", "text"), text=part.get("text", ""),
                      cache_control=part.get("cache_control") is not None)


def message_to_proto(m: Mapping[str, Any]) -> pb.ChatMessage:
    msg = pb.ChatMessage(role=m.get("role", ""), name=m.get("name") or "", tool_call_id=m.get("tool_call_id") or "",
                         cache_control=m.get("cache_control") is not None)
    _content_to_proto(msg, m.get("content"))
    if m.get("reasoning_content") is not None:
        msg.reasoning_content = m["reasoning_content"]
    for call in m.get("tool_calls") or ():
        fn = call.get("function", call)
        args = fn.get("arguments", {})
        msg.tool_calls.add(id=call.get("id") or "", name=fn.get("name", ""),
                           arguments_json=args if isinstance(args, str) else json.dumps(args))
    return msg


def tool_to_proto(t: Mapping[str, Any]) -> pb.Tool:
    fn = t.get("function", t)
    return pb.Tool(name=fn.get("name", ""), description=fn.get("description", ""),
                   parameters_json=json.dumps(fn.get("parameters", {})), cache_control=t.get("cache_control") is not None)


def marker_to_proto(m: Mapping[str, Any]) -> pb.CacheMarker:
    if "message" in m:
        return pb.CacheMarker(message=m["message"], **({"part": m["part"]} if "part" in m else {}))
    if "tool" in m:
        return pb.CacheMarker(tool=m["tool"])
    return pb.CacheMarker(tools=bool(m.get("tools")))


def collect(stream: Iterable, *, clock=None) -> Result:
    """Drain a Generate/Chat stream into one Result (text, ids, finish reason, usage)."""
    import time

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
        message = {"role": "assistant", "content": final.message.content}
        if final.message.HasField("reasoning_content"):
            message["reasoning_content"] = final.message.reasoning_content
        if final.message.tool_calls:
            message["tool_calls"] = [{"type": "function", "function": {
                "name": c.name, "arguments": json.loads(c.arguments_json)}} for c in final.message.tool_calls]
    return Result(rid, ids, "".join(text), FINISH_NAMES[final.finish_reason], usage_dict(final.usage),
                  logprobs, message, first)


class NInferClient:
    def __init__(self, target: str = "127.0.0.1:50051", *, token: str | None = None,
                 timeout: float | None = None, max_message_bytes: int = 8 << 20):
        self.timeout = timeout
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.channel = grpc.insecure_channel(target, options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes)])
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

    # --- generation --------------------------------------------------------------------------
    def generate_stream(self, prompt: str | Sequence[int], *, sampling: Any = None, request_id: str = "",
                        timeout: float | None = None):
        req = pb.GenerateRequest(request_id=request_id)
        if isinstance(prompt, str):
            req.text = prompt
        else:
            req.token_ids.ids.extend(prompt)
        if sampling is not None:
            req.sampling.CopyFrom(sampling_to_proto(sampling))
        return self.stub.Generate(req, **self._kw(timeout))

    def generate(self, prompt, **kwargs) -> Result:
        return collect(self.generate_stream(prompt, **kwargs))

    def chat_stream(self, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Mapping] | None = None,
                    session: str | None = None, cache_markers: Sequence[Mapping] | None = None,
                    sampling: Any = None, request_id: str = "", timeout: float | None = None):
        req = pb.ChatRequest(messages=[message_to_proto(m) for m in messages],
                             tools=[tool_to_proto(t) for t in tools or ()], session=session or "",
                             cache_markers=[marker_to_proto(m) for m in cache_markers or ()], request_id=request_id)
        if sampling is not None:
            req.sampling.CopyFrom(sampling_to_proto(sampling))
        return self.stub.Chat(req, **self._kw(timeout))

    def chat(self, messages, **kwargs) -> Result:
        return collect(self.chat_stream(messages, **kwargs))

    # --- unary -------------------------------------------------------------------------------
    def tokenize(self, text: str, *, add_special_tokens: bool = False, timeout: float | None = None) -> list[int]:
        req = pb.TokenizeRequest(text=text, add_special_tokens=add_special_tokens)
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
