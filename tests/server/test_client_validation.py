"""The client refuses what the server would refuse before sending anything, with the server's own
status and text; its sampling table agrees with SamplingParams at every boundary; the server's
refusals name the error class and the field."""
from __future__ import annotations

import dataclasses
import math
import select
import socket

import grpc
import pytest

from ninfer_jax.engine.types import SamplingParams
from ninfer_jax.errors import RequestError
from server import validate
from server.client import ClientRequestError, NInferClient, chat_request, generate_request, sampling_to_proto
from server.limits import ServerLimits
from server.proto import ninfer_pb2 as pb
from fakes import FakeEngine, running_server

INVALID = grpc.StatusCode.INVALID_ARGUMENT
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture
def listener():
    """A plain TCP socket listening on a free port (no gRPC server): whatever connects shows."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.setblocking(False)
    yield sock
    sock.close()


def _connected(sock, wait_s: float) -> bool:
    return bool(select.select([sock], [], [], wait_s)[0])


def _refusal(call) -> ClientRequestError:
    with pytest.raises(ClientRequestError) as info:
        call()
    exc = info.value
    assert isinstance(exc, grpc.RpcError)
    assert exc.code() == INVALID
    return exc


@pytest.mark.parametrize("prompt, sampling, details", [
    ("hi", {"seed": -5}, "RequestError: sampling.seed: must be an int in [0, 2**63), got -5"),
    ("hi", {"max_tokens": 2 ** 31},
     "RequestError: sampling.max_tokens: must be at most 2147483647 (the protocol's int32), got 2147483648"),
    ("hi", {"temperature": "abc"}, "RequestError: sampling.temperature: must lie in [0, 100], got 'abc'"),
    ("hi", {"top_p": 0}, "RequestError: sampling.top_p: must lie in (0, 1], got 0"),
    ("hi", {"top_k": 2 ** 31},
     "RequestError: sampling.top_k: must be at most 2147483647 (the protocol's int32), got 2147483648"),
    ("hi", {"temperature": math.nan}, "RequestError: sampling.temperature: must lie in [0, 100], got nan"),
    ("hi", {"stop_token_ids": [2 ** 31]},
     "RequestError: sampling.stop_token_ids: must be at most 2147483647 (the protocol's int32), got 2147483648"),
    ("hi", {"ignore_eos": "yes"}, "RequestError: sampling.ignore_eos: must be a bool, got 'yes'"),
    ("hi", {"stop": 5}, "RequestError: sampling.stop: must be non-empty strings"),
    ("hi", {"bogus": 1}, "RequestError: sampling: unknown field 'bogus'"),
    ("hi", "hot", "RequestError: sampling: must be a mapping of SamplingParams fields or a SamplingParams, got str"),
    (123, None, "RequestError: prompt: must be text (str) or a list of token ids (ints), got int"),
    (b"hi", None, "RequestError: prompt: must be text (str) or a list of token ids (ints), got bytes"),
    (None, None, "RequestError: prompt: must be text (str) or a list of token ids (ints), got NoneType"),
    ([1, "2"], None, "RequestError: prompt: token ids must be ints, got '2'"),
    ([1, 2.0], None, "RequestError: prompt: token ids must be ints, got 2.0"),
    ([True], None, "RequestError: prompt: token ids must be ints, got True"),
    ([2 ** 31], None, "RequestError: prompt: token id 2147483648 outside the vocabulary"),
    ([], None, "RequestError: prompt: empty"),
])
def test_generate_refused_locally_with_the_servers_status(listener, prompt, sampling, details):
    port = listener.getsockname()[1]
    with NInferClient(f"127.0.0.1:{port}") as client:
        exc = _refusal(lambda: client.generate_stream(prompt, sampling=sampling))
        assert exc.details().startswith(details), exc.details()
        assert str(exc) == exc.details() and exc.field in exc.details()
        _refusal(lambda: client.generate(prompt, sampling=sampling))
    assert not _connected(listener, 0.3), "the client connected for a request it refused"


def test_a_valid_request_does_reach_the_listener(listener):
    """The control of the test above: a request that passes the checks is sent (so 'no connection'
    there means the client refused before sending)."""
    port = listener.getsockname()[1]
    with NInferClient(f"127.0.0.1:{port}") as client:
        call = client.generate_stream("hi", sampling={"seed": 5, "max_tokens": 3}, timeout=5)
        assert _connected(listener, 5.0)
        call.cancel()


@pytest.mark.parametrize("messages, kwargs, details", [
    ("hi", {}, "RequestError: messages: must be a list of messages, got str"),
    (["hi"], {}, "RequestError: messages[0]: must be a message"),
    ([{"role": 5, "content": "x"}], {}, "RequestError: messages[0].role: must be a string, got int"),
    ([{"role": "user", "content": 7}], {}, "RequestError: messages[0].content: must be a list of parts"),
    ([{"role": "user", "content": [{"text": 3}]}], {}, "RequestError: messages[0].content[0].text: must be a string"),
    ([{"role": "user", "content": "x", "name": 1}], {}, "RequestError: messages[0].name: must be a string"),
    (USER + [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {"x": object()}}}]}], {},
     "RequestError: messages[1].tool_calls[0].function.arguments: not JSON-serializable"),
    (USER, {"tools": [{"name": "f", "parameters": [1]}]}, "RequestError: tools[0].parameters_json: must be a JSON object"),
    (USER, {"cache_markers": [{"message": "0"}]}, "RequestError: cache_markers[0].message: must be an int, got '0'"),
    (USER, {"session": 5}, "RequestError: session: must be a string, got int"),
    (USER, {"request_id": "bad id"}, "RequestError: request_id: 1-128 characters of [A-Za-z0-9._:-]"),
    (USER, {"sampling": {"logprobs": 21}}, "RequestError: sampling.logprobs: must be an int in [0, 20], got 21"),
])
def test_chat_refused_locally(listener, messages, kwargs, details):
    port = listener.getsockname()[1]
    with NInferClient(f"127.0.0.1:{port}") as client:
        exc = _refusal(lambda: client.chat_stream(messages, **kwargs))
        assert exc.details().startswith(details), exc.details()
    assert not _connected(listener, 0.3)


def test_token_and_tokenize_refused_locally():
    exc = _refusal(lambda: NInferClient("127.0.0.1:1", token="a\nb"))
    assert exc.details().startswith("RequestError: token: must be printable ASCII")
    with NInferClient("127.0.0.1:1") as client:
        assert _refusal(lambda: client.tokenize(5)).details() == "RequestError: text: must be a string, got int"


def test_valid_values_still_convert():
    msg = sampling_to_proto(SamplingParams(temperature=0.7, seed=1, stop="x", max_tokens=9))
    assert msg.temperature == 0.7 and msg.seed == 1 and list(msg.stop) == ["x"] and msg.max_tokens == 9
    assert not msg.HasField("logprobs") or msg.logprobs == 0
    msg = sampling_to_proto({"max_tokens": True, "ignore_eos": 1, "stop_token_ids": (3, 4), "top_k": 2 ** 31 - 1})
    assert msg.max_tokens == 1 and msg.ignore_eos is True and list(msg.stop_token_ids) == [3, 4]
    req = generate_request(range(3), request_id="a-1")
    assert list(req.token_ids.ids) == [0, 1, 2] and req.request_id == "a-1"
    req = chat_request([{"role": "user", "content": ["a", {"text": "b", "cache_control": {"type": "ephemeral"}}]}],
                       cache_markers=[{"message": 0, "part": 1}], session="s")
    assert [p.text for p in req.messages[0].parts] == ["a", "b"] and req.messages[0].parts[1].cache_control
    assert req.cache_markers[0].part == 1 and req.session == "s"


# --- the client's table against SamplingParams ---------------------------------------------------
def _candidates(bound: validate.Bound) -> list:
    values: list = ["abc", [1], 1.5, -1, 0, 1, True, False, math.nan, math.inf, -math.inf]
    for edge in (bound.lo, bound.hi):
        if edge is None:
            continue
        if bound.kind == "int":
            values += [edge - 1, edge, edge + 1]
        else:
            values += [edge, math.nextafter(edge, -math.inf), math.nextafter(edge, math.inf), int(edge)]
    if bound.kind == "int":
        values += [float(bound.lo or 0), 2 ** 31 - 1]
    return values


def _engine_verdict(field: str, value) -> str | None:
    try:
        SamplingParams(**{field: value})
    except RequestError as exc:
        return f"RequestError: {exc}"
    return None


def _client_verdict(field: str, value) -> str | None:
    try:
        validate.check_sampling({field: value})
    except ClientRequestError as exc:
        return exc.details()
    return None


def test_sampling_table_covers_samplingparams_and_the_proto():
    names = [f.name for f in dataclasses.fields(SamplingParams) if f.name not in validate.UNCARRIED_FIELDS]
    assert sorted(validate.SAMPLING_FIELDS) == sorted(names)
    assert sorted(pb.SamplingParams.DESCRIPTOR.fields_by_name) == sorted(names)
    numeric = {n for n in names if n not in ("stop", "stop_token_ids", "ignore_eos", "include_stop_str_in_output",
                                             "structured_output")}
    assert set(validate.SAMPLING_BOUNDS) == numeric


@pytest.mark.parametrize("field", sorted(validate.SAMPLING_BOUNDS))
def test_sampling_table_agrees_with_samplingparams_at_the_boundaries(field):
    bound = validate.SAMPLING_BOUNDS[field]
    checked = 0
    for value in _candidates(bound):
        want = _engine_verdict(field, value)
        got = _client_verdict(field, value)
        if bound.wire_max is not None and isinstance(value, int) and value > bound.wire_max and want is None:
            assert got is not None and "int32" in got  # the wire cannot carry it: refused anyway
            continue
        assert got == want, (field, value)
        checked += 1
    assert checked >= 10


@pytest.mark.parametrize("sampling", [
    {"stop": [""]}, {"stop": ["a"] * 17}, {"stop": ["a"] * 16}, {"stop": "x"}, {"stop_token_ids": [-1]},
    {"stop_token_ids": [0, 5]}, {"stop_token_ids": ["a"]},
])
def test_stop_rules_agree_with_samplingparams(sampling):
    (field, value), = sampling.items()
    assert _client_verdict(field, value) == _engine_verdict(field, value)


# --- local and remote refusals are the same answer ----------------------------------------------
@pytest.mark.parametrize("fields", [
    {"top_p": 0.0}, {"temperature": -1.0}, {"max_tokens": 0}, {"seed": 2 ** 63}, {"logprobs": 21},
    {"repetition_penalty": 11.0}, {"min_p": 1.5}, {"presence_penalty": -2.5},
])
def test_local_refusal_equals_the_servers_answer(fake_server, fields):
    """The raw proto (no client checks) to the server, and the same values through the client:
    same status, same text."""
    _, client, _ = fake_server
    with pytest.raises(grpc.RpcError) as remote:
        list(client.stub.Generate(pb.GenerateRequest(text="x", sampling=pb.SamplingParams(**fields)), timeout=30))
    local = _refusal(lambda: client.generate_stream("x", sampling=fields))
    assert remote.value.code() == INVALID
    assert remote.value.details() == local.details()


def test_local_refusal_equals_the_servers_answer_for_ids_and_prompts(fake_server):
    _, client, _ = fake_server
    for request, kwargs in [(pb.GenerateRequest(text="x", request_id="bad id"), {"prompt": "x", "request_id": "bad id"}),
                            (pb.GenerateRequest(token_ids=pb.TokenIds(ids=[])), {"prompt": []}),
                            (pb.GenerateRequest(text="x", sampling=pb.SamplingParams(stop=[""])),
                             {"prompt": "x", "sampling": {"stop": [""]}})]:
        with pytest.raises(grpc.RpcError) as remote:
            list(client.stub.Generate(request, timeout=30))
        assert remote.value.code() == INVALID
        assert remote.value.details() == _refusal(lambda: client.generate_stream(**kwargs)).details()
    req = pb.ChatRequest(messages=[pb.ChatMessage(role="user", content="hi")],
                         tools=[pb.Tool(name="f", parameters_json="[1]")])
    with pytest.raises(grpc.RpcError) as remote:
        list(client.stub.Chat(req, timeout=30))
    local = _refusal(lambda: client.chat_stream(USER, tools=[{"name": "f", "parameters": [1]}]))
    assert remote.value.details() == local.details() == "RequestError: tools[0].parameters_json: must be a JSON object"


# --- the server's own refusals name the class and the field --------------------------------------
def test_server_limit_messages_name_the_class_and_field():
    engine = FakeEngine()
    limits = ServerLimits(max_tokens=8, max_prompt_chars=100, max_messages=2, max_parts=2)
    try:
        with running_server(engine, limits=limits) as (_, client):
            answers = []
            for call in (lambda: client.generate("x", sampling={"max_tokens": 9}),
                         lambda: client.generate("y" * 101),
                         lambda: client.chat(USER * 3),
                         lambda: client.chat([{"role": "user", "content": ["a", "b", "c"]}]),
                         lambda: client.tokenize("z" * 101),
                         lambda: list(client.stub.Generate(pb.GenerateRequest(), timeout=30))):
                with pytest.raises(grpc.RpcError) as info:
                    call()
                assert info.value.code() == INVALID
                answers.append(info.value.details())
            assert answers == [
                "RequestError: sampling.max_tokens: 9 exceeds the server limit of 8",
                "RequestError: prompt: 101 characters exceed the server limit of 100",
                "RequestError: messages: 3 exceed the server limit of 2",
                "RequestError: messages[0].parts: 3 exceed the server limit of 2",
                "RequestError: text: 101 characters exceed the server limit of 100",
                "RequestError: prompt: set either text or token_ids",
            ]
    finally:
        engine.close()


def test_duplicate_request_id_names_the_class_and_field():
    engine = FakeEngine(step_s=0.05, min_len=200, max_len=200)
    try:
        with running_server(engine) as (_, client):
            running = client.generate_stream([3, 4], sampling={"max_tokens": 200}, request_id="dup-x")
            next(running)
            with pytest.raises(grpc.RpcError) as info:
                client.generate([4, 5], request_id="dup-x")
            running.cancel()
        assert info.value.code() == grpc.StatusCode.ALREADY_EXISTS
        assert info.value.details() == "RequestError: request_id: 'dup-x' names a request that is still running"
    finally:
        engine.close()


def test_the_client_knows_the_engine_default_max_tokens():
    """min_tokens is checked against max_tokens, whose default the client keeps apart from the engine."""
    assert validate.DEFAULT_MAX_TOKENS == SamplingParams().max_tokens
    assert _client_verdict("min_tokens", 129) == _engine_verdict("min_tokens", 129) is not None
