"""The HTTP server's operations features (issue 37): served model names, the checkpoint's
generation_config.json sampling defaults (every HTTP route and gRPC), the access log, the request
log (with the recovery point of each hit and the pauses), CORS, and one request id everywhere.
Fake engines where no model is needed; the cost-model Program (SimProgram: no model math) where
the engine's own record of a hit or a pause is."""
from __future__ import annotations

import json
import logging
import shutil

import grpc
import httpx2
import pytest

from ninfer_jax import Engine, EngineConfig, SamplingParams
from ninfer_jax.engine.intake import generation_defaults
from ninfer_jax.errors import ConfigError
from ninfer_jax.sim import SimProgram
from server import anthropic_convert as ac
from server import convert
from server import openai_convert as oc
from server.app import InferenceServer
from server.http_ops import ACCESS
from server.http_settings import HttpSettings
from server.limits import ServerLimits
from server.openai_schema import ChatCompletionRequest, CompletionRequest
from server.proto import ninfer_pb2 as pb
from server.proto import ninfer_pb2_grpc as pb_grpc
from server.request_log import record
from fakes import FakeEngine, http_settled, wait_until

USER = [{"role": "user", "content": "Hello there"}]
DEFAULTS = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "repetition_penalty": 1.05}


class Recording(FakeEngine):
    """A fake engine that keeps the SamplingParams of every request it was given."""

    def __init__(self, **kw):
        self.samplings: list[SamplingParams] = []
        super().__init__(**kw)

    def submit(self, prompt, sampling=None, **kw):
        self.samplings.append(sampling)
        return super().submit(prompt, sampling, **kw)


def _serve(engine, *, grpc_port=None, token=None, **settings) -> InferenceServer:
    srv = InferenceServer(lambda: engine, port=grpc_port, http_port=0, token=token, grace_s=2.0,
                          progress=lambda m: None, close_engine=False, http_settings=HttpSettings(**settings))
    srv.start()
    srv.warm_up()
    return srv


def _base(srv) -> str:
    return f"http://127.0.0.1:{srv.http.port}"


@pytest.fixture
def access_lines():
    """The access log's lines while the test runs (the logger at INFO with a collecting handler)."""
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    handler, level = Collect(), ACCESS.level
    ACCESS.addHandler(handler)
    ACCESS.setLevel(logging.INFO)
    yield lines
    ACCESS.removeHandler(handler)
    ACCESS.setLevel(level)


def _log_lines(path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


# --- served model names ----------------------------------------------------------------------------
def test_served_model_names_are_accepted_listed_and_reported_back():
    fake = FakeEngine(max_context=256, model="fake:tiny")
    srv = _serve(fake, served_model_names=("alpha", "beta"))
    base = _base(srv)
    try:
        assert [m["id"] for m in httpx2.get(f"{base}/v1/models").json()["data"]] == ["alpha", "beta"]
        assert httpx2.get(f"{base}/v1/models/beta").json()["id"] == "beta"
        chat = httpx2.post(f"{base}/v1/chat/completions", json={"model": "beta", "messages": USER, "max_tokens": 2})
        assert chat.status_code == 200 and chat.json()["model"] == "beta"
        with httpx2.stream("POST", f"{base}/v1/completions",
                           json={"model": "alpha", "prompt": "hi", "max_tokens": 2, "stream": True}) as s:
            models = {json.loads(line[6:])["model"] for line in s.iter_lines() if line.startswith("data: {")}
        assert models == {"alpha"}
        msg = httpx2.post(f"{base}/v1/messages", json={"model": "beta", "max_tokens": 2, "messages": USER})
        assert msg.status_code == 200 and msg.json()["model"] == "beta"
        assert httpx2.post(f"{base}/tokenize", json={"model": "alpha", "prompt": "hi"}).status_code == 200
        # Only the served names: the model's own is not one of them (as vLLM's --served-model-name).
        own = httpx2.post(f"{base}/v1/chat/completions", json={"model": "fake:tiny", "messages": USER})
        assert own.status_code == 404 and own.json()["error"]["code"] == "model_not_found"
        assert "'alpha', 'beta'" in own.json()["error"]["message"]
        assert httpx2.get(f"{base}/v1/models/fake:tiny").status_code == 404
        anth = httpx2.post(f"{base}/v1/messages", json={"model": "gamma", "max_tokens": 2, "messages": USER})
        assert anth.status_code == 404 and anth.json()["type"] == "error"
        http_settled(srv)
    finally:
        srv.shutdown(grace_s=1.0)
        fake.close()


# --- generation_config.json defaults --------------------------------------------------------------
def test_defaults_fill_only_the_fields_a_request_leaves_unset():
    limits = ServerLimits()
    chat = ChatCompletionRequest.model_validate({"model": "m", "messages": USER, "temperature": 0})
    _, sampling, _ = oc.chat_request(chat, limits, 512, DEFAULTS)
    assert (sampling.temperature, sampling.top_p, sampling.top_k, sampling.repetition_penalty) == (0, 0.95, 20, 1.05)
    text = CompletionRequest.model_validate({"model": "m", "prompt": "hi", "top_k": 3})
    _, sampling, _ = oc.completion_request(text, limits, 512, DEFAULTS)
    assert (sampling.temperature, sampling.top_k) == (0.6, 3)
    assert oc.completion_request(text, limits, 512)[1].temperature == SamplingParams().temperature  # none: as before
    messages = ac.MessagesRequest.model_validate({"model": "m", "max_tokens": 4, "messages": USER, "top_p": 0.5})
    sampling = ac.sampling_of(messages, ac.chat_of(messages), limits, 512, DEFAULTS)
    assert (sampling.temperature, sampling.top_p, sampling.top_k) == (0.6, 0.5, 20)
    # gRPC: every sampling field is `optional`, so a set 0 is told from an unset one
    msg = pb.SamplingParams(temperature=0.0, max_tokens=4)
    sampling = convert.sampling_from_proto(msg, limits, 512, DEFAULTS)
    assert (sampling.temperature, sampling.top_p, sampling.max_tokens) == (0.0, 0.95, 4)
    assert convert.sampling_from_proto(pb.SamplingParams(), limits, 512, DEFAULTS).temperature == 0.6
    assert convert.sampling_from_proto(pb.SamplingParams(), limits, 512) is None


def test_every_route_and_grpc_give_the_engines_defaults():
    fake = Recording(max_context=256, generation_defaults=DEFAULTS)
    srv = _serve(fake, grpc_port=0)
    base = f"{_base(srv)}/v1"
    try:
        for path, body in (("/chat/completions", {"messages": USER, "max_tokens": 2}),
                           ("/completions", {"prompt": "hi", "max_tokens": 2}),
                           ("/responses", {"input": "hi", "max_output_tokens": 2}),
                           ("/messages", {"messages": USER, "max_tokens": 2})):
            r = httpx2.post(base + path, json=dict(body, model="fake:tiny"))
            assert r.status_code == 200, (path, r.text)
        r = httpx2.post(f"{base}/chat/completions", json={"model": "fake:tiny", "messages": USER, "max_tokens": 2,
                                                          "temperature": 0, "top_k": 0})
        assert r.status_code == 200
        with grpc.insecure_channel(srv.address) as channel:
            list(pb_grpc.NInferStub(channel).Generate(
                pb.GenerateRequest(text="hi", sampling=pb.SamplingParams(max_tokens=2)), timeout=30))
        seen = [(s.temperature, s.top_p, s.top_k, s.repetition_penalty) for s in fake.samplings]
        assert seen == [(0.6, 0.95, 20, 1.05)] * 4 + [(0, 0.95, 0, 1.05), (0.6, 0.95, 20, 1.05)]
        http_settled(srv)
    finally:
        srv.shutdown(grace_s=1.0)
        fake.close()


def _folder(tmp_path, name: str, gen: dict | None) -> str:
    """The built-in model's Hugging Face folder without its weights (the cost-model Program needs
    config.json and the tokenizer), with `gen` as its generation_config.json."""
    from ninfer_jax.model import builtin

    src, folder = builtin.trained_folder(), tmp_path / name
    shutil.copytree(src, folder, ignore=shutil.ignore_patterns("*.safetensors", "__pycache__", "*.py"))
    if gen is not None:
        (folder / "generation_config.json").write_text(json.dumps(gen))
    return str(folder)


def test_a_checkpoints_generation_config_gives_the_defaults_and_a_bad_one_fails_at_load(tmp_path):
    gen = {"eos_token_id": [1010, 1008], "do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20,
           "min_p": None, "transformers_version": "4.57.0"}
    folder = _folder(tmp_path, "good", gen)
    assert generation_defaults(folder) == {"temperature": 0.7, "top_p": 0.8, "top_k": 20}
    assert generation_defaults("builtin:tiny-hybrid") == {}  # its file holds eos ids only
    cfg = EngineConfig(model=folder, max_concurrency=1, max_context=256, progress=False)
    engine = Engine(cfg, program=SimProgram(cfg), start=False)
    try:
        assert engine.generation_defaults() == {"temperature": 0.7, "top_p": 0.8, "top_k": 20}
    finally:
        engine.close()
    for bad, needle in (({"top_p": 0}, "generation_config.json: top_p: must lie in (0, 1], got 0"),
                        ({"top_k": 2.5}, "generation_config.json: top_k: must be a non-negative int"),
                        ({"temperature": True}, "generation_config.json: temperature: must be a number")):
        folder = _folder(tmp_path, f"bad{len(needle)}", bad)
        cfg = EngineConfig(model=folder, max_concurrency=1, max_context=256, progress=False)
        with pytest.raises(ConfigError, match="generation_config.json"):
            generation_defaults(folder)  # what preflight and Engine() read
        with pytest.raises(ConfigError) as info:
            Engine(cfg, program=SimProgram(cfg), start=False)  # at load, before any request
        assert needle in str(info.value)


def test_the_start_line_says_which_defaults_apply():
    said: list[str] = []
    for defaults in ({}, {"temperature": 0.6}):
        fake = FakeEngine(generation_defaults=defaults)
        srv = InferenceServer(lambda: fake, port=None, http_port=0, progress=said.append, close_engine=True)
        srv.start()
        srv.warm_up()
        srv.shutdown(grace_s=1.0)
    lines = [s for s in said if s.startswith("sampling defaults")]
    assert lines == ["sampling defaults: SamplingParams' own (no generation_config.json defaults)",
                     "sampling defaults from generation_config.json (for fields a request leaves unset): "
                     "temperature=0.6"]


# --- access log, request log, one id ------------------------------------------------------------
def test_one_request_id_in_the_answer_the_access_log_and_the_request_log(tmp_path, access_lines):
    path = tmp_path / "requests.jsonl"
    fake = FakeEngine(max_context=256, step_s=0.002)
    srv = _serve(fake, request_log=str(path))
    base = _base(srv)
    try:
        r = httpx2.post(f"{base}/v1/chat/completions", headers={"X-Request-Id": "trace-42.a"},
                        json={"model": "fake:tiny", "messages": USER, "max_tokens": 3, "n": 2})
        assert r.status_code == 200 and r.headers["x-request-id"] == "trace-42.a"
        with httpx2.stream("POST", f"{base}/v1/completions", headers={"X-Request-Id": "stream-7"},
                           json={"model": "fake:tiny", "prompt": "hi", "max_tokens": 5, "stream": True}) as s:
            chunks = [line for line in s.iter_lines() if line.startswith("data: {")]
        httpx2.post(f"{base}/v1/messages", headers={"X-Request-Id": "agent-1"},
                    json={"model": "fake:tiny", "max_tokens": 2, "messages": USER})
        httpx2.post(f"{base}/v1/responses", headers={"X-Request-Id": "resp-1"},
                    json={"model": "fake:tiny", "input": "hi", "max_output_tokens": 2})
        httpx2.get(f"{base}/health", headers={"X-Request-Id": "probe-1"})
        assert httpx2.post(f"{base}/v1/chat/completions", json={"model": "nope", "messages": USER}).status_code == 404
        assert wait_until(lambda: len(access_lines) == 6)
        http_settled(srv)
    finally:
        srv.shutdown(grace_s=1.0)
        fake.close()
    chat, stream, anth, resp, health, missing = access_lines
    u = r.json()["usage"]
    assert chat.startswith("127.0.0.1:") and ' "POST /v1/chat/completions" 200 id=trace-42.a ' in chat
    # n=2: both choices' tokens, summed (the prompt counted for each engine request)
    assert f"prompt_tokens={2 * u['prompt_tokens']} cached_tokens=" in chat
    assert f"completion_tokens={u['completion_tokens']} ttft_s=" in chat and " duration_s=" in chat
    # a stream is logged when it ends, with every token it sent
    assert ' "POST /v1/completions" 200 id=stream-7 ' in stream and "completion_tokens=5 " in stream
    assert len(chunks) == 5 + 1  # five tokens, then the finish chunk
    assert " id=agent-1 " in anth and " id=resp-1 " in resp and "completion_tokens=2 " in resp
    assert ' "GET /health" 200 id=probe-1 duration_s=' in health and "tokens" not in health
    assert ' "POST /v1/chat/completions" 404 id=' in missing and "tokens" not in missing

    lines = {line["request_id"]: line for line in _log_lines(path)}
    assert set(lines) == {"trace-42.a", "trace-42.a-1", "stream-7", "agent-1", "resp-1"}
    first = lines["trace-42.a"]
    assert set(first) >= {"request_id", "prompt_tokens", "cached_tokens", "completion_tokens", "finish_reason",
                          "timing", "hit", "pauses"}
    assert first["http_request_id"] == lines["trace-42.a-1"]["http_request_id"] == "trace-42.a"
    assert first["path"] == "/v1/chat/completions" and first["finish_reason"] == "length"  # max_tokens=3
    assert first["prompt_tokens"] == u["prompt_tokens"] and first["pauses"] == 0
    timing = first["timing"]
    assert set(timing) == {"queue_s", "ttft_s", "total_s", "max_output_gap_s"}
    assert 0 <= timing["queue_s"] <= timing["ttft_s"] <= timing["total_s"]
    assert lines["stream-7"]["completion_tokens"] == 5 and lines["resp-1"]["path"] == "/v1/responses"


def test_access_log_off_writes_no_line(access_lines):
    fake = FakeEngine(max_context=256)
    srv = _serve(fake, access_log=False)
    try:
        r = httpx2.post(f"{_base(srv)}/v1/completions", json={"model": "fake:tiny", "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 200 and r.headers["x-request-id"]
        http_settled(srv)
    finally:
        srv.shutdown(grace_s=1.0)
        fake.close()
    assert access_lines == []


def test_request_log_names_the_recovery_point_of_a_hit(tmp_path):
    """Turn two of a conversation starts from turn one's recovery point: its line says which
    (kind, frontier = its cached tokens). The cost-model Program serves it (no model math)."""
    path = tmp_path / "requests.jsonl"
    cfg = EngineConfig(max_concurrency=2, max_context=256, chunk_size=32, progress=False)
    engine = Engine(cfg, program=SimProgram(cfg))
    srv = _serve(engine, request_log=str(path))
    base = _base(srv)
    try:
        body = {"model": "builtin:tiny-hybrid", "max_tokens": 8, "temperature": 0}
        one = httpx2.post(f"{base}/v1/chat/completions", headers={"X-Request-Id": "turn-1"},
                          json=dict(body, messages=USER)).json()
        history = USER + [one["choices"][0]["message"], {"role": "user", "content": "And then?"}]
        two = httpx2.post(f"{base}/v1/chat/completions", headers={"X-Request-Id": "turn-2"},
                          json=dict(body, messages=history)).json()
        http_settled(srv)
    finally:
        srv.shutdown(grace_s=1.0)
        engine.close()
    lines = {line["request_id"]: line for line in _log_lines(path)}
    assert lines["turn-1"]["hit"] is None and lines["turn-1"]["cached_tokens"] == 0
    hit, cached = lines["turn-2"]["hit"], two["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0 and lines["turn-2"]["cached_tokens"] == cached
    assert hit is not None and hit["frontier"] == cached
    assert hit["kind"] in ("E", "input", "anchor", "shared") and set(hit) == {"kind", "input_kind", "frontier",
                                                                              "takeover", "private"}


def test_a_paused_request_counts_its_pauses():
    """Completion.pauses (the request log's `pauses`): a request paused mid-decode and resumed."""
    from ninfer_jax.engine.request import DECODE

    cfg = EngineConfig(max_concurrency=2, max_context=256, chunk_size=32, progress=False)
    engine = Engine(cfg, program=SimProgram(cfg), start=False)
    try:
        h = engine.submit([5, 6, 7, 8, 9] * 10, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
        for _ in range(200):
            engine.step()
            r = engine.core.by_id.get(h.request_id)
            if r is not None and r.phase == DECODE and len(r.output) >= 3:
                break
        assert engine.core.pause(h.request_id, "replay")
        while not h.done():
            engine.step()
        done = h.result()
        assert done.finish_reason == "length" and done.pauses == 1 and done.hit is None
        line = record(done, http_request_id="x", path="/v1/completions")
        assert line["pauses"] == 1 and line["timing"]["ttft_s"] is not None
        engine.check_integrity()
    finally:
        engine.close()


# --- CORS --------------------------------------------------------------------------------------------
PREFLIGHT = {"Origin": "http://app.example", "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization, content-type, x-api-key, x-request-id"}


def test_cors_with_origins_and_none_without():
    fake = FakeEngine(max_context=256)
    on = _serve(fake, token="s3cret", cors_origins=("http://app.example",))
    off = _serve(fake, token="s3cret")
    try:
        pre = httpx2.options(f"{_base(on)}/v1/chat/completions", headers=PREFLIGHT)  # no token needed
        assert pre.status_code == 200, pre.text
        assert pre.headers["access-control-allow-origin"] == "http://app.example"
        assert set(pre.headers["access-control-allow-methods"].split(", ")) == {"GET", "POST", "DELETE", "OPTIONS"}
        allowed = {h.strip() for h in pre.headers["access-control-allow-headers"].lower().split(",")}
        assert {"authorization", "x-api-key", "x-request-id", "content-type"} <= allowed
        other = httpx2.options(f"{_base(on)}/v1/chat/completions", headers=dict(PREFLIGHT, Origin="http://evil.test"))
        assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
        got = httpx2.get(f"{_base(on)}/v1/models", headers={"Origin": "http://app.example",
                                                             "Authorization": "Bearer s3cret"})
        assert got.status_code == 200 and got.headers["access-control-allow-origin"] == "http://app.example"
        assert "x-request-id" in got.headers["access-control-expose-headers"].lower() and got.headers["x-request-id"]
        assert httpx2.get(f"{_base(on)}/v1/models", headers={"Origin": "http://app.example"}).status_code == 401
        # none configured: no CORS headers at all, and OPTIONS is just a method the API does not serve
        pre = httpx2.options(f"{_base(off)}/v1/chat/completions", headers=PREFLIGHT)
        assert pre.status_code in (401, 405) and not any(k.startswith("access-control") for k in pre.headers)
        got = httpx2.get(f"{_base(off)}/v1/models", headers={"Origin": "http://app.example",
                                                              "Authorization": "Bearer s3cret"})
        assert got.status_code == 200 and not any(k.startswith("access-control") for k in got.headers)
    finally:
        on.shutdown(grace_s=1.0)
        off.shutdown(grace_s=1.0)
        fake.close()


# --- ninfer serve -------------------------------------------------------------------------------------
def test_ninfer_serve_prints_the_access_log_and_writes_the_request_log(tmp_path):
    import signal

    from fakes import spawn_serve

    path = tmp_path / "requests.jsonl"
    with spawn_serve("--model=fake:tiny", "--port=-1", "--http_port=0", "--served_model_name=tiny",
                     f"--request_log={path}", pattern=r"serving .* on http://(127\.0\.0\.1:\d+)") as (proc, address):
        r = httpx2.post(f"http://{address}/v1/chat/completions", headers={"X-Request-Id": "cli-1"},
                        json={"model": "tiny", "messages": USER, "max_tokens": 2})
        assert r.status_code == 200 and r.json()["model"] == "tiny"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        err = proc.stderr.read()
    access = [line for line in err.splitlines() if '"POST /v1/chat/completions"' in line]
    assert len(access) == 1 and access[0].startswith("[ninfer] ") and " 200 id=cli-1 " in access[0], err
    assert "sampling defaults: SamplingParams' own" in err
    assert [line["request_id"] for line in _log_lines(path)] == ["cli-1"]
