"""Anthropic's Messages API (issue 37), driven by the official `anthropic` client against a live
server on loopback: the real engine on the built-in model (outputs compared with the same engine
in process; cache_control markers, cache usage and count_tokens), and the fake engine where a
scripted answer (a tool call) or an engine error is needed. Nothing is mocked between the client
and the engine."""
from __future__ import annotations

import json

import anthropic
import httpx2
import pytest

from ninfer_jax import SamplingParams
from ninfer_jax.errors import QueueFullError
from server import anthropic_convert as ac
from server.cli_commands import engine_factory
from fakes import FakeEngine, http_settled as _settled, serve_http as _serve

MODEL = "builtin:tiny-hybrid"
SYSTEM = [{"type": "text", "text": "You are the weather desk of a newspaper. Answer in one short line.",
           "cache_control": {"type": "ephemeral"}}]
WEATHER = {"name": "get_weather", "description": "Weather of a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
GREEDY = {"temperature": 0}  # a body field older clients send (the 2026 client has no parameter for it)
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def _client(srv, key="unused"):
    return anthropic.Anthropic(api_key=key, base_url=f"http://127.0.0.1:{srv.http.port}", max_retries=0,
                               timeout=120.0)


@pytest.fixture(scope="module")
def live():
    srv = _serve(engine_factory(MODEL, max_concurrency=2, max_context=512, progress=False))
    yield srv, _client(srv)
    srv.shutdown(grace_s=2.0)


def _text(msg) -> str:
    return "".join(b.text for b in msg.content if b.type == "text")


def test_create_equals_the_engine_and_the_stream_equals_create(live):
    srv, client = live
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    got = client.messages.create(model=MODEL, max_tokens=12, messages=msgs, extra_body=GREEDY)
    assert got.type == "message" and got.role == "assistant" and got.id.startswith("msg_")
    assert got.stop_reason in ("end_turn", "max_tokens")
    want = srv.engine.chat(msgs, sampling=SamplingParams(temperature=0, max_tokens=12))
    assert _text(got) == want.text.lstrip("\n") or _text(got) == want.text  # the parser's own cut
    assert got.usage.output_tokens == len(want.token_ids)
    with client.messages.stream(model=MODEL, max_tokens=12, messages=msgs, extra_body=GREEDY) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    assert _text(final) == _text(got) and final.stop_reason == got.stop_reason
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "message_delta" in kinds
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") >= 1
    _settled(srv)


def test_a_stop_sequence_is_named_in_the_answer(live):
    srv, client = live
    msgs = [{"role": "user", "content": "Tell me a story about a cat."}]
    free = client.messages.create(model=MODEL, max_tokens=24, messages=msgs, extra_body=GREEDY)
    words = [w for w in _text(free).split() if len(w) >= 3]
    assert words, _text(free)
    stop = words[len(words) // 2]
    got = client.messages.create(model=MODEL, max_tokens=24, messages=msgs, extra_body=GREEDY, stop_sequences=[stop])
    assert got.stop_reason == "stop_sequence" and got.stop_sequence == stop
    assert stop not in _text(got) and _text(free).startswith(_text(got))
    _settled(srv)


def test_cache_control_saves_then_reads_and_usage_adds_up(live):
    """The system block's cache_control is a marker at its end: the first request saves there
    (cache creation), another conversation with the same system reads it; input + read +
    creation = count_tokens = the prompt's tokens."""
    srv, client = live
    first = client.messages.create(model=MODEL, max_tokens=3, system=SYSTEM, extra_body=GREEDY,
                                   messages=[{"role": "user", "content": "Paris?"}])
    u = first.usage
    count = client.messages.count_tokens(model=MODEL, system=SYSTEM, messages=[{"role": "user", "content": "Paris?"}])
    assert u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens == count.input_tokens
    assert u.cache_creation_input_tokens > 0
    other = client.messages.create(model=MODEL, max_tokens=3, system=SYSTEM, extra_body=GREEDY,
                                   messages=[{"role": "user", "content": "Oslo, tomorrow?"}])
    v = other.usage
    # the other conversation reads exactly what the system block's marker saved
    req = ac.parse(ac.MessagesRequest, {"model": MODEL, "max_tokens": 3, "system": SYSTEM,
                                        "messages": [{"role": "user", "content": "Oslo, tomorrow?"}]})
    chat = ac.chat_of(req)
    marker = srv.engine.chat_frontend().render_chat(chat["messages"], marker_policy="none").markers[0].frontier
    assert v.cache_read_input_tokens == marker and 0 < marker <= u.cache_creation_input_tokens
    count2 = client.messages.count_tokens(model=MODEL, system=SYSTEM,
                                          messages=[{"role": "user", "content": "Oslo, tomorrow?"}])
    assert v.input_tokens + v.cache_read_input_tokens + v.cache_creation_input_tokens == count2.input_tokens
    _settled(srv)


def test_cache_control_lands_on_the_block_end(live):
    """Token level: the marker of the system block is the frontier right after that block's text
    in the rendered prompt (the tool's marker after the tools)."""
    srv, _ = live
    req = ac.parse(ac.MessagesRequest, {"model": MODEL, "max_tokens": 4, "system": SYSTEM,
                                        "tools": [dict(WEATHER, cache_control={"type": "ephemeral"})],
                                        "messages": [{"role": "user", "content": "Paris?"}]})
    chat = ac.chat_of(req)
    frontend = srv.engine.chat_frontend()
    rendered = frontend.render_chat(chat["messages"], tools=chat["tools"], marker_policy="none")
    text = rendered.text
    ends = sorted(m.frontier for m in rendered.markers)
    tok = srv.engine.tokenizer
    system_end = text.index(SYSTEM[0]["text"]) + len(SYSTEM[0]["text"])
    assert len(tok.encode(text[:system_end])) in ends
    assert len(ends) == 2  # the system block and the tools


def test_tool_use_round_trip_streamed_and_not():
    fake = FakeEngine(max_concurrency=2, max_context=512, model="fake:tiny", script=CALL_TEXT)
    srv = _serve(lambda: fake)
    try:
        client = _client(srv)
        msgs = [{"role": "user", "content": "Weather in Paris?"}]
        got = client.messages.create(model="fake:tiny", max_tokens=64, tools=[WEATHER], messages=msgs)
        assert got.stop_reason == "tool_use"
        calls = [b for b in got.content if b.type == "tool_use"]
        assert [(c.name, c.input) for c in calls] == [("get_weather", {"city": "Paris"})]
        assert calls[0].id.startswith("toolu_") and not _text(got)
        with client.messages.stream(model="fake:tiny", max_tokens=64, tools=[WEATHER], messages=msgs) as stream:
            events = list(stream)
            final = stream.get_final_message()
        assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == [("get_weather", {"city": "Paris"})]
        assert any(e.type == "content_block_delta" and e.delta.type == "input_json_delta" for e in events)
        # the next turn carries the call and its result back
        msgs += [{"role": "assistant", "content": [c.model_dump() for c in got.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": calls[0].id,
                                               "content": '{"temp_c": 21}'}]}]
        again = client.messages.create(model="fake:tiny", max_tokens=64, tools=[WEATHER], messages=msgs)
        assert again.stop_reason == "tool_use"
        plain = client.messages.create(model="fake:tiny", max_tokens=64, tools=[WEATHER], messages=msgs,
                                       tool_choice={"type": "none"})
        assert _text(plain) == CALL_TEXT and plain.stop_reason == "end_turn"
    finally:
        srv.shutdown(grace_s=1.0)
        fake.close()


@pytest.mark.parametrize("kwargs, exc, kind, needle", [
    ({"model": "claude-nothing"}, anthropic.NotFoundError, "not_found_error", "does not exist"),
    ({"max_tokens": 0}, anthropic.BadRequestError, "invalid_request_error", "max_tokens"),
    ({"extra_body": {"temperature": 1.5}}, anthropic.BadRequestError, "invalid_request_error", "temperature"),
    ({"output_config": {"effort": "max"}}, anthropic.BadRequestError, "invalid_request_error", "effort"),
    ({"speed": "fast"}, anthropic.BadRequestError, "invalid_request_error", "speed"),
    ({"messages": [{"role": "system", "content": "x"}]}, anthropic.BadRequestError, "invalid_request_error",
     "role"),
    ({"tool_choice": {"type": "any"}}, anthropic.BadRequestError, "invalid_request_error", "needs tools"),
    ({"thinking": {"type": "enabled", "budget_tokens": 10}}, anthropic.BadRequestError, "invalid_request_error",
     "budget_tokens"),
    ({"messages": [{"role": "user", "content": "word " * 2000}]}, anthropic.BadRequestError,
     "invalid_request_error", "InputTooLongError"),
    ({"extra_body": {"mcp_servers": [{"url": "x"}]}}, anthropic.BadRequestError, "invalid_request_error",
     "mcp_servers"),
])
def test_bad_requests_get_anthropic_errors(live, kwargs, exc, kind, needle):
    srv, client = live
    args = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], **kwargs}
    with pytest.raises(exc) as info:
        client.messages.create(**args)
    body = info.value.body
    assert body["type"] == "error" and body["error"]["type"] == kind and needle in body["error"]["message"]
    assert srv.engine.stats()["residents"] == 0
    _settled(srv)


def test_auth_by_x_api_key_or_bearer_and_the_overloaded_529():
    fake = FakeEngine(max_concurrency=2, max_context=256, model="fake:tiny")
    srv = _serve(lambda: fake, token="s3cret")
    try:
        ok = _client(srv, key="s3cret").messages.create(model="fake:tiny", max_tokens=3,
                                                       messages=[{"role": "user", "content": "hi"}])
        assert ok.usage.output_tokens == 3
        with pytest.raises(anthropic.AuthenticationError) as info:
            _client(srv, key="wrong").messages.create(model="fake:tiny", max_tokens=3,
                                                      messages=[{"role": "user", "content": "hi"}])
        assert info.value.body["error"]["type"] == "authentication_error"
        base = f"http://127.0.0.1:{srv.http.port}"
        bearer = httpx2.post(f"{base}/v1/messages/count_tokens", headers={"Authorization": "Bearer s3cret"},
                             json={"model": "fake:tiny", "messages": [{"role": "user", "content": "hi"}]})
        assert bearer.status_code == 200 and bearer.json()["input_tokens"] > 0
        missing = httpx2.post(f"{base}/v1/messages", json={"model": "fake:tiny"})
        assert missing.status_code == 401 and missing.json()["type"] == "error"
        fake.inject_error(QueueFullError("the queue is full (64 requests)"))
        with pytest.raises(anthropic.InternalServerError) as info:
            _client(srv, key="s3cret").messages.create(model="fake:tiny", max_tokens=3,
                                                       messages=[{"role": "user", "content": "hi"}])
        assert info.value.status_code == 529 and info.value.body["error"]["type"] == "overloaded_error"
        nowhere = httpx2.get(f"{base}/v1/messages", headers={"x-api-key": "s3cret"})
        assert nowhere.status_code == 405 and nowhere.json()["type"] == "error"
    finally:
        srv.shutdown(grace_s=1.0)
        fake.close()


def test_an_engine_error_mid_stream_is_an_error_event():
    fake = FakeEngine(max_concurrency=2, max_context=256, model="fake:tiny")
    srv = _serve(lambda: fake)
    try:
        fake.fail_next_request("the device fell over")
        base = f"http://127.0.0.1:{srv.http.port}"
        with httpx2.stream("POST", f"{base}/v1/messages", json={
                "model": "fake:tiny", "max_tokens": 8, "stream": True,
                "messages": [{"role": "user", "content": "hi"}]}) as r:
            lines = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
        assert lines[0]["type"] == "message_start" and lines[-1]["type"] == "error"
        assert "the device fell over" in lines[-1]["error"]["message"]
    finally:
        srv.shutdown(grace_s=1.0)
        fake.close()
