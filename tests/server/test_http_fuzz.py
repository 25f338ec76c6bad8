"""A fuzzer of the OpenAI-compatible HTTP API (hypothesis), on one live server over the fake
engine. It sends:

* bodies of each generation endpoint: a valid request (a conversation with tool calls and
  their results, a text or token prompt, Responses items) with 0 to 3 mutations: a field at or
  past its limits or of the wrong type, any JSON value (NaN, huge ints, lone surrogates, deep
  lists) put anywhere in the tree, a key dropped or added;
* raw bodies (random bytes, cut JSON, bad UTF-8, UTF-16, trailing junk), chunked or not, under
  random content types, bearer tokens and other headers;
* random methods on random paths;
* clients that leave: up to four requests at once (two run at a time, so some wait), each ended
  by a short read timeout, a stream read for a few lines, or a socket closed, reset or half
  closed while sending its body or waiting for the answer.

What must hold for any input: no answer is a 5xx; every 4xx is the API's typed error
`{"error": {"message": str, "type": str, "param": str|null, "code": str|null}}` (on every path
but /health and /metrics, whose shapes are their own), so a client can always parse it; a 2xx
JSON answer parses and a stream's events are JSON objects or `[DONE]`. The server logs no
internal error (that is a 5xx too, if its client has gone). After each test, not after each
example (that keeps it fast), nothing leaks: the front runs no request, the engine holds none
running or queued and passes check_integrity(), and a valid chat request still gets 200.

The budget is fixed and seeded (derandomize, no example database), so CI runs the same
examples each time: 250 bodies per endpoint, 300 raw bodies, 200 method and path pairs, 50
groups of leaving clients (BODY_EXAMPLES and the rest). About 30 seconds on a 2-core machine
(most of it the body tests, which are CPU-bound; the leaving clients mostly wait), so under a
minute when it is busy. Each test checks that its examples reached generation as well as the
refusals (`reached`), so strategies that drift to all-400 are seen. Longer unseeded runs found
the bugs at the end of this file (each a 500, or an internal error logged); they are fixed, and
their minimal requests stay as regression tests.
"""
from __future__ import annotations

import collections
import copy
import json
import logging
import socket
import struct
import threading
import time
import traceback

import httpx2
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from starlette.requests import ClientDisconnect

from fakes import FakeEngine, wait_until
from server.app import InferenceServer

MODEL = "fake:tiny"
TOKEN = "fuzz-token"  # the server has one, so the header fuzz reaches the 401; other examples send it
AUTH = {"authorization": f"Bearer {TOKEN}"}
GENERATE = ("/v1/chat/completions", "/v1/completions", "/v1/responses")
BODY_EXAMPLES, RAW_EXAMPLES, PATH_EXAMPLES, LEAVE_EXAMPLES = 250, 300, 200, 50  # the budget, per test
SEEN: collections.Counter = collections.Counter()  # the statuses answered in the current test


def _settings(n: int):
    return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.data_too_large])


# The app logs "internal error in an HTTP request", uvicorn "Exception in ASGI application".
LOGGERS = ("ninfer.http", "uvicorn.error")


class Errors(logging.Handler):
    """The server's error log records: an exception the app did not map to an answer is a 5xx,
    seen by the client or not (one whose client is gone answers nobody)."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def quiet(self, still: float = 0.2, timeout: float = 5.0) -> None:
        """Wait until no record came for `still` seconds. The server logs a traceback after it
        answers, and Python 3.11 formats tracebacks with `ast`, whose state is not thread-safe:
        pytest rendering a failure at that moment crashes ("AST constructor recursion depth
        mismatch")."""
        deadline = time.monotonic() + timeout
        seen, since = len(self.records), time.monotonic()
        while time.monotonic() < deadline and time.monotonic() - since < still:
            time.sleep(0.02)
            if len(self.records) != seen:
                seen, since = len(self.records), time.monotonic()

    def take(self, known=()) -> list[str]:
        """The records since the last call, as text, less those whose exception is of a `known` type."""
        records, self.records = self.records, []
        out = []
        for r in records:
            if r.exc_info and isinstance(r.exc_info[1], known):
                continue
            out.append(f"{r.name}: {r.getMessage()}\n" + ("".join(traceback.format_exception(*r.exc_info))
                                                          if r.exc_info else ""))
        return out


ERRORS = Errors()


@pytest.fixture(scope="module")
def served():
    # A request makes a token every 3 ms, at most 24, and two run at a time: a client that leaves
    # within 0-150 ms finds its request queued, generating or done. 1024 tokens of context, so a
    # valid chat with tools fits (one tool renders to ~270 tokens).
    fake = FakeEngine(max_concurrency=2, max_context=1024, model=MODEL, step_s=0.003)
    srv = InferenceServer(lambda: fake, port=None, http_port=0, token=TOKEN, grace_s=1.0,
                          progress=lambda m: None)
    srv.start()
    srv.warm_up()
    client = httpx2.Client(base_url=f"http://127.0.0.1:{srv.http.port}", timeout=30.0)
    errors = ERRORS
    errors.take()
    for name in LOGGERS:  # uvicorn configures its loggers when the server starts: attach after
        logging.getLogger(name).addHandler(errors)
    yield srv, fake, client, errors
    for name in LOGGERS:
        logging.getLogger(name).removeHandler(errors)
    client.close()
    srv.shutdown(grace_s=1.0)
    fake.close()


# --- what every answer must be ---------------------------------------------------------------
def _error_shape(r, what) -> None:
    try:
        body = r.json()
    except ValueError:
        raise AssertionError(f"{what}: {r.status_code} body is not JSON: {r.text[:300]!r}") from None
    assert isinstance(body, dict) and set(body) == {"error"}, (what, r.status_code, body)
    err = body["error"]
    assert isinstance(err, dict) and set(err) == {"message", "type", "param", "code"}, (what, r.status_code, body)
    assert isinstance(err["message"], str) and err["message"], (what, body)
    assert isinstance(err["type"], str) and err["type"], (what, body)
    assert err["param"] is None or isinstance(err["param"], str), (what, body)
    assert err["code"] is None or isinstance(err["code"], str), (what, body)


def _events(text: str, what) -> None:
    """A stream's events: JSON objects (an error event in the API's shape, not a server error)
    then `[DONE]`; Responses events are each preceded by an `event:` line naming their type."""
    for line in text.splitlines():
        if not line.startswith("data: "):
            assert not line.strip() or line.startswith((":", "event: ")), (what, line[:200])
            continue
        data = line[len("data: "):]
        if data == "[DONE]":
            continue
        event = json.loads(data)
        assert isinstance(event, dict), (what, data[:200])
        if "error" in event:
            assert event["error"].get("type") != "server_error", (what, data[:300])


def _anthropic_error_shape(r, what) -> None:
    """Anthropic's error object on its paths: {"type": "error", "error": {"type", "message"}}."""
    body = r.json()
    assert isinstance(body, dict) and set(body) == {"type", "error"} and body["type"] == "error", (what, body)
    err = body["error"]
    assert set(err) == {"type", "message"} and err["message"] and err["type"] != "api_error", (what, body)


def _anthropic_events(text: str, what) -> None:
    """A Messages stream: `event:` / `data:` pairs of JSON objects, no internal error."""
    for line in text.splitlines():
        if line.startswith("data: "):
            event = json.loads(line[len("data: "):])
            assert isinstance(event, dict) and "type" in event, (what, line[:200])
            if event["type"] == "error":
                assert event["error"]["type"] != "api_error", (what, line[:300])
        else:
            assert not line.strip() or line.startswith("event: "), (what, line[:200])


def check_answer(r, method: str, path: str, what) -> None:
    """No 5xx; a 4xx is the typed error object (except on /health and /metrics, whose own
    shapes differ, and HEAD, which has no body); a 2xx parses."""
    if r.status_code >= 500:
        ERRORS.quiet()  # its traceback logged before the failure is rendered (Errors.quiet says why)
    assert r.status_code < 500, (what, r.status_code, r.text[:500])
    SEEN[r.status_code] += 1
    if method == "HEAD" or path.split("?")[0] in ("/health", "/metrics"):
        return
    if path.startswith("/v1/messages"):
        if r.status_code >= 400:
            _anthropic_error_shape(r, what)
        elif r.headers.get("content-type", "").startswith("text/event-stream"):
            _anthropic_events(r.text, what)
        else:
            json.loads(r.content)
        return
    if r.status_code >= 400:
        _error_shape(r, what)
    elif 200 <= r.status_code < 300:
        kind = r.headers.get("content-type", "")
        if kind.startswith("application/json"):
            json.loads(r.content)
        elif kind.startswith("text/event-stream"):
            _events(r.text, what)


def settled(srv, fake, client, errors, known=()) -> None:
    """Nothing left running, no internal error logged, and a valid request still answered."""
    assert wait_until(lambda: srv.http.front.active_count() == 0, 30.0), \
        f"{srv.http.front.active_count()} requests still running in the front"
    assert wait_until(lambda: fake.stats()["residents"] + fake.stats()["queued"] == 0, 30.0), \
        f"the engine still holds requests: {fake.stats()}"
    fake.check_integrity()
    logged = errors.take(known)
    assert not logged, f"{len(logged)} internal errors logged; the first:\n{logged[0]}"
    r = client.post("/v1/chat/completions", headers=AUTH,
                    json={"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": "still there?"}]})
    assert r.status_code == 200, r.text[:300]
    assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")


def post_json(client, path: str, body):
    data = json.dumps(body).encode()  # NaN and Infinity as Python writes them, which the server's parser reads
    r = client.post(path, content=data, headers={"content-type": "application/json", **AUTH})
    check_answer(r, "POST", path, body)
    return r


# --- strategies -------------------------------------------------------------------------------
# A body is a valid request of its endpoint with 0 to 3 mutations: a field set to a value at or
# past its limits, any JSON value put anywhere in the tree, a key dropped or added. Some
# examples keep their valid body, so generation, streaming and the Responses store are fuzzed
# as well as the checks (`reached` makes sure of it).
ODD_TEXT = st.sampled_from(["", " ", "fake:tiny", "user", "assistant", "auto", "none", "text", "function",
                            "\x00", "a\ud800b", "\udfff", "\U0001F600" * 3, "<tool_call>", "</think>",
                            "<|im_start|>", "{not json", "null", "x" * 300, "\u202e\u200b", "🙂" * 50])
TEXT = st.one_of(st.text(max_size=24), ODD_TEXT)
SAFE_TEXT = st.text(max_size=16)  # no lone surrogates: a valid body's text
SAFE_WORDS = st.text(min_size=1, max_size=16)
NAME = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=10)
NUMBER = st.one_of(st.integers(), st.integers(-3, 30),
                   st.sampled_from([2 ** 31, 2 ** 63 - 1, 2 ** 63, 2 ** 64, -2 ** 63, 10 ** 40, -1, 0]),
                   st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.5, -0.0, 1e308, 1e-320]))
LEAF = st.one_of(st.none(), st.booleans(), NUMBER, TEXT)
ANY = st.recursive(LEAF, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
                   max_leaves=10)
SMALL = st.integers(1, 6)  # max_tokens of a valid body: a valid request ends within a few steps

SAMPLING = {
    "temperature": st.floats(0, 2), "top_p": st.floats(0.05, 1), "seed": st.integers(0, 2 ** 63 - 1),
    "stop": st.one_of(SAFE_WORDS, st.lists(SAFE_WORDS, max_size=3)),
    "presence_penalty": st.floats(-2, 2), "frequency_penalty": st.floats(-2, 2), "n": st.just(1),
    "stream": st.booleans(), "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans()}),
    "user": SAFE_TEXT, "top_k": st.integers(0, 50), "min_p": st.floats(0, 1),
    "repetition_penalty": st.floats(0.5, 2), "ignore_eos": st.booleans(), "session": SAFE_TEXT,
}
PARAMETERS = st.fixed_dictionaries({"type": st.just("object"),
                                    "properties": st.dictionaries(NAME, st.just({"type": "string"}), max_size=2)})
CHAT_TOOL = st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
    {"name": NAME}, optional={"description": SAFE_TEXT, "parameters": PARAMETERS})})
ARGUMENTS = st.one_of(st.just('{"city": "Paris"}'), st.dictionaries(
    NAME, st.one_of(SAFE_TEXT, st.integers(), st.booleans()), max_size=2).map(json.dumps))
TEXT_PART = st.fixed_dictionaries({"type": st.sampled_from(["text", "input_text"]), "text": SAFE_TEXT})
CONTENT = st.one_of(SAFE_TEXT, SAFE_TEXT, st.lists(TEXT_PART, min_size=1, max_size=2))


@st.composite
def conversation(draw) -> list[dict]:
    """A system prompt or not, then user turns, each answered by text or by tool calls and
    their results, ending on a user message."""
    messages = []
    if draw(st.booleans()):
        messages.append({"role": draw(st.sampled_from(["system", "developer"])), "content": draw(CONTENT)})
    for turn in range(draw(st.integers(0, 2))):
        messages.append({"role": "user", "content": draw(CONTENT)})
        reply = {"role": "assistant", "content": draw(st.one_of(st.none(), CONTENT))}
        if draw(st.booleans()):
            reply["reasoning_content"] = draw(SAFE_TEXT)
        calls = [{"id": f"call_{turn}_{i}", "type": "function",
                  "function": {"name": draw(NAME), "arguments": draw(ARGUMENTS)}}
                 for i in range(draw(st.integers(0 if reply["content"] is not None else 1, 2)))]
        if calls:
            reply["tool_calls"] = calls
        messages.append(reply)
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": draw(SAFE_TEXT)} for c in calls]
    messages.append({"role": "user", "content": draw(CONTENT)})
    return messages


@st.composite
def chat_body(draw) -> dict:
    messages = draw(conversation())
    body = {"model": MODEL, "messages": messages,
            draw(st.sampled_from(["max_tokens", "max_completion_tokens"])): draw(SMALL)}
    body.update(draw(st.fixed_dictionaries({}, optional={
        **SAMPLING, "tools": st.lists(CHAT_TOOL, max_size=2), "tool_choice": st.sampled_from(["auto", "none"]),
        "parallel_tool_calls": st.booleans(), "logprobs": st.booleans(), "top_logprobs": st.integers(0, 5),
        "response_format": st.just({"type": "text"})})))
    if body.get("top_logprobs") and not body.get("logprobs"):
        body["logprobs"] = True
    for key in ("cache_markers", "anchors"):
        if draw(st.booleans()):
            body[key] = draw(st.lists(st.builds(lambda i: {"message": i}, st.integers(0, len(messages) - 1)),
                                      min_size=1, max_size=2))
    return body


TOKEN_IDS = st.lists(st.integers(0, 1023), min_size=1, max_size=12)


@st.composite
def completion_body(draw) -> dict:
    prompt = draw(st.one_of(SAFE_WORDS, TOKEN_IDS, SAFE_WORDS.map(lambda s: [s]), TOKEN_IDS.map(lambda ids: [ids])))
    body = {"model": MODEL, "prompt": prompt, "max_tokens": draw(SMALL)}
    body.update(draw(st.fixed_dictionaries({}, optional={
        **SAMPLING, "logprobs": st.integers(0, 5), "echo": st.just(False), "best_of": st.just(1),
        "suffix": st.just("")})))
    ids = prompt[0] if prompt and isinstance(prompt[0], list) else prompt
    if isinstance(ids, list) and ids and isinstance(ids[0], int) and draw(st.booleans()):  # save points inside it
        frontier = st.integers(1, len(ids))
        body.update(draw(st.fixed_dictionaries({}, optional={
            "recovery_point": frontier, "anchors": st.lists(frontier, max_size=2),
            "markers": st.lists(frontier, max_size=2)})))
    return body


PREV = "$previous"  # replaced by the id of a response this example stores first
RESPONSE_TOOL = st.fixed_dictionaries({"type": st.just("function"), "name": NAME},
                                      optional={"description": SAFE_TEXT, "parameters": PARAMETERS})


@st.composite
def response_items(draw) -> list[dict]:
    items = []
    for k in range(draw(st.integers(0, 2))):
        items.append({"type": "message", "role": draw(st.sampled_from(["user", "system", "developer"])),
                      "content": draw(CONTENT)})
        if draw(st.booleans()):
            items.append({"type": "reasoning", "summary": [{"type": "summary_text", "text": draw(SAFE_TEXT)}]})
        if draw(st.booleans()):
            items += [{"type": "function_call", "call_id": f"fc_{k}", "name": draw(NAME),
                       "arguments": draw(ARGUMENTS)},
                      {"type": "function_call_output", "call_id": f"fc_{k}", "output": draw(SAFE_TEXT)}]
        else:
            items.append({"role": "assistant", "content": draw(SAFE_TEXT)})
    items.append({"role": "user", "content": draw(CONTENT)})
    return items


RESPONSES_BODY = st.fixed_dictionaries(
    {"model": st.just(MODEL), "input": st.one_of(SAFE_WORDS, response_items()), "max_output_tokens": SMALL},
    optional={"instructions": SAFE_TEXT, "previous_response_id": st.just(PREV), "store": st.booleans(),
              "tools": st.lists(RESPONSE_TOOL, max_size=2), "tool_choice": st.sampled_from(["auto", "none"]),
              "temperature": SAMPLING["temperature"], "top_p": SAMPLING["top_p"], "stream": st.just(False),
              "text": st.just({"format": {"type": "text"}}), "seed": SAMPLING["seed"], "top_k": SAMPLING["top_k"],
              "session": SAMPLING["session"], "cache_markers": st.just([{"message": 0}])})

# Values at or just past a field's limits, and of the wrong type, for the fields the server reads.
EDGES = {
    "model": ["", "gpt-4o", "fake:TINY", " fake:tiny", None, 7, ["fake:tiny"]],
    "max_tokens": [0, -1, 1024, 1025, 2 ** 63, 2 ** 64, 1.5, 2.0, "3", True, None],
    "max_completion_tokens": [0, 5, 7, -1, 2 ** 70, 1.0, "x"],
    "max_output_tokens": [0, -1, 1025, 2 ** 63, 1.5, "2", False],
    "temperature": [-0.1, 100, 100.1, float("nan"), float("inf"), -float("inf"), "1", [], 1e308],
    "top_p": [0, -0.0, 1.0000001, float("nan"), 2, "0.5"],
    "top_k": [-1, 2 ** 63, 1.5, True], "min_p": [-0.1, 1.1, float("nan")],
    "seed": [-1, 2 ** 63 - 1, 2 ** 63, 2 ** 64, 1.5, "1", True],
    "repetition_penalty": [0, 10, 10.5, -1, float("inf")],
    "presence_penalty": [-2.01, 2.01, float("nan")], "frequency_penalty": [2, -2, 3],
    "stop": ["", [""], ["a"] * 16, ["a"] * 17, [1], [None], {"a": 1}, "\ud800"],
    "n": [0, 2, -1, 1.0, None], "best_of": [0, 2, None], "echo": [True, "yes"], "suffix": ["x", 1],
    "logit_bias": [{"1": 1.0}, {}, {"a": "b"}, []],
    "logprobs": [True, False, -1, 0, 20, 21, 2 ** 40, 1.5, "2"], "top_logprobs": [-1, 0, 20, 21, True, 1.5],
    "stream": [True, "true", 1, 2, None], "stream_options": [{"include_usage": True}, {"include_usage": "x"}, [], None],
    "tool_choice": ["required", "auto", "none", "other", {"type": "function", "function": {"name": "f"}}, {}, 1,
                    {"type": "any"}, {"type": "tool", "name": "f"}, {"type": "tool", "name": "g"},
                    {"type": "any", "disable_parallel_tool_use": True}, {"type": "tool"}],
    "tools": [[], [{}], [{"type": "function"}], [{"type": "function", "function": {"name": ""}}],
              [{"type": "web_search"}], [{"type": "function", "function": {"name": "f"}}] * 129, {"a": 1}],
    "response_format": [{"type": "json_object"}, {"type": "json_schema", "json_schema": {}}, {}, {"type": None},
                        {"type": ["text"]}, "text"],
    "text": [{"format": "json"}, {"format": {"type": "json_schema"}}, {"format": {}}, {"format": None}, {},
             {"format": {"type": {"a": 1}}}, []],
    "cache_markers": [[{"message": -1}], [{"message": 99}], [{"message": 0}] * 5, [{"tool": 0}], [{"tools": True}],
                      [{"message": 0, "part": 3}], [{}], [{"message": True}], [{"message": 1.0}], [1], "x"],
    "anchors": [[{"message": -1}], [{"message": 99}], [-1], [0], [10 ** 6], [{}], "x"],
    "markers": [[-1], [0], [10 ** 6], [1.5], [None]], "recovery_point": [-1, 0, 10 ** 6, 1.5, True],
    "previous_response_id": ["", "resp-unknown", 5, None, "x" * 5000],
    "store": [False, "no", None], "instructions": [None, "", 5, ["a"]], "session": ["", 5, "x" * 10000],
    "input": ["", [], [{}], [1], [{"type": "image"}], [{"role": "tool", "content": "x"}], {"role": "user"},
              [{"type": "function_call", "name": "f"}], [{"type": "function_call_output", "output": 5}]],
    "prompt": ["", [], [[]], [-1], [1024], [2 ** 63], [1.5], [True], ["a", "b"], [[1], [2]], [[1, "a"]],
               ["x" * 257], [1] * 1025, "x" * 5000],
    "messages": [[], [{}], [{"role": "robot", "content": "hi"}], [{"role": "tool", "content": "orphan"}],
                 [{"role": "user"}], [{"role": "user", "content": None}], [{"role": "assistant"}],
                 [{"role": "user", "content": [{"type": "image_url",
                                                "image_url": {"url": "data:image/png;base64,AA=="}}]}],
                 [{"role": "user", "content": [{"type": "audio"}]}], [{"role": "user", "content": [{"type": "text"}]}],
                 [{"role": "user", "content": [{"type": "text", "text": "x",
                                                "cache_control": {"type": "ephemeral"}}] * 5}],
                 [{"role": "user", "content": "x"}] * 1025, [{"role": "user", "content": "x " * 3000}],
                 [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{no"}}]}],
                 [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}],
                 "hi", {"role": "user", "content": "hi"}],
    # Anthropic's Messages fields (its tool_choice, tools and messages forms are in the lists above too)
    "system": [None, "", [], [{"type": "image"}], 5, [{"type": "text"}], [{"type": "text", "text": "x",
                                                                           "cache_control": {"type": "forever"}}]],
    "thinking": [{"type": "enabled"}, {"type": "enabled", "budget_tokens": 1024}, {"type": "x"}, "on", None,
                 {"type": "enabled", "budget_tokens": 2 ** 70}, {"type": "adaptive", "display": "loud"}],
    "stop_sequences": [[], [""], "stop", None, [1], ["a"] * 50],
    "cache_control": [{"type": "persistent"}, {}, "x", None, {"type": "ephemeral", "ttl": "1h"}],
    "output_config": [{"effort": "low"}, {"format": {"type": "json_schema", "schema": {"type": "object"}}},
                      {"format": "x"}, 3, {"format": {"type": "json_schema", "schema": {"type": "nope"}}}],
    "metadata": [{}, None, "x"],
}


def often(usual, other, percent: int = 75):
    """`usual` in about `percent` of the draws, else `other` (hypothesis' one_of favours no branch)."""
    return st.integers(0, 99).flatmap(lambda i: usual if i < percent else other)


def _nodes(value, path=()):
    yield path, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _nodes(v, path + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _nodes(v, path + (i,))


@st.composite
def mutated(draw, valid, fields):
    """`valid`'s body with 0 to 3 mutations (none in about a third of the examples). An edge
    value goes to one of the endpoint's `fields` mostly, now and then to another's (ignored)."""
    body = copy.deepcopy(draw(valid))
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2, 3]))):
        op = draw(st.sampled_from(["edge", "edge", "replace", "delete", "insert"]))
        if op == "edge":
            key = draw(often(st.sampled_from(fields), st.sampled_from(sorted(EDGES)), 90))
            body[key] = copy.deepcopy(draw(st.sampled_from(EDGES[key])))
            continue
        nodes = [(p, n) for p, n in _nodes(body) if p]
        if not nodes:  # every field deleted
            break
        path, node = draw(st.sampled_from(nodes))
        parent = body
        for step in path[:-1]:
            parent = parent[step]
        if op == "replace":
            parent[path[-1]] = draw(ANY)
        elif op == "delete":
            del parent[path[-1]]
        elif isinstance(node, dict):
            node[draw(TEXT)] = draw(ANY)
        elif isinstance(node, list):
            node.insert(draw(st.integers(0, len(node))), draw(ANY))
        else:
            body[draw(TEXT)] = draw(ANY)
    return body


SAMPLING_FIELDS = ("model", "temperature", "top_p", "top_k", "min_p", "seed", "repetition_penalty",
                   "presence_penalty", "frequency_penalty", "stop", "n", "logit_bias", "stream", "stream_options",
                   "session")
CHAT = mutated(chat_body(), SAMPLING_FIELDS + (
    "messages", "max_tokens", "max_completion_tokens", "logprobs", "top_logprobs", "tools", "tool_choice",
    "response_format", "cache_markers", "anchors"))
COMPLETION = mutated(completion_body(), SAMPLING_FIELDS + (
    "prompt", "max_tokens", "logprobs", "echo", "best_of", "suffix", "recovery_point", "anchors", "markers"))
RESPONSES = mutated(RESPONSES_BODY, (
    "model", "input", "instructions", "previous_response_id", "store", "tools", "tool_choice", "max_output_tokens",
    "temperature", "top_p", "stream", "text", "seed", "top_k", "cache_markers", "session"))


BLOCK = st.one_of(st.builds(lambda t: {"type": "text", "text": t}, SAFE_WORDS),
                  st.builds(lambda t: {"type": "text", "text": t, "cache_control": {"type": "ephemeral"}}, SAFE_WORDS))


@st.composite
def messages_body(draw) -> dict:
    """A valid Anthropic Messages body: user and assistant turns (text, a tool call and its
    result), optional system blocks, tools and the Messages fields."""
    turns = [{"role": "user", "content": draw(st.one_of(SAFE_WORDS, st.lists(BLOCK, min_size=1, max_size=2)))}]
    if draw(st.booleans()):
        turns += [{"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "f",
                                                     "input": {"a": draw(SAFE_WORDS)}}]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                                "content": draw(SAFE_WORDS)}]}]
    body = {"model": MODEL, "max_tokens": draw(SMALL), "messages": turns}
    body.update(draw(st.fixed_dictionaries({}, optional={
        "system": st.one_of(SAFE_WORDS, st.lists(BLOCK, min_size=1, max_size=2)),
        "tools": st.just([{"name": "f", "input_schema": {"type": "object", "properties": {"a": {"type": "string"}}}}]),
        "tool_choice": st.sampled_from([{"type": "auto"}, {"type": "none"}]),
        "thinking": st.sampled_from([{"type": "disabled"}, {"type": "adaptive"}]),
        "stop_sequences": st.lists(SAFE_WORDS, max_size=2), "temperature": st.floats(0, 1),
        "top_k": st.integers(0, 50), "stream": st.booleans(), "cache_control": st.just({"type": "ephemeral"}),
        "metadata": st.just({"user_id": "u1"})})))
    return body


MESSAGES = mutated(messages_body(), ("model", "max_tokens", "messages", "system", "tools", "tool_choice", "thinking",
                                     "stop_sequences", "temperature", "top_p", "top_k", "stream", "cache_control",
                                     "output_config", "metadata"))


# --- the body tests ---------------------------------------------------------------------------
def reached(*statuses) -> None:
    """The test's examples got each of these answers: generation as well as the refusals."""
    assert all(SEEN[s] for s in statuses), f"answers seen: {dict(SEEN)}"


def test_chat_bodies(served):
    srv, fake, client, _ = served

    @_settings(BODY_EXAMPLES)
    @given(req=CHAT)
    def fuzz(req):
        post_json(client, "/v1/chat/completions", req)

    SEEN.clear()
    fuzz()
    reached(200, 400)
    settled(*served)


def test_completion_bodies(served):
    srv, fake, client, _ = served

    @_settings(BODY_EXAMPLES)
    @given(req=COMPLETION)
    def fuzz(req):
        post_json(client, "/v1/completions", req)

    SEEN.clear()
    fuzz()
    reached(200, 400)
    settled(*served)


def test_responses_bodies(served):
    srv, fake, client, _ = served

    @_settings(BODY_EXAMPLES)
    @given(req=RESPONSES)
    def fuzz(req):
        if req.get("previous_response_id") == PREV:  # a chain onto a response stored just before
            first = post_json(client, "/v1/responses", {"model": MODEL, "input": "Hi", "max_output_tokens": 2})
            assert first.status_code == 200, first.text[:300]
            req["previous_response_id"] = first.json()["id"]
        post_json(client, "/v1/responses", req)

    SEEN.clear()
    fuzz()
    reached(200, 400)
    settled(*served)


def test_anthropic_messages_bodies(served):
    """Anthropic's /v1/messages and /v1/messages/count_tokens (issue 37): no 5xx, its own error
    shape on every refusal, streams of well-formed events."""
    srv, fake, client, _ = served

    @_settings(BODY_EXAMPLES)
    @given(req=MESSAGES, count=st.booleans())
    def fuzz(req, count):
        if count and isinstance(req, dict):
            req = {k: v for k, v in req.items() if k not in ("max_tokens", "stream")}
        post_json(client, "/v1/messages/count_tokens" if count else "/v1/messages", req)

    SEEN.clear()
    fuzz()
    reached(200, 400)
    settled(*served)


# --- raw bodies and headers -------------------------------------------------------------------
VALID = {"/v1/chat/completions": {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
         "/v1/completions": {"model": MODEL, "max_tokens": 2, "prompt": "hi"},
         "/v1/responses": {"model": MODEL, "max_output_tokens": 2, "input": "hi"}}


@st.composite
def raw_body(draw, path):
    good = json.dumps(VALID[path]).encode()
    kind = draw(st.integers(0, 7))
    if kind == 0:
        return draw(st.binary(max_size=64))
    if kind == 1:  # cut short
        return good[:draw(st.integers(0, len(good) - 1))]
    if kind == 2:  # a byte replaced (bad UTF-8 inside a string, a broken token)
        i = draw(st.integers(0, len(good) - 1))
        bad = draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00", b"\\", b'"']))
        return good[:i] + bad + good[i + 1:]
    if kind == 3:  # JSON that is not an object
        return json.dumps(draw(ANY)).encode()
    if kind == 4:  # other encodings of the good body (json.loads reads UTF-16 and a BOM)
        return draw(st.sampled_from([b"\xef\xbb\xbf" + good, good.decode().encode("utf-16"),
                                     good.decode().encode("utf-32"), b" \n\t" + good + b"\n"]))
    if kind == 5:  # trailing junk, or two bodies
        return good + draw(st.sampled_from([b"x", b"{}", good, b"\x00"]))
    if kind == 6:
        return good
    return b""


HEADER_NAME = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-ABCXYZ0123456789_", min_size=1, max_size=12).filter(
    lambda n: n.lower() not in ("host", "content-length", "transfer-encoding", "connection", "expect", "upgrade", "te"))
HEADER_VALUE = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0xFF, exclude_characters="\x7f"),
                       max_size=24).map(lambda s: s.encode("latin-1"))
JSON_TYPE = st.sampled_from(["application/json", "application/json; charset=utf-8", "APPLICATION/JSON",
                             "application/vnd.api+json", "application/json; charset=latin-1", "application/json;;;"])
CONTENT_TYPE = often(JSON_TYPE, st.one_of(st.none(), st.sampled_from([
    "text/plain", "multipart/form-data; boundary=xyz", "application/x-www-form-urlencoded", "", ";", "*/*",
    "application/jsonx", "json"]), HEADER_VALUE.map(lambda b: b.decode("latin-1"))))
AUTH_VALUE = often(st.just(f"Bearer {TOKEN}"),  # mostly right, so the body is read
                   st.one_of(st.none(), st.sampled_from(["Bearer", f"bearer {TOKEN}", f"Bearer  {TOKEN}",
                                                         f"Basic {TOKEN}", "Bearer \xe9t\xe9", "Bearer " + "x" * 4000,
                                                         "Bearer\t" + TOKEN]),
                             HEADER_VALUE.map(lambda b: b.decode("latin-1"))))


def test_raw_bodies_and_headers(served):
    srv, fake, client, _ = served

    @_settings(RAW_EXAMPLES)
    @given(data=st.data(), path=st.sampled_from(GENERATE), content_type=CONTENT_TYPE, auth=AUTH_VALUE,
           extra=st.lists(st.tuples(HEADER_NAME, HEADER_VALUE), max_size=3),
           accept=st.one_of(st.none(), st.sampled_from(["text/event-stream", "application/xml", "*/*", "\xff"])),
           chunked=st.booleans())
    def fuzz(data, path, content_type, auth, extra, accept, chunked):
        raw = data.draw(raw_body(path))
        headers = [(n.encode(), v) for n, v in extra]
        for name, value in (("content-type", content_type), ("authorization", auth), ("accept", accept)):
            if value is not None:
                headers.append((name.encode(), value.encode("latin-1")))
        content = iter([raw[:len(raw) // 2], raw[len(raw) // 2:]]) if chunked else raw  # chunked transfer encoding
        r = client.post(path, content=content, headers=headers)
        check_answer(r, "POST", path, (raw[:200], headers))

    SEEN.clear()
    fuzz()
    reached(200, 400, 401, 415)
    settled(*served)


# --- methods and paths ------------------------------------------------------------------------
SEGMENT = st.one_of(st.sampled_from(["v1", "chat", "completions", "responses", "models", "health", "metrics", "",
                                     ".", "..", "%00", "%ff", "%2F", "%2e%2e", "V1", "\u00e9", "\U0001F600", ";x"]),
                    st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.~", max_size=8))
KNOWN = st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/models", "/health",
                         "/metrics", "/v1/models/", "/v1", "/", "/v1/responses/abc", "/v1/chat/completions/",
                         "/v1/models/fake:tiny", "/v1/models/x/y", "/tokenize", "/detokenize", "/v1/messages",
                         "/v1/messages/count_tokens"])
PATH = often(KNOWN, st.lists(SEGMENT, min_size=1, max_size=4).map(lambda s: "/" + "/".join(s)), percent=60)


def test_methods_and_paths(served):
    srv, fake, client, _ = served

    @_settings(PATH_EXAMPLES)
    @given(method=st.sampled_from(["GET", "GET", "POST", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]),
           path=PATH,
           query=st.sampled_from(["", "?", "?a=1", "?model=x&stream=true", "?%ff=%00"]),
           with_body=st.booleans(), authorized=st.booleans())
    @example(method="GET", path="/health", query="", with_body=False, authorized=False)
    @example(method="GET", path="/v1/models", query="?a=1", with_body=False, authorized=True)
    @example(method="GET", path="/metrics", query="", with_body=False, authorized=True)
    @example(method="HEAD", path="/health", query="", with_body=False, authorized=True)
    def fuzz(method, path, query, with_body, authorized):
        content = json.dumps(VALID["/v1/chat/completions"]).encode() if with_body and method != "GET" else None
        headers = {"content-type": "application/json", **(AUTH if authorized else {})}
        try:
            request = client.build_request(method, path + query, content=content, headers=headers)
        except httpx2.InvalidURL:
            return  # the client will not send it
        r = client.send(request)
        check_answer(r, method, path, (method, path + query))
        if path == "/health" and method == "GET":
            assert r.status_code == 200, r.text[:200]

    SEEN.clear()
    fuzz()
    reached(200, 401, 404, 405)
    settled(*served)


# --- clients that leave -----------------------------------------------------------------------
def _request_bytes(port: int, path: str, body: bytes) -> tuple[bytes, bytes]:
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {TOKEN}\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    return head, body


def _status_of(received: bytes) -> int | None:
    if not received.startswith(b"HTTP/1.1 "):
        return None
    return int(received[9:12])


def leave(port: int, plan: dict) -> None:
    """One request whose client goes away as `plan` says; any status it saw must not be a 5xx."""
    path, stream, how, delay, k = plan["path"], plan["stream"], plan["how"], plan["delay"], plan["k"]
    req = dict(VALID[path], **({"max_tokens": plan["max_tokens"]} if path != "/v1/responses" else
                               {"max_output_tokens": plan["max_tokens"]}))
    if stream:
        req.update(stream=True, **({"stream_options": {"include_usage": True}} if path != "/v1/responses" else {}))
    body = json.dumps(req).encode()
    if how == "timeout":  # the client's read timeout ends the call
        timeout = httpx2.Timeout(10.0, read=max(delay, 0.001))  # 0 would be a non-blocking read
        with httpx2.Client(base_url=f"http://127.0.0.1:{port}", timeout=timeout) as c:
            try:
                r = c.post(path, content=body, headers={"content-type": "application/json", **AUTH})
            except httpx2.TimeoutException:
                return
            check_answer(r, "POST", path, plan)
        return
    if how == "events":  # the answer (a stream, or not) read for k lines, then closed
        with httpx2.Client(base_url=f"http://127.0.0.1:{port}", timeout=10.0) as c:
            with c.stream("POST", path, content=body, headers={"content-type": "application/json", **AUTH}) as r:
                assert r.status_code < 500, (plan, r.status_code)
                for i, _ in enumerate(r.iter_lines()):
                    if i >= k:
                        break
        return
    head, payload = _request_bytes(port, path, body)
    sock = socket.create_connection(("127.0.0.1", port), timeout=5.0)
    try:
        if how == "cut_body":  # gone while sending the body: the server never has a whole request
            sock.sendall(head + payload[:k * len(payload) // 8])
            time.sleep(delay)
        elif how in ("close", "reset", "half_close"):  # the whole request, then gone after `delay`
            sock.sendall(head + payload)
            if how == "half_close":
                sock.shutdown(socket.SHUT_WR)
            time.sleep(delay)
            sock.settimeout(0.0)
            try:
                received = sock.recv(65536)
            except (BlockingIOError, ConnectionError):
                received = b""
            status = _status_of(received)
            assert status is None or status < 500, (plan, received[:300])
        if how == "reset":  # an RST, not a FIN
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    finally:
        sock.close()


PLAN = st.fixed_dictionaries({
    "path": st.sampled_from(GENERATE), "stream": st.booleans(),
    "how": st.sampled_from(["timeout", "events", "cut_body", "close", "reset", "half_close"]),
    "delay": st.floats(0.0, 0.15), "k": st.integers(0, 7), "max_tokens": st.integers(1, 40)})


def test_clients_that_leave(served):
    """Up to four requests at once, so some leave while queued behind the others (two run at a
    time), some while generating, some after the answer."""
    srv, fake, client, _ = served
    port = srv.http.port

    @_settings(LEAVE_EXAMPLES)
    @given(plans=st.lists(PLAN, min_size=1, max_size=4))
    def fuzz(plans):
        failures: list[BaseException] = []

        def run(plan):
            try:
                leave(port, plan)
            except BaseException as exc:  # noqa: BLE001 - raised again on the test's thread
                failures.append(exc)

        threads = [threading.Thread(target=run, args=(p,)) for p in plans]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30.0)
        if failures:
            raise failures[0]

    fuzz()
    # A client gone while sending its body is logged as an internal error: the test below.
    settled(*served, known=(ClientDisconnect,))


def test_a_client_gone_while_sending_its_body_is_no_internal_error(served):
    """It used to be a 500 to nobody, logged with its traceback (server/http_app.py body() now
    answers a client disconnect)."""
    srv, fake, client, errors = served
    errors.take()
    head, payload = _request_bytes(srv.http.port, "/v1/chat/completions",
                                   json.dumps(VALID["/v1/chat/completions"]).encode())
    with socket.create_connection(("127.0.0.1", srv.http.port), timeout=5.0) as sock:
        sock.sendall(head + payload[:10])
        time.sleep(0.05)
    wait_until(lambda: errors.records, 2.0)
    errors.quiet()
    settled(*served)


# --- bugs the fuzzer found (minimal examples) --------------------------------------------------
# Each answered 500 (the seeded fuzz above does not draw them); fixed, each is a regression test.
# The answer wanted is a 400 (NaN: the body is not strict JSON, refused by the parser).
def bug(path, body, why, name, wanted=(400,)):
    return pytest.param(path, body, wanted, id=name)


CALL = {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}
NESTED = "[" * 1000 + "]" * 1000  # JSON inside a string: the body's depth limit does not see it
BUGS = [
    bug("/v1/chat/completions",
        {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "x"},
                                                       {"role": "assistant", "tool_calls": [CALL]},
                                                       {"role": "tool", "tool_call_id": [], "content": "r"}]},
        "a tool_call_id that is a list or an object is a 500 (TypeError: unhashable, in "
        "ninfer_jax/frontend/messages.py normalize_messages)", "unhashable-tool-call-id"),
    bug("/v1/responses",
        {"model": MODEL, "max_output_tokens": 2,
         "input": [{"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"},
                   {"type": "function_call_output", "call_id": {}, "output": "r"}]},
        "a function_call_output call_id that is an object is a 500 (the same TypeError, through "
        "items_to_messages)", "unhashable-call-id"),
    bug("/v1/chat/completions",
        {"model": MODEL, "max_tokens": 2,
         "messages": [{"role": "assistant", "tool_calls": [dict(CALL, function={"name": "f", "arguments": NESTED})]},
                      {"role": "user", "content": "x"}]},
        "tool-call arguments nested 1000 deep are a 500 (RecursionError from json.loads in "
        "ninfer_jax/frontend/messages.py _arguments)", "deep-arguments-chat"),
    bug("/v1/responses",
        {"model": MODEL, "max_output_tokens": 2,
         "input": [{"type": "function_call", "call_id": "a", "name": "f", "arguments": NESTED},
                   {"role": "user", "content": "x"}]},
        "the same RecursionError through a Responses function_call", "deep-arguments-responses"),
    bug("/v1/responses",
        {"model": MODEL, "max_output_tokens": 2,
         "input": [{"type": "reasoning", "summary": 5}, {"role": "user", "content": "x"}]},
        "a reasoning item whose summary is not a list is a 500 (TypeError in "
        "ninfer_jax/frontend/responses.py _reasoning_text)", "reasoning-summary-not-a-list"),
    bug("/v1/responses",
        {"model": MODEL, "max_output_tokens": 2, "input": "hi",
         "tools": [{"type": "function", "name": "f", "parameters": float("nan")}]},
        "NaN or Infinity in a Responses tool (the parser takes them) is a 500 after generating: the "
        "answer echoes `tools` and JSONResponse refuses non-finite floats (ValueError)",
        "nan-in-responses-tools"),
]


@pytest.mark.parametrize("path,body,wanted", BUGS)
def test_found_by_the_fuzzer(served, path, body, wanted):
    srv, fake, client, errors = served
    with httpx2.Client(base_url=f"http://127.0.0.1:{srv.http.port}", timeout=30.0) as own:  # a 500 ends its connection
        r = own.post(path, content=json.dumps(body).encode(), headers={"content-type": "application/json", **AUTH})
    errors.quiet()
    errors.take()
    check_answer(r, "POST", path, body)
    assert r.status_code in wanted, (r.status_code, r.text[:300])
