"""Bodies no request should hold get the API's 4xx error object, never a 500 (issue 36): JSON
nested past the depth limit (and past the parser's own), a lone UTF-16 surrogate in a string, a
body that is not application/json; unknown paths and wrong methods answer 404 / 405 in the same
`{"error": {"message", "type", "param", "code"}}` shape. Nothing reaches the engine."""
from __future__ import annotations

import json

import httpx2
import pytest

from fakes import FakeEngine
from server.app import InferenceServer

MODEL = "fake:tiny"


@pytest.fixture(scope="module")
def base():
    fake = FakeEngine(max_concurrency=2, max_context=256, model=MODEL)
    srv = InferenceServer(lambda: fake, port=None, http_port=0, grace_s=1.0, progress=lambda m: None)
    srv.start()
    srv.warm_up()
    yield f"http://127.0.0.1:{srv.http.port}", fake
    srv.shutdown(grace_s=1.0)
    fake.close()


def _post(url, body: bytes, kind="application/json"):
    return httpx2.post(url, content=body, headers={"content-type": kind})


def _chat(messages) -> dict:
    return {"model": MODEL, "max_tokens": 2, "messages": messages}


def _error(r, status, code):
    assert r.status_code == status, (r.status_code, r.text[:200])
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == code, err
    return err


@pytest.mark.parametrize("depth", [70, 5000])
def test_deep_nesting_is_a_400(base, depth):
    url, fake = base
    before = fake.stats().get("requests_submitted", 0)
    nested = "[" * depth + "]" * depth
    body = json.dumps(_chat([{"role": "user", "content": "hi"}]))[:-1] + f', "stop": {nested}}}'
    err = _error(_post(f"{url}/v1/chat/completions", body.encode()), 400, "invalid_json")
    assert "nests deeper" in err["message"]
    assert fake.stats().get("requests_submitted", 0) == before


def test_a_lone_surrogate_is_a_400(base):
    url, _ = base
    body = json.dumps(_chat([{"role": "user", "content": "a\ud800b"}]))  # json.dumps escapes it: \\ud800
    assert "\\ud800" in body
    _error(_post(f"{url}/v1/chat/completions", body.encode()), 400, "invalid_json")
    body = json.dumps({"model": MODEL, "input": "x\udfff", "max_output_tokens": 2})
    _error(_post(f"{url}/v1/responses", body.encode()), 400, "invalid_json")


def test_a_body_that_is_not_json_by_its_type_is_a_415(base):
    url, _ = base
    body = json.dumps(_chat([{"role": "user", "content": "hi"}])).encode()
    _error(_post(f"{url}/v1/chat/completions", body, "text/plain"), 415, "unsupported_media_type")
    ok = _post(f"{url}/v1/chat/completions", body, "application/json; charset=utf-8")
    assert ok.status_code == 200, ok.text[:200]


def test_unknown_paths_and_methods_answer_in_the_error_shape(base):
    url, _ = base
    _error(httpx2.get(f"{url}/v1/nothing-here"), 404, "not_found")
    _error(httpx2.get(f"{url}/v1/chat/completions"), 405, "method_not_allowed")


@pytest.mark.parametrize("extra,param", [({"text": {"format": "json"}}, "text.format"),
                                         ({"previous_response_id": ""}, "previous_response_id")])
def test_responses_fields_of_the_wrong_form_are_400_before_generating(base, extra, param):
    url, fake = base
    before = fake.stats().get("requests_submitted", 0)
    body = json.dumps({"model": MODEL, "input": "hi", "max_output_tokens": 2, **extra}).encode()
    err = _error(_post(f"{url}/v1/responses", body), 400, None)
    assert err["param"] == param, err
    assert fake.stats().get("requests_submitted", 0) == before


def test_a_message_over_the_parts_limit_is_a_400_as_over_grpc(base):
    url, fake = base
    before = fake.stats().get("requests_submitted", 0)
    parts = [{"type": "text", "text": "x"}] * 257  # ServerLimits.max_parts is 256
    err = _error(_post(f"{url}/v1/chat/completions", json.dumps(_chat([{"role": "user", "content": parts}])).encode()),
                 400, None)
    assert "messages[0].content: 257 exceed the server limit of 256" in err["message"]
    assert fake.stats().get("requests_submitted", 0) == before
