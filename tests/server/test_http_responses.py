"""OpenAI's Responses API on the HTTP server (issue 37), driven by the official `openai` client
against live servers on loopback: create, retrieve, delete and the input listing; streaming (its
events checked against the SDK's types, the streamed final response equal to the plain one at
temperature 0); every refusal's status and shape; the store's budget, persistence across a
restart and truncation. The fake engine serves where no model output matters; the built-in model
where exactness and cache reuse do."""
from __future__ import annotations

import contextlib
import json

import httpx2
import openai
import pytest

from ninfer_jax import SamplingParams
from server.app import InferenceServer
from server.cli_commands import engine_factory
from server.http_settings import HttpSettings
from fakes import FakeEngine, http_settled, serve_http, wait_until

MODEL = "builtin:tiny-hybrid"
FAKE = "fake:tiny"
TOKEN = "s3cret"
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather of a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
THINK_AND_CALL = ('<think>\nThe user wants the weather.\n</think>\n\n'
                  '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')


def _client(srv, token=TOKEN):
    return openai.OpenAI(api_key=token, base_url=f"http://127.0.0.1:{srv.http.port}/v1", max_retries=0,
                         timeout=60.0)


@pytest.fixture(scope="module")
def fake():
    """(server, client, engine): the fake engine behind a bearer token."""
    engine = FakeEngine(max_concurrency=4, max_context=512, model=FAKE)
    srv = serve_http(lambda: engine, token=TOKEN)
    yield srv, _client(srv), engine
    srv.shutdown(grace_s=1.0)


@pytest.fixture(scope="module")
def thinker():
    """A fake model that reasons, then calls get_weather (every answer), slowly enough to leave."""
    engine = FakeEngine(max_concurrency=4, max_context=1024, model=FAKE, script=THINK_AND_CALL)
    srv = serve_http(lambda: engine, token=TOKEN)
    yield srv, _client(srv), engine
    srv.shutdown(grace_s=1.0)


@pytest.fixture(scope="module")
def real():
    srv = serve_http(engine_factory(MODEL, max_concurrency=1, max_context=256, progress=False))
    yield srv, _client(srv, "unused")
    srv.shutdown(grace_s=2.0)


@contextlib.contextmanager
def _served(**settings):
    """A fake-engine server with these HttpSettings (no token)."""
    srv = InferenceServer(lambda: FakeEngine(max_concurrency=2, max_context=1024, model=FAKE), port=None, http_port=0,
                          grace_s=1.0, progress=lambda m: None, http_settings=HttpSettings(**settings))
    srv.start()
    srv.warm_up()
    try:
        yield srv, _client(srv, "unused")
    finally:
        srv.shutdown(grace_s=1.0)


def _http(srv, method, path, token=TOKEN, **kw):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx2.request(method, f"http://127.0.0.1:{srv.http.port}{path}", headers=headers, timeout=30.0, **kw)


def _error(r, status, code=None, param=None) -> dict:
    """The OpenAI error object, exactly, with this status (and code and param where given)."""
    assert r.status_code == status, (r.status_code, r.text[:300])
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    if code is not None:
        assert body["error"]["code"] == code, body
    if param is not None:
        assert body["error"]["param"] == param, body
    return body["error"]


def _same(a, b) -> dict:
    """A response object without what differs between two runs of one request: ids, times, the
    cache counters (the second run reuses the first's prompt)."""
    def norm(r):
        d = r.model_dump(exclude_none=True)
        for key in ("id", "created_at", "completed_at"):
            d.pop(key, None)
        for item in d["output"]:
            item.pop("id", None)
            item.pop("call_id", None)
        d["usage"].pop("input_tokens_details")
        return d
    assert norm(a) == norm(b)
    return norm(a)


# --- create, retrieve, list, delete --------------------------------------------------------------
def test_create_retrieve_list_and_delete(fake):
    srv, client, _ = fake
    r = client.responses.create(model=FAKE, input="Hello", instructions="Be brief.", max_output_tokens=40,
                                metadata={"k": "v"}, reasoning={"effort": "low", "summary": "auto"},
                                include=["reasoning.encrypted_content"], parallel_tool_calls=False, user="u1")
    assert r.id.startswith("resp_") and r.object == "response" and r.status == "completed"
    assert r.instructions == "Be brief." and r.metadata == {"k": "v"} and r.truncation == "disabled"
    assert r.reasoning.effort == "low" and r.parallel_tool_calls is False and r.store is True
    (msg,) = r.output
    assert msg.type == "message" and msg.id.startswith("msg_") and msg.status == "completed"
    assert r.output_text and r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert client.responses.retrieve(r.id) == r  # the same JSON the create returned
    (item,) = client.responses.input_items.list(r.id)
    assert item.type == "message" and item.role == "user" and item.id.startswith("msg_")
    assert [(c.type, c.text) for c in item.content] == [("input_text", "Hello")]
    assert client.responses.delete(r.id) is None
    raw = _http(srv, "DELETE", f"/v1/responses/{r.id}")
    assert "was deleted" in _error(raw, 404, "response_not_found", "response_id")["message"]
    for call in (lambda: client.responses.retrieve(r.id), lambda: client.responses.input_items.list(r.id),
                 lambda: client.responses.create(model=FAKE, input="x", previous_response_id=r.id)):
        with pytest.raises(openai.NotFoundError, match="deleted"):
            call()
    # store: false answers the same way, but nothing is kept.
    unstored = client.responses.create(model=FAKE, input="Hello", store=False, max_output_tokens=4)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError, match="unknown response id"):
        client.responses.retrieve(unstored.id)
    http_settled(srv)


def test_input_items_paginate_in_both_orders(fake):
    srv, client, _ = fake
    first = client.responses.create(model=FAKE, input="Weather?", tools=[WEATHER], max_output_tokens=4)
    items = [{"role": "user", "content": "Weather in Paris?"},
             {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
             {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
             {"type": "message", "id": "msg_mine", "role": "assistant", "content": "Sunny."},
             {"role": "user", "content": [{"type": "input_text", "text": "And Rome?"}]}]
    r = client.responses.create(model=FAKE, input=items, previous_response_id=first.id, tools=[WEATHER],
                                max_output_tokens=4)
    asc = list(client.responses.input_items.list(r.id, order="asc", limit=2))  # the SDK follows `after`
    assert [i.type for i in asc] == ["message", "function_call", "function_call_output", "message", "message"]
    assert asc[0].id.startswith("msg_") and asc[1].id.startswith("fc_") and asc[2].id.startswith("fco_") and asc[3].id == "msg_mine"
    assert (asc[1].name, asc[1].call_id, asc[2].output) == ("get_weather", "call_1", "sunny")
    assert asc[3].content[0].type == "output_text" and asc[4].content[0].text == "And Rome?"
    assert len({i.id for i in asc}) == 5
    desc = list(client.responses.input_items.list(r.id))  # default: desc, 20 a page
    assert [i.id for i in desc] == [i.id for i in reversed(asc)]
    page = client.responses.input_items.list(r.id, order="asc", limit=2)
    assert page.has_more and [i.id for i in page.data] == [asc[0].id, asc[1].id]
    assert page.first_id == asc[0].id and page.last_id == asc[1].id
    rest = client.responses.input_items.list(r.id, order="asc", after=asc[3].id)
    assert [i.id for i in rest.data] == [asc[4].id] and not rest.has_more
    tail = client.responses.input_items.list(r.id, order="desc", limit=3, after=asc[4].id)
    assert [i.id for i in tail.data] == [asc[3].id, asc[2].id, asc[1].id] and tail.has_more
    before = _http(srv, "GET", f"/v1/responses/{r.id}/input_items?order=asc&before={asc[2].id}").json()
    assert [i["id"] for i in before["data"]] == [asc[0].id, asc[1].id] and before["has_more"] is False
    empty = client.responses.input_items.list(r.id, order="asc", after=asc[4].id)
    assert empty.data == [] and empty.first_id is None and not empty.has_more
    for query, param in (("limit=0", "limit"), ("limit=101", "limit"), ("limit=x", "limit"),
                         ("order=sideways", "order"), ("after=msg_nope", "after")):
        _error(_http(srv, "GET", f"/v1/responses/{r.id}/input_items?{query}"), 400, None, param)
    http_settled(srv)


def test_errors_are_openai_error_objects(fake):
    srv, client, engine = fake
    r = client.responses.create(model=FAKE, input="Hi", max_output_tokens=4)
    for method, path in (("GET", "/v1/responses/resp_unknown"), ("DELETE", "/v1/responses/resp_unknown"),
                         ("GET", "/v1/responses/resp_unknown/input_items")):
        assert "unknown response id" in _error(_http(srv, method, path), 404, "response_not_found",
                                               "response_id")["message"]
        _error(_http(srv, method, path.replace("resp_unknown", r.id), token=None), 401, "invalid_api_key")
    body = {"model": FAKE, "input": "Hi", "max_output_tokens": 4}
    _error(_http(srv, "POST", "/v1/responses", json=dict(body, previous_response_id="resp_unknown")), 404,
           "response_not_found", "previous_response_id")
    _error(_http(srv, "POST", "/v1/responses", token=None, json=body), 401, "invalid_api_key")
    _error(_http(srv, "GET", f"/v1/responses/{r.id}?stream=true"), 400, "unsupported_parameter", "stream")
    before = engine.stats()["requests_submitted"]
    for extra, param in (({"truncation": "sometimes"}, "truncation"), ({"reasoning": {"effort": "huge"}},
                                                                      "reasoning.effort"),
                         ({"background": True}, "background"), ({"conversation": "conv_1"}, "conversation"),
                         ({"prompt": {"id": "pmpt_1"}}, "prompt"), ({"top_logprobs": 2}, "top_logprobs"),
                         ({"metadata": {"k": 5}}, "metadata.k"), ({"reasoning_effort": "low"}, "reasoning_effort"),
                         ({"input": "word " * 600}, "input")):
        err = _error(_http(srv, "POST", "/v1/responses", json=dict(body, **extra)), 400, None, param)
        if param == "input":  # over the context with truncation disabled: refused naming both
            assert err["code"] == "context_length_exceeded" and "truncation" in err["message"]
    assert engine.stats()["requests_submitted"] == before  # none of them reached the engine
    # An engine failure: a 500 server_error (not streamed), and nothing stored.
    engine.fail_next_request("boom")
    _error(_http(srv, "POST", "/v1/responses", json=body), 500, None)
    http_settled(srv)


def test_reasoning_effort_maps_to_the_templates_thinking_switch(fake):
    """The built-in template has `enable_thinking`: effort none/minimal turn it off (the prompt
    then holds an empty think block), the others on (this template's default)."""
    _, client, _ = fake
    tokens = {effort: client.responses.create(model=FAKE, input="Hi", max_output_tokens=2,
                                              **({"reasoning": {"effort": effort}} if effort else {})
                                              ).usage.input_tokens
              for effort in (None, "none", "minimal", "low", "high")}
    assert tokens["none"] == tokens["minimal"] > tokens[None] == tokens["low"] == tokens["high"]


# --- streaming -----------------------------------------------------------------------------------
def _events(stream) -> list:
    events = list(stream)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    for e in events[:2]:
        assert e.response.status == "in_progress" and e.response.output == [] and e.response.usage is None
    assert len({e.response.id for e in events if hasattr(e, "response")}) == 1
    return events


def test_streamed_events_match_the_plain_answer(fake):
    srv, client, _ = fake
    events = _events(client.responses.create(model=FAKE, input="Hello", max_output_tokens=40, temperature=0,
                                             stream=True))
    types = [e.type for e in events]
    assert types[2:5] == ["response.output_item.added", "response.content_part.added", "response.output_text.delta"]
    assert types[-5:] == ["response.output_text.delta", "response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    added, done, final = events[2], events[-2], events[-1].response
    assert added.item.status == "in_progress" and added.item.content == [] and done.item.status == "completed"
    assert added.item.id == done.item.id == final.output[0].id
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == events[-4].text == final.output_text and final.status == "completed"
    assert client.responses.retrieve(final.id) == final  # stored before response.completed was sent
    # The SDK's own stream accumulator accepts the sequence.
    with client.responses.stream(model=FAKE, input="Hello", max_output_tokens=40, temperature=0) as stream:
        assert stream.get_final_response().output_text == text
    # Cut by max_output_tokens: response.incomplete, the message item incomplete.
    events = _events(client.responses.create(model=FAKE, input="Hello", max_output_tokens=2, temperature=0,
                                             stream=True))
    final = events[-1].response
    assert events[-1].type == "response.incomplete" and final.status == "incomplete"
    assert final.incomplete_details.reason == "max_output_tokens" and final.output[-1].status == "incomplete"
    assert events[-2].item.status == "incomplete"
    plain = client.responses.create(model=FAKE, input="Hello", max_output_tokens=2, temperature=0)
    _same(plain, final)
    http_settled(srv)


def test_reasoning_and_function_calls_stream_and_round_trip(thinker):
    srv, client, engine = thinker
    plain = client.responses.create(model=FAKE, input="Weather in Paris?", tools=[WEATHER], max_output_tokens=200)
    reasoning, call = plain.output
    assert reasoning.type == "reasoning" and reasoning.id.startswith("rs_") and reasoning.summary == []
    assert [(c.type, c.text) for c in reasoning.content] == [("reasoning_text", "The user wants the weather.")]
    assert call.type == "function_call" and call.id.startswith("fc_") and call.call_id.startswith("call_")
    assert (call.name, json.loads(call.arguments), call.status) == ("get_weather", {"city": "Paris"}, "completed")
    assert 0 < plain.usage.output_tokens_details.reasoning_tokens < plain.usage.output_tokens
    events = _events(client.responses.create(model=FAKE, input="Weather in Paris?", tools=[WEATHER],
                                             max_output_tokens=200, stream=True))
    assert [e.type for e in events[2:-1]] == [
        "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done"]
    assert events[-1].type == "response.completed" and events[8].item.arguments == ""
    assert events[9].delta == events[10].arguments == call.arguments
    assert [e.output_index for e in events[2:-1]] == [0] * 6 + [1] * 4
    _same(plain, events[-1].response)
    # The call's result goes back by previous_response_id, or with the output items sent back.
    result = {"type": "function_call_output", "call_id": call.call_id, "output": '{"temp_c": 21}'}
    chained = client.responses.create(model=FAKE, input=[result], previous_response_id=plain.id, tools=[WEATHER],
                                      max_output_tokens=200)
    sent_back = client.responses.create(
        model=FAKE, tools=[WEATHER], max_output_tokens=200,
        input=[{"role": "user", "content": "Weather in Paris?"}] + [o.model_dump(exclude_none=True)
                                                                   for o in plain.output] + [result])
    assert chained.usage.input_tokens == sent_back.usage.input_tokens  # the same conversation, rendered alike
    listed = list(client.responses.input_items.list(sent_back.id, order="asc"))
    assert [i.id for i in listed[1:3]] == [reasoning.id, call.id]  # the items keep the ids they came with
    http_settled(srv)


def test_a_failure_mid_stream_is_response_failed(thinker):
    srv, client, engine = thinker
    engine.fail_next_request("device on fire")
    events = _events(client.responses.create(model=FAKE, input="Weather?", tools=[WEATHER], stream=True))
    final = events[-1]
    assert final.type == "response.failed" and final.response.status == "failed"
    assert final.response.error.code == "server_error" and "device on fire" in final.response.error.message
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(final.response.id)  # a failed response is not stored
    http_settled(srv)


def test_a_client_that_leaves_a_stream_cancels_it(thinker):
    srv, _, engine = thinker
    before = engine.stats().get("finished_cancelled", 0)
    engine.step_s = 0.05  # the answer takes seconds
    try:
        with httpx2.stream("POST", f"http://127.0.0.1:{srv.http.port}/v1/responses", timeout=30.0,
                           headers={"Authorization": f"Bearer {TOKEN}"},
                           json={"model": FAKE, "input": "Weather?", "tools": [WEATHER], "stream": True}) as r:
            lines = r.iter_lines()
            assert next(lines) == "event: response.created"
            assert json.loads(next(lines)[len("data: "):])["type"] == "response.created"
        assert wait_until(lambda: engine.stats().get("finished_cancelled", 0) == before + 1, 10.0)
    finally:
        engine.step_s = 0.001
    http_settled(srv)


# --- the real model: exactness and reuse ----------------------------------------------------------
def test_streamed_final_response_equals_the_plain_one_at_temperature_0(real):
    srv, client = real
    for kw, messages in (
            ({"input": "Hi there", "instructions": "Be brief.", "max_output_tokens": 12},
             [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]),
            ({"input": [{"role": "user", "content": "Tell me a story about a cat."}], "max_output_tokens": 20,
              "reasoning": {"effort": "none"}}, [{"role": "user", "content": "Tell me a story about a cat."}])):
        plain = client.responses.create(model=MODEL, temperature=0, **kw)
        events = _events(client.responses.create(model=MODEL, temperature=0, stream=True, **kw))
        final = events[-1].response
        _same(plain, final)
        assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == final.output_text
        want = srv.engine.chat(messages, sampling=SamplingParams(temperature=0, max_tokens=kw["max_output_tokens"]),
                               template_kwargs={"enable_thinking": False} if "reasoning" in kw else None)
        assert final.output_text == want.text and final.usage.output_tokens == len(want.token_ids)
        assert client.responses.retrieve(final.id) == final
    http_settled(srv)


def test_a_streamed_chain_reuses_the_previous_turn(real):
    srv, client = real
    r1 = client.responses.create(model=MODEL, input="Name a colour.", max_output_tokens=8, temperature=0)
    before = srv.engine.stats()["cached_tokens"]
    events = _events(client.responses.create(model=MODEL, input="And another?", previous_response_id=r1.id,
                                             max_output_tokens=8, temperature=0, stream=True))
    r2 = events[-1].response
    cached = r2.usage.input_tokens_details.cached_tokens
    assert cached > 0 and cached == srv.engine.stats()["cached_tokens"] - before  # the history r1 saved
    assert r2.previous_response_id == r1.id and client.responses.retrieve(r2.id) == r2
    http_settled(srv)


# --- the store: budget, restart, truncation -------------------------------------------------------
def test_the_store_budget_evicts_with_a_typed_404(caplog):
    with _served(responses_max_bytes=3000) as (srv, client):  # a stored response here is ~1.1 kB
        ids = [client.responses.create(model=FAKE, input=f"turn {k}", max_output_tokens=4).id for k in range(3)]
        assert srv.http.front.store.bytes <= 3000
        with pytest.raises(openai.NotFoundError, match="evicted.*3000 bytes") as info:
            client.responses.retrieve(ids[0])
        assert info.value.body["code"] == "response_not_found"
        with pytest.raises(openai.NotFoundError, match="evicted") as info:
            client.responses.create(model=FAKE, input="x", previous_response_id=ids[0])
        assert info.value.body["param"] == "previous_response_id"
        assert client.responses.retrieve(ids[2]).id == ids[2]
        with caplog.at_level("WARNING", logger="ninfer.frontend.responses"):
            big = client.responses.create(model=FAKE, input="word " * 450, max_output_tokens=4)
        assert big.status != "failed" and "not stored" in caplog.text  # answered, but not kept
        with pytest.raises(openai.NotFoundError, match="not stored: its .* bytes exceed the whole store budget"):
            client.responses.retrieve(big.id)
        assert client.responses.retrieve(ids[2]).id == ids[2]  # nothing evicted for it


def test_a_chain_survives_a_server_restart(tmp_path):
    with _served(responses_store=str(tmp_path)) as (_, client):
        r1 = client.responses.create(model=FAKE, input="Hi", instructions="Be brief.", max_output_tokens=4)
        r2 = client.responses.create(model=FAKE, input="More.", previous_response_id=r1.id, max_output_tokens=4)
        gone = client.responses.create(model=FAKE, input="Forget me.", max_output_tokens=4)
        client.responses.delete(gone.id)
        direct = client.responses.create(model=FAKE, input="Next.", previous_response_id=r2.id, max_output_tokens=4,
                                         temperature=0)
        listed = [i.id for i in client.responses.input_items.list(r2.id)]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{r.id}.json" for r in (r1, r2, direct))
    with _served(responses_store=str(tmp_path)) as (_, client):
        assert client.responses.retrieve(r2.id) == r2
        assert [i.id for i in client.responses.input_items.list(r2.id)] == listed
        again = client.responses.create(model=FAKE, input="Next.", previous_response_id=r2.id, max_output_tokens=4,
                                        temperature=0)
        assert again.output_text == direct.output_text  # the same prompt: the whole chain came back
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(gone.id)


def test_truncation_auto_fits_a_long_chain_and_disabled_refuses_it(fake):
    srv, client, engine = fake
    prev = None
    for k in range(3):  # each turn ~115 tokens; the context is 512
        prev = client.responses.create(model=FAKE, input=f"Turn {k}: " + "tell me about the sea " * 8,
                                       previous_response_id=prev, instructions="Be brief.", max_output_tokens=4).id
    before = engine.stats()["requests_submitted"]
    err = _error(_http(srv, "POST", "/v1/responses", json={
        "model": FAKE, "input": "Last: " + "and the sky " * 45, "previous_response_id": prev,
        "instructions": "Be brief.", "max_output_tokens": 4}), 400, "context_length_exceeded", "input")
    assert "truncation" in err["message"] and engine.stats()["requests_submitted"] == before
    cut = client.responses.create(model=FAKE, input="Last: " + "and the sky " * 45, previous_response_id=prev,
                                  instructions="Be brief.", max_output_tokens=4, truncation="auto")
    whole = int(err["message"].split("input has ")[1].split()[0])
    assert cut.truncation == "auto" and cut.status != "failed" and cut.usage.input_tokens <= 512 < whole
    # The chain keeps every turn: the next request is truncated again, from the whole history.
    again = client.responses.create(model=FAKE, input="Again.", previous_response_id=cut.id, max_output_tokens=4,
                                    truncation="auto")
    assert again.usage.input_tokens <= 512
    http_settled(srv)
