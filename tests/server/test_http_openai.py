"""The OpenAI-compatible HTTP API, driven by the official `openai` client against a live
server on loopback: the real engine on the built-in model (outputs compared with the same
engine in process), and the fake engine where a scripted answer (a tool call) or many fast
requests are needed."""
from __future__ import annotations

import asyncio
import json
import random
import re
import threading

import httpx2
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ninfer_jax import SamplingParams
from server import openai_convert as oc
from server.app import InferenceServer
from server.cli_commands import engine_factory
from fakes import FakeEngine, http_settled as _settled, serve_http as _serve, spawn_serve, wait_until

MODEL = "builtin:tiny-hybrid"
USER = [{"role": "user", "content": "Hello there"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def _client(srv, token="unused", **kw):
    return openai.OpenAI(api_key=token, base_url=f"http://127.0.0.1:{srv.http.port}/v1", max_retries=0,
                         timeout=120.0, **kw)


@pytest.fixture(scope="module")
def live():
    srv = _serve(engine_factory(MODEL, max_concurrency=4, max_context=512, progress=False))
    yield srv, _client(srv)
    srv.shutdown(grace_s=2.0)


# --- outputs equal the engine's ----------------------------------------------------------------
def test_chat_greedy_and_seeded_equal_the_engine_in_process(live):
    srv, client = live
    for sp, kw in ((SamplingParams(temperature=0, max_tokens=12), {"temperature": 0}),
                   (SamplingParams(temperature=0.9, top_p=0.95, seed=11, max_tokens=12),
                    {"temperature": 0.9, "top_p": 0.95, "seed": 11})):
        want = srv.engine.chat(USER, sampling=sp)
        got = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=12, **kw)
        assert got.choices[0].message.content == want.text
        assert got.usage.completion_tokens == len(want.token_ids)
        assert got.usage.prompt_tokens == len(want.prompt_token_ids)
        stream = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=12, stream=True,
                                                stream_options={"include_usage": True}, **kw)
        chunks = list(stream)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want.text
        assert chunks[-1].usage.completion_tokens == len(want.token_ids)
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    _settled(srv)


def test_completions_with_token_ids_and_logprobs(live):
    srv, client = live
    ids = [5, 77, 300, 12, 900, 41]
    want = srv.engine.generate(ids, SamplingParams(temperature=0, max_tokens=6, logprobs=2))
    got = client.completions.create(model=MODEL, prompt=ids, max_tokens=6, temperature=0, logprobs=2)
    assert got.choices[0].text == want.text
    assert got.choices[0].logprobs.token_logprobs == pytest.approx([lp.logprob for lp in want.logprobs])
    assert all(len(top) == 2 for top in got.choices[0].logprobs.top_logprobs)
    text = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt=ids, max_tokens=6, temperature=0, stream=True))
    assert text == want.text
    _settled(srv)


def test_completions_carry_explicit_save_points(live):
    """A pre-tokenising client names its chat structure: a later prompt that leaves this one at
    that frontier is served from it (extension fields, Engine.submit's save points)."""
    srv, client = live
    ids = [(11 * i + 5) % 997 for i in range(120)]
    client.completions.create(model=MODEL, prompt=ids, max_tokens=2, temperature=0,
                              extra_body={"markers": [64], "recovery_point": 100})
    got = client.completions.create(model=MODEL, prompt=ids[:100] + [1, 2, 3], max_tokens=2, temperature=0)
    assert got.usage.prompt_tokens_details.cached_tokens == 100
    with pytest.raises(openai.BadRequestError, match="outside"):
        client.completions.create(model=MODEL, prompt=ids, max_tokens=2, extra_body={"anchors": [500]})
    _settled(srv)


def test_second_agent_turn_reports_cached_tokens_equal_to_the_engine_counter(live):
    srv, client = live
    history = [{"role": "system", "content": "You are a weather agent."}, {"role": "user", "content": "Paris?"}]
    first = client.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER], max_tokens=8,
                                           temperature=0)
    history += [{"role": "assistant", "content": first.choices[0].message.content},
                {"role": "user", "content": "And Rome?"}]
    before = srv.engine.stats()["cached_tokens"]
    second = client.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER], max_tokens=8,
                                            temperature=0)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached > 0 and cached == srv.engine.stats()["cached_tokens"] - before
    # Exactness (doctrine 1): the cached turn equals the same turn on the engine in process.
    want = srv.engine.chat(history, tools=[WEATHER], sampling=SamplingParams(temperature=0, max_tokens=8))
    assert second.choices[0].message.content == want.text
    _settled(srv)


def _starts_with(ids, *parts) -> bool:
    want = [t for part in parts for t in part]
    return list(ids[:len(want)]) == want


def test_turn_two_renders_turn_one_exactly_over_chat_and_responses(live):
    """Issue 36: the returned message is the generated text with only its structure taken out, so
    the next turn's prompt starts with turn 1's prompt + generated tokens, whole (the built-in
    template renders content verbatim; every reply of this model starts with a newline, which a
    stripped reply lost). Streamed, not streamed, and a Responses chain's stored output."""
    srv, client = live
    user = [{"role": "user", "content": "Tell me a story about a cat."}]
    want = srv.engine.chat(user, sampling=SamplingParams(temperature=0, max_tokens=24))
    assert want.text.startswith("\n")  # what the stripped reply dropped
    frontend = srv.engine.chat_frontend()
    replies = [client.chat.completions.create(model=MODEL, messages=user, max_tokens=24, temperature=0)
               .choices[0].message.content]
    stream = client.chat.completions.create(model=MODEL, messages=user, max_tokens=24, temperature=0, stream=True)
    replies.append("".join(c.choices[0].delta.content or "" for c in stream if c.choices))
    for reply in replies:
        nxt = frontend.render_chat(user + [{"role": "assistant", "content": reply}, {"role": "user", "content": "More."}])
        assert _starts_with(nxt.token_ids, want.prompt_token_ids, want.token_ids)
    before = srv.engine.stats()["cached_tokens"]
    second = client.chat.completions.create(
        model=MODEL, messages=user + [{"role": "assistant", "content": replies[0]}, {"role": "user", "content": "More."}],
        max_tokens=2, temperature=0)
    assert second.usage.prompt_tokens_details.cached_tokens == srv.engine.stats()["cached_tokens"] - before > 0
    # Responses: the chain renders the stored output, the same way.
    system = {"role": "system", "content": "Be brief."}
    first = srv.engine.chat([system, {"role": "user", "content": "Hi there"}],
                            sampling=SamplingParams(temperature=0, max_tokens=12))
    r1 = client.responses.create(model=MODEL, input="Hi there", instructions="Be brief.", max_output_tokens=12,
                                 temperature=0)
    assert r1.output_text == first.text
    with srv.http.front.store_lock:
        chained = frontend.render_responses("And now?", store=srv.http.front.store, previous_response_id=r1.id,
                                            instructions="Be brief.")
    assert _starts_with(chained.prompt.token_ids, first.prompt_token_ids, first.token_ids)
    _settled(srv)


def test_vllm_stop_parameters_and_template_kwargs_are_honoured(live):
    """Issue 36: stop_token_ids, min_tokens, include_stop_str_in_output and chat_template_kwargs
    mean what they mean in vLLM: each answer equals the engine's own with the same values."""
    srv, client = live
    base = srv.engine.chat(USER, sampling=SamplingParams(temperature=0, max_tokens=12))
    first, third = base.token_ids[0], base.token_ids[2]
    cases = [({"stop_token_ids": [third]}, {"stop_token_ids": (third,)}),
             ({"stop_token_ids": [third], "include_stop_str_in_output": True},
              {"stop_token_ids": (third,), "include_stop_str_in_output": True}),
             ({"stop_token_ids": [first], "min_tokens": 3}, {"stop_token_ids": (first,), "min_tokens": 3}),
             ({"min_tokens": 4}, {"min_tokens": 4})]
    for body, params in cases:
        want = srv.engine.chat(USER, sampling=SamplingParams(temperature=0, max_tokens=12, **params))
        got = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=12, temperature=0,
                                             extra_body=body)
        assert got.choices[0].message.content == want.text, body
        assert got.usage.completion_tokens == len(want.token_ids), body
    text = client.completions.create(model=MODEL, prompt=[5, 77, 300], max_tokens=8, temperature=0,
                                     extra_body={"stop": [" "], "include_stop_str_in_output": True})
    want = srv.engine.generate([5, 77, 300], SamplingParams(temperature=0, max_tokens=8, stop=(" ",),
                                                             include_stop_str_in_output=True))
    assert text.choices[0].text == want.text
    # chat_template_kwargs reach the template: the built-in one opens an empty think block.
    off = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=6, temperature=0,
                                         extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    want = srv.engine.chat(USER, sampling=SamplingParams(temperature=0, max_tokens=6),
                           template_kwargs={"enable_thinking": False})
    plain = srv.engine.chat_frontend().render_chat(USER)
    assert off.usage.prompt_tokens == len(want.prompt_token_ids) > len(plain.token_ids)
    assert off.choices[0].message.content == want.text
    with pytest.raises(openai.BadRequestError, match="sampling.min_tokens"):
        client.chat.completions.create(model=MODEL, messages=USER, max_tokens=4, extra_body={"min_tokens": 9})
    _settled(srv)


CITY = {"type": "object", "additionalProperties": False, "required": ["city", "days"],
        "properties": {"city": {"type": "string", "maxLength": 10}, "days": {"type": "integer", "minimum": 0,
                                                                             "maximum": 9}}}
BOUNDED_WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city.",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                   "properties": {"city": {"type": "string", "maxLength": 8}}}}}


@pytest.mark.parametrize("stream", [False, True])
def test_n_choices_share_the_prompt_and_equal_their_engine_runs(live, stream):
    """Issue 36: n choices. The first prefills the prompt; the others start once it has and find
    the prompt in the cache (the engine counts their cached tokens). Choice i draws with seed + i,
    so each equals the engine's run with that seed; greedy choices are all the same."""
    srv, client = live
    user = [{"role": "user", "content": f"Three choices, streamed={stream}."}]
    before = srv.engine.stats()
    kw = dict(model=MODEL, messages=user, max_tokens=10, temperature=0.9, seed=21, n=3)
    if stream:
        chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
        texts = ["".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == i)
                 for i in range(3)]
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert len(finishes) == 3
        usage = chunks[-1].usage
    else:
        got = client.chat.completions.create(**kw)
        assert [c.index for c in got.choices] == [0, 1, 2]
        texts = [c.message.content for c in got.choices]
        usage = got.usage
    after = srv.engine.stats()
    wants = [srv.engine.chat(user, sampling=SamplingParams(temperature=0.9, seed=21 + i, max_tokens=10))
             for i in range(3)]
    assert texts == [w.text for w in wants]
    assert usage.prompt_tokens == len(wants[0].prompt_token_ids)
    assert usage.completion_tokens == sum(len(w.token_ids) for w in wants)
    assert after["requests_submitted"] - before["requests_submitted"] == 3
    # The prompt was prefilled once: choices 1 and 2 start from the whole of it (an exact hit at
    # the anchor choice 0 saved at its end), beyond what choice 0 itself found in the cache.
    found = usage.prompt_tokens_details.cached_tokens
    assert after["prefill_tokens"] - before["prefill_tokens"] == usage.prompt_tokens - found
    assert after["cached_tokens"] - before["cached_tokens"] == found + 2 * usage.prompt_tokens
    text = client.completions.create(model=MODEL, prompt=[5, 77, 300], max_tokens=6, temperature=0, n=2)
    assert [c.index for c in text.choices] == [0, 1] and text.choices[0].text == text.choices[1].text
    _settled(srv)


def test_structured_output_over_chat_completions_and_responses(live):
    """Issue 36: response_format json_object / json_schema, vLLM's guided fields, tool_choice
    named or required, and Responses text.format: the output matches, and equals the engine's
    own with the same StructuredOutput."""
    from ninfer_jax.engine.grammar import StructuredOutput

    srv, client = live

    def engine_text(so, messages=USER, tools=None, max_tokens=40):
        return srv.engine.chat(messages, tools=tools, sampling=SamplingParams(temperature=0, max_tokens=max_tokens,
                                                                              structured_output=so)).text

    got = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=40, temperature=0,
                                         response_format={"type": "json_schema",
                                                          "json_schema": {"name": "city", "schema": CITY,
                                                                          "strict": True}})
    data = json.loads(got.choices[0].message.content)
    assert set(data) == {"city", "days"} and 0 <= data["days"] <= 9 and got.choices[0].finish_reason == "stop"
    assert got.choices[0].message.content == engine_text(StructuredOutput("json_schema", CITY))
    obj = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=40, temperature=0,
                                         response_format={"type": "json_object"})
    assert isinstance(json.loads(obj.choices[0].message.content), dict)
    choice = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=8, temperature=0.9, seed=4,
                                            extra_body={"guided_choice": ["sunny", "rainy"]})
    assert choice.choices[0].message.content in ("sunny", "rainy")
    regex = client.completions.create(model=MODEL, prompt="Code:", max_tokens=12, temperature=0,
                                      extra_body={"guided_regex": "[A-Z]{2}-[0-9]{3}"})
    assert re.fullmatch("[A-Z]{2}-[0-9]{3}", regex.choices[0].text)
    named = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=40, temperature=0,
                                           tools=[BOUNDED_WEATHER],
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}})
    calls = named.choices[0].message.tool_calls
    assert named.choices[0].finish_reason == "tool_calls" and [c.function.name for c in calls] == ["get_weather"]
    assert set(json.loads(calls[0].function.arguments)) == {"city"}
    r = client.responses.create(model=MODEL, input="Paris?", max_output_tokens=40, temperature=0,
                                text={"format": {"type": "json_schema", "name": "city", "schema": CITY}})
    assert set(json.loads(r.output_text)) == {"city", "days"}
    assert r.output_text == engine_text(StructuredOutput("json_schema", CITY), [{"role": "user", "content": "Paris?"}])
    _settled(srv)


def test_prompt_logprobs_are_the_models_own(live):
    """Issue 36: vLLM's prompt_logprobs. The request prefills its whole prompt (nothing reused: every
    position's logits are needed); each prompt token after the first gets its logprob, rank and the
    top ones, equal to the whole-sequence forward's."""
    import numpy as np

    srv, client = live
    ids = [(7 * i + 3) % 900 + 5 for i in range(40)]
    client.completions.create(model=MODEL, prompt=ids, max_tokens=2, temperature=0)  # now cached
    before = srv.engine.stats()["prefill_tokens"]
    got = client.completions.create(model=MODEL, prompt=ids, max_tokens=2, temperature=0,
                                    extra_body={"prompt_logprobs": 3})
    assert srv.engine.stats()["prefill_tokens"] - before == len(ids)  # cold, though cached
    assert got.usage.prompt_tokens_details.cached_tokens == 0
    plp = got.choices[0].model_extra["prompt_logprobs"]
    assert len(plp) == len(ids) and plp[0] is None
    logits = np.asarray(srv.engine.program.model.forward(np.array(ids, np.int32)), np.float64)
    ref = logits - logits.max(-1, keepdims=True)
    ref -= np.log(np.exp(ref).sum(-1, keepdims=True))
    for p in range(1, len(ids)):
        entry = plp[p][str(ids[p])]
        assert abs(entry["logprob"] - ref[p - 1, ids[p]]) < 1e-4
        assert entry["rank"] == 1 + int(np.sum(ref[p - 1] > ref[p - 1, ids[p]]))
        assert len(plp[p]) >= 3
    chat = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=2, temperature=0,
                                          extra_body={"prompt_logprobs": 0})
    assert len(chat.model_extra["prompt_logprobs"]) == chat.usage.prompt_tokens
    with pytest.raises(openai.BadRequestError, match="prompt_logprobs"):
        client.chat.completions.create(model=MODEL, messages=USER, max_tokens=2, stream=True,
                                       extra_body={"prompt_logprobs": 1})
    _settled(srv)


@pytest.mark.parametrize("field, value", [("guided_decoding_backend", "xgrammar"),
                                          ("guided_whitespace_pattern", " *"), ("use_beam_search", True),
                                          ("skip_special_tokens", False), ("chat_template", "{{ x }}"),
                                          ("priority", 1), ("add_generation_prompt", False)])
def test_vllm_fields_not_served_are_refused_naming_them(live, field, value):
    """A known field this server does not honour is a typed 400 naming it, before any work; its
    neutral value (the default) is accepted."""
    srv, client = live
    before = srv.engine.stats()["requests_submitted"]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=USER, max_tokens=2, extra_body={field: value})
    assert err.value.body["param"] == field and err.value.body["code"] == "unsupported_parameter"
    assert srv.engine.stats()["requests_submitted"] == before
    neutral = oc.UNSERVED[field][0][-1]
    got = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=2, extra_body={field: neutral})
    assert got.choices[0].finish_reason == "length"


@pytest.fixture
def fresh():
    """A server of its own: a test whose cache must not hold what earlier tests left (the live
    server's StateImage slots fill up over the module, and a capture that cannot be admitted is
    skipped)."""
    srv = _serve(engine_factory(MODEL, max_concurrency=2, max_context=512, progress=False))
    yield srv, _client(srv)
    srv.shutdown(grace_s=2.0)


def test_cache_control_on_a_content_part_is_a_shared_marker(fresh):
    """SH-2: Anthropic-style cache_control marks a shared entry another conversation reuses."""
    srv, client = fresh
    system = {"role": "system", "content": [{"type": "text", "text": "You are the weather desk of a newspaper.",
                                             "cache_control": {"type": "ephemeral"}}]}
    client.chat.completions.create(model=MODEL, messages=[system, {"role": "user", "content": "Paris?"}],
                                   max_tokens=2, temperature=0)
    shared = srv.engine.stats()["cache_hits_shared"]
    other = client.chat.completions.create(model=MODEL, messages=[system, {"role": "user", "content": "Oslo!"}],
                                           max_tokens=4, temperature=0)
    assert other.usage.prompt_tokens_details.cached_tokens > 0
    assert srv.engine.stats()["cache_hits_shared"] == shared + 1
    want = srv.engine.chat([system, {"role": "user", "content": "Oslo!"}],
                           sampling=SamplingParams(temperature=0, max_tokens=4))
    assert other.choices[0].message.content == want.text
    _settled(srv)


def test_responses_chained_by_previous_response_id(live):
    srv, client = live
    r1 = client.responses.create(model=MODEL, input="Hi there", instructions="Be brief.", max_output_tokens=6,
                                 temperature=0)
    assert r1.status == "incomplete" and r1.usage.output_tokens == 6
    # Instructions are not carried over from a previous response (the API's rule): sent again.
    r2 = client.responses.create(model=MODEL, input="And now?", previous_response_id=r1.id, instructions="Be brief.",
                                 max_output_tokens=6, temperature=0)
    assert r2.previous_response_id == r1.id
    assert r2.usage.input_tokens_details.cached_tokens > 0  # SH-5: the history r1 saved
    # The chain names exactly the conversation: the same messages in one chat call agree.
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
                {"role": "assistant", "content": r1.output_text}, {"role": "user", "content": "And now?"}]
    want = srv.engine.chat(messages, sampling=SamplingParams(temperature=0, max_tokens=6))
    assert r2.output_text == want.text
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, input="x", previous_response_id="resp-unknown")
    _settled(srv)


def test_models_listing(live):
    srv, client = live
    models = client.models.list()
    assert [m.id for m in models] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("gpt-nothing")
    assert info.value.body["code"] == "model_not_found"


def test_x_request_id_is_echoed_and_names_the_request(live):
    """Issue 37: a client's X-Request-Id is the request's id (the answer's and the engine's) and
    comes back on plain and streamed answers and on errors; without one the server makes one."""
    srv, _ = live
    base = f"http://127.0.0.1:{srv.http.port}"
    body = {"model": MODEL, "messages": USER, "max_tokens": 2}
    r = httpx2.post(f"{base}/v1/chat/completions", headers={"X-Request-Id": "trace-42.a"}, json=body)
    assert r.status_code == 200 and r.headers["x-request-id"] == "trace-42.a" and r.json()["id"] == "trace-42.a"
    with httpx2.stream("POST", f"{base}/v1/chat/completions", json=dict(body, stream=True)) as s:
        made = s.headers["x-request-id"]
        ids = {json.loads(line[6:])["id"] for line in s.iter_lines() if line.startswith("data: {")}
    assert made.startswith("chatcmpl-") and ids == {made}
    m = httpx2.post(f"{base}/v1/messages", headers={"X-Request-Id": "agent-7"},
                    json={"model": MODEL, "max_tokens": 2, "messages": USER})
    assert m.json()["id"] == "agent-7" and m.headers["x-request-id"] == "agent-7"
    missing = httpx2.get(f"{base}/v1/models/nope", headers={"X-Request-Id": "lost-1"})
    assert missing.status_code == 404 and missing.headers["x-request-id"] == "lost-1"
    bad = httpx2.post(f"{base}/v1/chat/completions", headers={"X-Request-Id": "x" * 200}, json=body)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "X-Request-Id"
    _settled(srv)


def test_tokenize_and_detokenize(live):
    srv, _ = live
    base = f"http://127.0.0.1:{srv.http.port}"
    t = httpx2.post(f"{base}/tokenize", json={"model": MODEL, "prompt": "Hello there"}).json()
    assert t["tokens"] == list(srv.engine.tokenizer.encode("Hello there")) and t["count"] == len(t["tokens"])
    assert t["max_model_len"] == 512
    chat = httpx2.post(f"{base}/tokenize", json={"messages": USER}).json()
    assert chat["tokens"] == list(srv.engine.chat_frontend().render_chat(USER).token_ids)
    back = httpx2.post(f"{base}/detokenize", json={"tokens": t["tokens"]}).json()
    assert back["prompt"] == "Hello there"
    for path, body in (("/tokenize", {}), ("/tokenize", {"prompt": "a", "messages": USER}),
                       ("/detokenize", {"tokens": [10 ** 9]}), ("/detokenize", {"tokens": "abc"}),
                       ("/tokenize", {"model": "gpt-nothing", "prompt": "a"})):
        r = httpx2.post(base + path, json=body)
        assert r.status_code in (400, 404) and set(r.json()["error"]) == {"message", "type", "param", "code"}, r.text


# --- bad input ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, exc, needle", [
    ({"model": "gpt-nothing", "messages": USER}, openai.NotFoundError, "does not exist"),
    ({"model": MODEL, "messages": [{"role": "robot", "content": "hi"}]}, openai.BadRequestError, "UnknownRoleError"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "word " * 2000}]}, openai.BadRequestError,
     "context_length_exceeded"),
    ({"model": MODEL, "messages": USER, "max_tokens": -3}, openai.BadRequestError, "max_tokens"),
    ({"model": MODEL, "messages": USER, "n": 9}, openai.BadRequestError, "n: must lie in [1, 8]"),
    ({"model": MODEL, "messages": USER, "n": 0}, openai.BadRequestError, "n: must lie in [1, 8]"),
    ({"model": MODEL, "messages": USER, "tool_choice": "required"}, openai.BadRequestError, "needs tools"),
    ({"model": MODEL, "messages": USER, "tools": [WEATHER],
      "tool_choice": {"type": "function", "function": {"name": "nope"}}}, openai.BadRequestError, "not among"),
    ({"model": MODEL, "messages": USER, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     openai.BadRequestError, "schema object"),
    ({"model": MODEL, "messages": USER, "response_format": {"type": "json_object"},
      "extra_body": {"guided_regex": "a+"}}, openai.BadRequestError, "one structured output"),
    ({"model": MODEL, "messages": USER, "extra_body": {"guided_regex": "("}}, openai.BadRequestError,
     "does not compile"),
    ({"model": MODEL, "messages": USER, "extra_body": {"cache_markers": [{"message": -1}]}},
     openai.BadRequestError, "non-negative"),
    ({"model": MODEL, "messages": []}, openai.BadRequestError, "messages"),
])
def test_bad_requests_are_openai_errors(live, kwargs, exc, needle):
    srv, client = live
    before = srv.engine.stats()["requests_submitted"]
    with pytest.raises(exc) as info:
        client.chat.completions.create(**kwargs)
    assert needle in json.dumps(info.value.body)
    assert set(info.value.body) >= {"message", "type", "param", "code"}
    assert srv.engine.stats()["requests_submitted"] == before  # refused before the engine


def test_malformed_json_and_oversized_bodies(live):
    srv, _ = live
    url = f"http://127.0.0.1:{srv.http.port}/v1/chat/completions"
    r = httpx2.post(url, content=b'{"model": "x", "messages": [', headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    big = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "a" * (9 << 20)}]})
    r = httpx2.post(url, content=big.encode(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


# --- a client that leaves ---------------------------------------------------------------------
def _metric(base: str, name: str, **labels) -> float:
    text = httpx2.get(f"{base}/metrics").text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    raise AssertionError(f"{name} {labels} not exported")


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_leaves_a_generating_request_cancels_it(stream):
    """Issue 36: a request that keeps generating (a token every 50 ms, 2,000 to go: 100 s) is
    cancelled once its client goes, streamed or not: it ends `cancelled`, frees its lane, and
    the metrics show it. (The non-streaming call used to look for its client only after 0.25 s
    without output, which a generating request never reaches.)"""
    fake = FakeEngine(max_concurrency=2, max_context=4096, step_s=0.05, min_len=2000, max_len=2000, model="fake:tiny")
    srv = _serve(lambda: fake)
    try:
        base = f"http://127.0.0.1:{srv.http.port}"
        body = {"model": "fake:tiny", "messages": USER, "max_tokens": 2000, "stream": stream}
        with httpx2.Client(timeout=httpx2.Timeout(10.0, read=0.5)) as http:
            if stream:  # leave after the first chunks: closing the response closes the connection
                with http.stream("POST", f"{base}/v1/chat/completions", json=body) as resp:
                    for i, _ in enumerate(resp.iter_raw()):
                        if i == 3:
                            break
            else:  # nothing comes before the end: the client gives up waiting
                with pytest.raises(httpx2.ReadTimeout):
                    http.post(f"{base}/v1/chat/completions", json=body)
        assert wait_until(lambda: fake.stats()["requests_cancelled"] == 1, 30.0), fake.stats()
        assert wait_until(lambda: srv.http.front.active_count() == 0, 30.0)
        stats = fake.stats()
        assert stats["residents"] == 0 and stats["requests_finished"] == 0 and stats["generated_tokens"] < 2000
        assert _metric(base, "ninfer:requests_total", outcome="cancelled") == 1
        assert _metric(base, "ninfer:requests_running") == 0
        fake.check_integrity()
    finally:
        srv.shutdown(grace_s=1.0)
        fake.close()


def test_a_queued_stream_whose_client_leaves_is_cancelled_before_it_runs():
    """A quiet stream (queued behind a 100-second request, so it writes nothing after its first
    chunk) is cancelled when its client goes, not when it would next write."""
    fake = FakeEngine(max_concurrency=1, max_context=4096, step_s=0.05, min_len=2000, max_len=2000, model="fake:tiny")
    srv = _serve(lambda: fake)
    try:
        url = f"http://127.0.0.1:{srv.http.port}/v1/chat/completions"
        release = threading.Event()
        blocker = threading.Thread(target=lambda: _leave_after(url, stream=True, read_s=30.0, until=release),
                                   daemon=True)
        blocker.start()
        assert wait_until(lambda: fake.stats()["residents"] == 1, 30.0)
        _leave_after(url, stream=True, read_s=30.0)  # queued: reads its first chunk, then closes
        assert wait_until(lambda: fake.stats()["requests_cancelled"] == 1, 30.0), fake.stats()
        assert fake.stats()["residents"] == 1  # the blocker still runs: the queued one went without running
        release.set()
        blocker.join(30.0)
        assert wait_until(lambda: fake.stats()["requests_cancelled"] == 2, 30.0), fake.stats()
        assert wait_until(lambda: srv.http.front.active_count() == 0, 30.0)
        fake.check_integrity()
    finally:
        srv.shutdown(grace_s=1.0)
        fake.close()


def _leave_after(url: str, *, stream: bool, read_s: float, until: threading.Event | None = None) -> None:
    """A long chat request whose client goes: a stream after its first chunk (and once `until` is
    set), a plain call when its read times out (`read_s`)."""
    body = {"model": "fake:tiny", "messages": USER, "max_tokens": 2000, "stream": stream}
    with httpx2.Client(timeout=httpx2.Timeout(10.0, read=read_s)) as http:
        if stream:
            with http.stream("POST", url, json=body) as resp:
                chunks = resp.iter_raw()  # kept: a dropped iterator closes the response
                next(chunks)
                if until is not None:
                    until.wait(60.0)
        else:
            with pytest.raises(httpx2.ReadTimeout):
                http.post(url, json=body)


# --- auth, health, a scripted tool call --------------------------------------------------------
def test_auth_on_and_off_and_health():
    fake = FakeEngine(max_concurrency=4, max_context=256, model="fake:tiny")
    srv = _serve(lambda: fake, token="s3cret")
    try:
        base = f"http://127.0.0.1:{srv.http.port}"
        assert httpx2.get(f"{base}/health").status_code == 200  # open, like gRPC health
        with pytest.raises(openai.AuthenticationError):
            _client(srv, token="wrong").models.list()
        assert httpx2.get(f"{base}/metrics").status_code == 401
        assert [m.id for m in _client(srv, token="s3cret").models.list()] == ["fake:tiny"]
    finally:
        srv.shutdown(grace_s=1.0)
        fake.close()


def test_health_is_503_until_warm_up_ends():
    srv = InferenceServer(lambda: FakeEngine(), port=None, http_port=0, progress=lambda m: None)
    srv.start()
    try:
        base = f"http://127.0.0.1:{srv.http.port}"
        assert httpx2.get(f"{base}/health").status_code == 503
        r = httpx2.get(f"{base}/v1/models")
        assert r.status_code == 503 and r.json()["error"]["code"] == "unavailable"
        srv.warm_up()
        assert httpx2.get(f"{base}/health").status_code == 200
    finally:
        srv.shutdown(grace_s=1.0)
        srv.engine.close()


def test_tool_call_round_trip():
    """A model answering with a tool call: parsed into tool_calls (streamed and not); the
    client's next turn carries the call and its result back."""
    fake = FakeEngine(max_concurrency=2, max_context=512, model="fake:tiny", script=CALL_TEXT)
    srv = _serve(lambda: fake)
    try:
        client = _client(srv)
        msgs = [{"role": "user", "content": "Weather in Paris?"}]
        got = client.chat.completions.create(model="fake:tiny", messages=msgs, tools=[WEATHER], max_tokens=64)
        choice = got.choices[0]
        assert choice.finish_reason == "tool_calls" and not choice.message.content
        call = choice.message.tool_calls[0]
        assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
        chunks = list(client.chat.completions.create(model="fake:tiny", messages=msgs, tools=[WEATHER],
                                                     max_tokens=64, stream=True))
        assert not "".join(c.choices[0].delta.content or "" for c in chunks)  # no markup leaks as content
        streamed = [t for c in chunks for t in (c.choices[0].delta.tool_calls or [])]
        assert [(t.function.name, json.loads(t.function.arguments)) for t in streamed] == [("get_weather", {"city": "Paris"})]
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
        msgs += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 21}'}]
        again = client.chat.completions.create(model="fake:tiny", messages=msgs, tools=[WEATHER], max_tokens=64)
        assert again.choices[0].message.tool_calls  # the history rendered; the scripted model calls again
        plain = client.chat.completions.create(model="fake:tiny", messages=msgs, tools=[WEATHER], max_tokens=64,
                                               tool_choice="none")
        assert plain.choices[0].message.content == CALL_TEXT and not plain.choices[0].message.tool_calls
    finally:
        srv.shutdown(grace_s=1.0)
        fake.close()


# --- many streams, disconnects, metrics --------------------------------------------------------
def test_200_streams_with_random_disconnects_end_and_leak_nothing(live):
    srv, client = live
    url = f"http://127.0.0.1:{srv.http.port}/v1/chat/completions"
    rng = random.Random(3)
    plan = [rng.choice(["full", "cut_early", "cut_late", "abort_before_body"]) for _ in range(200)]
    before = srv.engine.stats()

    async def one(http, i, kind):
        body = {"model": MODEL, "messages": [{"role": "user", "content": f"stream {i}"}], "max_tokens": 8,
                "temperature": 0, "stream": True}
        got = 0
        try:
            async with http.stream("POST", url, json=body) as resp:
                assert resp.status_code == 200
                if kind == "abort_before_body":
                    return "cut"
                async for line in resp.aiter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        got += 1
                        if (kind == "cut_early" and got == 1) or (kind == "cut_late" and got == 4):
                            return "cut"  # leaving the block closes the connection mid-stream
                    if line == "data: [DONE]":
                        return "done"
        except httpx2.HTTPError:
            return "cut"
        return "eof"

    async def main():
        limits = httpx2.Limits(max_connections=250, max_keepalive_connections=0)
        async with httpx2.AsyncClient(timeout=300.0, limits=limits) as http:
            return await asyncio.gather(*(one(http, i, k) for i, k in enumerate(plan)))

    outcomes = asyncio.run(main())
    assert outcomes.count("done") == plan.count("full")
    _settled(srv)
    after = srv.engine.stats()
    ended = sum(after[k] - before[k] for k in ("requests_finished", "requests_cancelled", "requests_failed"))
    assert after["requests_submitted"] - before["requests_submitted"] == 200 == ended
    assert after["requests_cancelled"] > before["requests_cancelled"]  # disconnects cancelled in the engine
    # The server keeps serving.
    assert client.chat.completions.create(model=MODEL, messages=USER, max_tokens=2, temperature=0).choices


def test_metrics_parse_and_move(live):
    srv, client = live
    url = f"http://127.0.0.1:{srv.http.port}/metrics"

    def scrape():
        out = {}
        for fam in text_string_to_metric_families(httpx2.get(url).text):
            for sample in fam.samples:
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return out

    a = scrape()
    client.chat.completions.create(model=MODEL, messages=USER, max_tokens=3, temperature=0)
    b = scrape()
    key = ("ninfer:generation_tokens_total", ())
    assert b[key] - a[key] == 3
    assert b[("ninfer:requests_submitted_total", ())] == a[("ninfer:requests_submitted_total", ())] + 1
    assert b[("ninfer:e2e_request_latency_seconds_count", ())] == a[("ninfer:e2e_request_latency_seconds_count", ())] + 1
    assert ("ninfer:pool_units_total", (("pool", "main_kv"),)) in b
    assert b[("ninfer:time_to_first_token_seconds_bucket", (("le", "+Inf"),))] >= 1
    # GetStats and /metrics read the same counters.
    assert b[("ninfer:prompt_tokens_total", ())] == srv.engine.stats()["prompt_tokens"]


def test_ninfer_serve_http_only_drains_a_running_stream_on_sigterm():
    import signal

    with spawn_serve("--model=fake:tiny", "--port=-1", "--http_port=0", "--grace_s=5",
                     pattern=r"serving .* on http://(127\.0\.0\.1:\d+)") as (proc, address):
        client = openai.OpenAI(api_key="x", base_url=f"http://{address}/v1", max_retries=0, timeout=30)
        stream = client.chat.completions.create(model="fake:tiny", messages=USER, max_tokens=20, stream=True)
        next(iter(stream))
        proc.send_signal(signal.SIGTERM)
        rest = list(stream)  # the running stream finishes inside the grace period
        assert [c.choices[0].finish_reason for c in rest if c.choices][-1] in ("stop", "length")
        assert proc.wait(20) == 0
        tail = proc.stderr.read()
        assert "shutting down" in tail and "stopped" in tail
