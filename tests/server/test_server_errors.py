"""Every bad-request class gets its status code with a clear message, and disturbs no one else."""
from __future__ import annotations

import threading

import grpc
import pytest

from ninfer_jax.engine.types import SamplingParams
from ninfer_jax.errors import CapacityError, EngineClosedError, QueueFullError
from server.client import message_to_proto
from server.limits import ServerLimits
from server.proto import ninfer_pb2 as pb
from fakes import FakeEngine, running_server, wait_until

INVALID = grpc.StatusCode.INVALID_ARGUMENT
USER = [{"role": "user", "content": "hi"}]


def _code(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code(), info.value.details()


@pytest.mark.parametrize("prompt, sampling, needle", [
    ([], None, "prompt: empty"),
    ([1, 2, 5000], None, "outside the vocabulary"),
    ([7] * 600, None, "exceed max_context"),  # the fixture's max_context is 512
    ("x", {"temperature": -1.0}, "sampling.temperature"),
    ("x", {"top_p": 0.0}, "sampling.top_p"),
    ("x", {"max_tokens": 0}, "sampling.max_tokens"),
    ("x", {"seed": 2 ** 63}, "sampling.seed"),
    ("x", {"logprobs": 21}, "sampling.logprobs"),
    ("x", {"stop": [""]}, "sampling.stop"),
    ("x", {"max_tokens": 513}, "server limit"),  # above the fixture's max_context
])
def test_generate_bad_requests_are_invalid_argument(fake_server, prompt, sampling, needle):
    _, client, _ = fake_server
    code, details = _code(lambda: client.generate(prompt, sampling=sampling))
    assert code == INVALID and needle in details


def test_no_prompt_and_bad_request_id(fake_server):
    _, client, _ = fake_server
    code, details = _code(lambda: client.stub.Generate(pb.GenerateRequest()).next())
    assert code == INVALID and "prompt" in details
    code, details = _code(lambda: client.generate("x", request_id="bad id with spaces"))
    assert code == INVALID and "request_id" in details


@pytest.mark.parametrize("messages, kwargs, needle", [
    ([{"role": "robot", "content": "hi"}], {}, "UnknownRoleError"),
    ([{"role": "user", "content": "hi"},
      {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{not json"}}]}], {},
     "MalformedToolCallError"),
    ([{"role": "tool", "content": "orphan"}], {}, "MalformedToolCallError"),
    ([], {}, "messages must not be empty"),
    (USER, {"cache_markers": [{"message": 0}] * 5}, "MarkerError"),
    (USER, {"cache_markers": [{"message": 9}]}, "MarkerError"),
    (USER, {"cache_markers": [{"message": -1}]}, "non-negative index"),  # not "the last message"
    ([{"role": "user", "content": "word " * 400}], {}, "InputTooLongError"),
])
def test_chat_bad_requests_are_invalid_argument(fake_server, messages, kwargs, needle):
    _, client, _ = fake_server
    code, details = _code(lambda: client.chat(messages, **kwargs))
    assert code == INVALID and needle in details


def test_chat_malformed_proto_fields(fake_server):
    _, client, _ = fake_server
    req = pb.ChatRequest(messages=[message_to_proto(USER[0])], tools=[pb.Tool(name="f", parameters_json="[1]")])
    code, details = _code(lambda: list(client.stub.Chat(req)))
    assert code == INVALID and "parameters_json" in details
    req = pb.ChatRequest(messages=[message_to_proto(USER[0])], cache_markers=[pb.CacheMarker()])
    code, details = _code(lambda: list(client.stub.Chat(req)))
    assert code == INVALID and "cache_markers[0]" in details


@pytest.mark.parametrize("exc, code", [
    (QueueFullError("waiting queue full"), grpc.StatusCode.RESOURCE_EXHAUSTED),
    (CapacityError("cannot serve this request under the configuration"), grpc.StatusCode.RESOURCE_EXHAUSTED),
    (EngineClosedError("closed"), grpc.StatusCode.UNAVAILABLE),
    (RuntimeError("secret internals"), grpc.StatusCode.INTERNAL),
])
def test_engine_errors_map_to_status(fake_server, exc, code):
    _, client, engine = fake_server
    engine.inject_error(exc)
    got, details = _code(lambda: client.generate("x"))
    assert got == code
    if code == grpc.StatusCode.INTERNAL:
        assert "secret" not in details  # no internals leak to the caller
    else:
        assert str(exc) in details


def test_real_queue_full_is_resource_exhausted():
    engine = FakeEngine(max_concurrency=1, max_queue=1, step_s=0.01, min_len=50, max_len=50)
    try:
        with running_server(engine) as (srv, client):
            running = client.generate_stream([3, 4], sampling={"max_tokens": 50})
            next(running)
            waiting = client.generate_stream([3, 4], sampling={"max_tokens": 50})
            assert wait_until(lambda: engine.stats()["waiting"] == 1)
            streams = [running, waiting]
            code, details = _code(lambda: client.generate([3, 4]))
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "QueueFullError" in details
            for s in streams:
                s.cancel()
    finally:
        engine.close()


def test_limits_text_messages_and_wire_size():
    engine = FakeEngine()
    limits = ServerLimits(max_prompt_chars=100, max_messages=2, max_message_bytes=64 * 1024)
    try:
        with running_server(engine, limits=limits) as (_, client):
            code, details = _code(lambda: client.generate("y" * 101))
            assert code == INVALID and "server limit of 100" in details
            code, details = _code(lambda: client.chat(USER * 3))
            assert code == INVALID and "messages: 3 exceed" in details
            code, details = _code(lambda: client.tokenize("z" * 101))
            assert code == INVALID
            code, _ = _code(lambda: client.generate(list(range(40_000))))  # > 64 KiB on the wire
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert client.generate("fine", sampling={"max_tokens": 2}).finish_reason == "length"
    finally:
        engine.close()


def test_bad_requests_do_not_disturb_a_running_stream(fake_server, settled):
    srv, client, engine = fake_server
    sampling = {"temperature": 0.0, "max_tokens": 20}
    want = engine.generate([9, 8, 7], SamplingParams(**sampling))
    stream = client.generate_stream([9, 8, 7], sampling=sampling)
    first = next(stream)
    errors = []

    def hammer():
        for bad in ([], [99999], [1] * 999):
            try:
                client.generate(bad)
            except grpc.RpcError as e:
                errors.append(e.code())

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for t in threads:
        t.start()
    rest = list(stream)
    for t in threads:
        t.join(10)
    ids = list(first.token_ids) + [t for m in rest for t in m.token_ids]
    assert ids == list(want.token_ids)
    assert rest[-1].finish_reason != pb.FINISH_REASON_UNSPECIFIED
    assert errors == [INVALID] * 12
    settled(srv, engine)


def test_request_id_in_use_is_already_exists(settled):
    """The engine cancels by id: a second running request may never share one."""
    engine = FakeEngine(step_s=0.005, min_len=200, max_len=200)
    with running_server(engine) as (srv, client):
        _duplicate_ids(srv, client, engine, settled)
    engine.close()


def _duplicate_ids(srv, client, engine, settled):
    stream = client.generate_stream([1, 2, 3], sampling={"max_tokens": 200}, request_id="dup")
    next(stream)
    code, details = _code(lambda: client.generate([4, 5], request_id="dup"))
    assert code == grpc.StatusCode.ALREADY_EXISTS and "still running" in details
    stream.cancel()
    settled(srv, engine)
    assert client.generate([4, 5], sampling={"max_tokens": 2}, request_id="dup").request_id == "dup"
    ids = {client.generate([6], sampling={"max_tokens": 1}).request_id for _ in range(3)}
    assert len(ids) == 3 and all(i.startswith("rpc-") for i in ids)


def test_request_failing_mid_stream_is_internal_with_its_error(fake_server, settled):
    srv, client, engine = fake_server
    engine.fail_next_request("device fell over")
    stream = client.generate_stream([1, 2, 3], sampling={"max_tokens": 20})
    first = next(stream)
    assert first.token_ids
    with pytest.raises(grpc.RpcError) as info:
        list(stream)
    assert info.value.code() == grpc.StatusCode.INTERNAL
    assert "generation failed: device fell over" in info.value.details()
    settled(srv, engine)


def test_tokenize_without_a_tokenizer_is_failed_precondition():
    engine = FakeEngine()
    try:
        with running_server(engine) as (_, client):
            engine.tokenizer = None
            code, details = _code(lambda: client.tokenize("x"))
            assert code == grpc.StatusCode.FAILED_PRECONDITION and "token ids" in details
    finally:
        engine.close()
