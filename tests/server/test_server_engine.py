"""The service over the real engine (built-in tiny model, max_concurrency 2, max_context 256,
chunk 32) on a real loopback channel: streams equal `engine.generate`, cancel/disconnect/deadline
free everything (`check_integrity()`), errors map, concurrent streams with random cuts end clean."""
from __future__ import annotations

import json
import queue
import random
import threading

import grpc
import pytest

from server.client import NInferClient
from server.proto import ninfer_pb2 as pb
from fakes import cut_streams, running_server

ninfer_jax = pytest.importorskip("ninfer_jax")
if not hasattr(ninfer_jax, "Engine"):
    pytest.skip("the engine has not landed", allow_module_level=True)
from ninfer_jax import Engine, EngineConfig, SamplingParams  # noqa: E402

GREEDY = {"temperature": 0.0, "max_tokens": 12}
SEEDED = {"temperature": 0.9, "top_k": 50, "top_p": 0.95, "seed": 77, "max_tokens": 12}


@pytest.fixture(scope="module")
def real():
    engine = Engine(EngineConfig(model="builtin:tiny-hybrid", max_concurrency=2, max_context=256, chunk_size=32,
                                 progress=False))
    with running_server(engine) as (srv, client):
        yield srv, client, engine
    engine.close()


def _code(call):
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code(), info.value.details()


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("prompt", ["The weather today is", [12, 400, 77, 5, 900]], ids=["text", "ids"])
def test_streamed_tokens_equal_engine_generate(real, settled, sampling, prompt):
    srv, client, engine = real
    want = engine.generate(prompt, SamplingParams(**sampling))
    got = client.generate(prompt, sampling=sampling)
    assert got.token_ids == list(want.token_ids)
    assert got.text == want.text
    assert got.finish_reason == want.finish_reason
    assert got.usage["prompt_tokens"] == want.usage.prompt_tokens == len(want.prompt_token_ids)
    assert got.usage["completion_tokens"] == want.usage.completion_tokens
    settled(srv, engine)


def test_min_tokens_and_include_stop_str_cross_the_wire(real, settled):
    """Issue 36: vLLM's min_tokens and include_stop_str_in_output ride the protocol and mean the same."""
    srv, client, engine = real
    prompt = "Once upon a time"
    base = engine.generate(prompt, SamplingParams(**GREEDY))
    first, third = base.token_ids[0], base.token_ids[2]
    for extra in ({"stop_token_ids": [first], "min_tokens": 3},
                  {"stop_token_ids": [third], "include_stop_str_in_output": True},
                  {"stop_token_ids": [third], "include_stop_str_in_output": False}):
        sampling = {**GREEDY, **extra}
        want = engine.generate(prompt, SamplingParams(**{k: tuple(v) if isinstance(v, list) else v
                                                         for k, v in sampling.items()}))
        got = client.generate(prompt, sampling=sampling)
        assert (got.token_ids, got.text) == (list(want.token_ids), want.text), extra
    assert client.generate(prompt, sampling={**GREEDY, "stop_token_ids": [first]}).token_ids == [first]
    settled(srv, engine)


def test_structured_output_crosses_the_wire(real, settled):
    """Issue 36: a structured output (as a mapping, or the engine's own StructuredOutput) rides
    the protocol; the text matches and equals the engine's in process; a bad grammar is
    INVALID_ARGUMENT naming the field."""
    from ninfer_jax.engine.grammar import StructuredOutput

    srv, client, engine = real
    schema = {"type": "object", "additionalProperties": False, "required": ["n"],
              "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}}}
    for so in (StructuredOutput("json_schema", schema), {"kind": "choice", "spec": ["up", "down"]},
               {"kind": "regex", "spec": "[a-c]{3}"}):
        got = client.generate("Say it:", sampling={**GREEDY, "structured_output": so})
        want_so = so if isinstance(so, StructuredOutput) else StructuredOutput(so["kind"], so["spec"])
        want = engine.generate("Say it:", SamplingParams(**GREEDY, structured_output=want_so))
        assert (got.token_ids, got.text) == (list(want.token_ids), want.text)
    assert json.loads(client.generate("Say it:", sampling={**GREEDY, "structured_output":
                                                          StructuredOutput("json_schema", schema)}).text)["n"] <= 99
    with pytest.raises(grpc.RpcError) as err:
        client.generate("Say it:", sampling={**GREEDY, "structured_output": {"kind": "regex", "spec": "("}})
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "structured_output" in err.value.details()
    settled(srv, engine)


def test_logprobs_equal_engine_generate(real):
    _, client, engine = real
    sampling = {"temperature": 0.0, "max_tokens": 5, "logprobs": 3}
    want = engine.generate([8, 6, 7, 5], SamplingParams(**sampling))
    got = client.generate([8, 6, 7, 5], sampling=sampling)
    assert [(lp.token_id, lp.logprob, [(t.token_id, t.logprob) for t in lp.top]) for lp in got.logprobs] == \
        [(lp.token_id, lp.logprob, [tuple(t) for t in lp.top]) for lp in want.logprobs]


def test_prompt_logprobs_equal_engine_generate(real, settled):
    """Issue 36: vLLM's prompt_logprobs ride the protocol: every prompt token's entry (its rank
    included) after the first, on the final message, as the engine gives them."""
    srv, client, engine = real
    prompt = list(range(40, 80))  # over two chunks
    for top in (0, 2):
        sampling = {"temperature": 0.0, "max_tokens": 3, "prompt_logprobs": top}
        want = engine.generate(prompt, SamplingParams(**sampling))
        got = client.generate(prompt, sampling=sampling)
        assert got.prompt_logprobs[0] is None and len(got.prompt_logprobs) == len(prompt)
        assert [(lp.token_id, lp.logprob, lp.rank, [(t.token_id, t.logprob) for t in lp.top])
                for lp in got.prompt_logprobs[1:]] == \
            [(lp.token_id, lp.logprob, lp.rank, [tuple(t) for t in lp.top]) for lp in want.prompt_logprobs[1:]]
        assert got.token_ids == list(want.token_ids)
    chat = client.chat([{"role": "user", "content": "Hi"}], sampling={"max_tokens": 2, "prompt_logprobs": 1})
    assert len(chat.prompt_logprobs) == chat.usage["prompt_tokens"]
    assert client.generate(prompt, sampling={"max_tokens": 2}).prompt_logprobs is None  # not asked: not sent
    settled(srv, engine)


def test_long_prompt_over_several_chunks(real, settled):
    srv, client, engine = real
    prompt = [(i * 37) % 1000 + 1 for i in range(100)]  # 4 prefill chunks of 32
    want = engine.generate(prompt, SamplingParams(**GREEDY))
    assert client.generate(prompt, sampling=GREEDY).token_ids == list(want.token_ids)
    settled(srv, engine)


def test_chat_turns_and_cached_tokens(real, settled):
    srv, client, engine = real
    turn1 = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say something."}]
    first = client.chat(turn1, sampling=GREEDY, session="t")
    assert first.token_ids == list(engine.chat(turn1, sampling=SamplingParams(**GREEDY)).token_ids)
    turn2 = turn1 + [first.message, {"role": "user", "content": "More."}]
    before = engine.stats()["cached_tokens"]
    second = client.chat(turn2, sampling=GREEDY, session="t")
    # What the stream reports is what the engine counted for that request.
    assert second.usage["cached_tokens"] == engine.stats()["cached_tokens"] - before
    assert second.usage["prompt_tokens"] > first.usage["prompt_tokens"]
    assert second.usage["cached_tokens"] > 0  # the first turn's context was reused
    # Reuse is invisible (doctrine 1): the same tokens as the engine gives in process.
    assert second.token_ids == list(engine.chat(turn2, sampling=SamplingParams(**GREEDY)).token_ids)
    settled(srv, engine)


def test_turn_two_renders_turn_one_exactly(real, settled):
    """Issue 36: the final message is the generated text with only its structure taken out, so
    the next turn's prompt starts with turn 1's prompt + generated tokens, whole."""
    srv, client, engine = real
    turn1 = [{"role": "user", "content": "Say something."}]
    first = client.chat(turn1, sampling=GREEDY)
    want = engine.chat(turn1, sampling=SamplingParams(**GREEDY))
    assert first.token_ids == list(want.token_ids) and want.text.startswith("\n")
    nxt = engine.chat_frontend().render_chat(turn1 + [first.message, {"role": "user", "content": "More."}])
    exact = list(want.prompt_token_ids) + list(want.token_ids)
    assert list(nxt.token_ids[:len(exact)]) == exact
    settled(srv, engine)


def test_cancel_mid_stream_frees_everything(real, settled):
    srv, client, engine = real
    cancelled = engine.stats()["requests_cancelled"]
    stream = client.generate_stream([3, 1, 4, 1, 5], sampling={"temperature": 0.0, "max_tokens": 200})
    next(stream)
    stream.cancel()
    assert _code(lambda: next(stream))[0] == grpc.StatusCode.CANCELLED
    settled(srv, engine)
    assert engine.stats()["requests_cancelled"] == cancelled + 1


def test_disconnect_frees_everything(real, settled):
    srv, _, engine = real
    other = NInferClient(srv.address)
    stream = other.generate_stream([2, 7, 1, 8], sampling={"temperature": 0.0, "max_tokens": 200})
    next(stream)
    other.close()  # the channel goes away mid-stream
    settled(srv, engine)


def test_deadline_exceeded_frees_everything(real, settled):
    """The engine thread is held busy (a call between cycles) until the deadline has passed,
    so the outcome does not depend on how fast this machine generates 200 tokens."""
    srv, client, engine = real
    gate, box = threading.Event(), queue.SimpleQueue()
    engine._post("call", (lambda: gate.wait(30), box))
    try:
        code, _ = _code(lambda: client.generate([9, 9, 9], sampling={"temperature": 0.0, "max_tokens": 200},
                                                timeout=0.3))
    finally:
        gate.set()
        box.get(timeout=30)
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED
    settled(srv, engine)


@pytest.mark.parametrize("prompt, sampling, needle", [
    ([], None, "empty"),
    ([1, 2048], None, "vocabulary"),
    ([5] * 257, None, "max_context"),
    ("x", {"top_p": 1.5}, "sampling.top_p"),
    ("x", {"max_tokens": 1000}, "server limit"),
])
def test_bad_requests_get_invalid_argument(real, prompt, sampling, needle):
    _, client, _ = real
    code, details = _code(lambda: client.generate(prompt, sampling=sampling))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and needle in details


def test_bad_chat_gets_invalid_argument(real):
    _, client, _ = real
    code, details = _code(lambda: client.chat([{"role": "narrator", "content": "x"}]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "UnknownRoleError" in details


def test_tokenize_model_info_stats(real):
    _, client, engine = real
    assert client.tokenize("Hello world") == engine.tokenizer.encode("Hello world")
    info = client.model_info()
    assert info["max_context"] == 256 and info["max_concurrency"] == 2
    assert info["model_type"] == engine.model_info()["model_type"]
    stats = client.stats()
    assert set(k for k, v in engine.stats().items() if isinstance(v, int)) <= set(stats)
    assert stats["compilations"] == engine.stats()["compilations"]


def test_200_streams_with_random_cancels_and_disconnects(real, settled):
    """200 concurrent streams on the real engine (2 lanes, so most wait in the queue), about a
    third cancelled and a third disconnected after 1-3 tokens; survivors equal engine.generate;
    nothing leaks and nothing recompiles."""
    srv, _, engine = real
    compilations = engine.stats()["compilations"]
    rng = random.Random(4)
    n = 200
    plan = [rng.choice(("finish", "cancel", "disconnect")) for _ in range(n)]
    prompts = [[rng.randrange(1, 1000) for _ in range(rng.randrange(1, 40))] for _ in range(n)]
    sampling = {"temperature": 0.0, "max_tokens": 4}
    results = cut_streams(srv.address, prompts, plan, sampling, seed=4, timeout=120)
    settled(srv, engine, timeout=20)
    for i in range(n):
        if plan[i] == "finish":
            assert results[i][1] is not None, i
            assert results[i][0] == list(engine.generate(prompts[i], SamplingParams(**sampling)).token_ids), i
    assert engine.stats()["compilations"] == compilations
    engine.check_integrity()


def test_deadline_while_queued(real, settled):
    srv, client, engine = real
    busy = [client.generate_stream([i + 1, 2], sampling={"temperature": 0.0, "max_tokens": 200}) for i in range(2)]
    for s in busy:
        next(s)  # both lanes taken
    # The deadline must fall while both lanes are still busy: 200 tokens take the faster engine
    # little more than 0.2 s on this machine, so keep it well below that.
    code, _ = _code(lambda: client.generate([5, 5], sampling={"max_tokens": 4}, timeout=0.05))
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED
    for s in busy:
        s.cancel()
    settled(srv, engine)


def test_ninfer_serve_real_engine_warm_up_and_sigterm():
    """`ninfer serve` on the built-in model: NOT_SERVING while compiling, SERVING after, a stream
    finishes across SIGTERM, exit 0."""
    import os
    import re
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-m", "server.cli", "serve", "--port=0", "--max_concurrency=1",
                             "--max_context=128", "--chunk_size=32", "--grace_s=30"],
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    try:
        address, seen, lines = None, [], []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and address is None:
            line = proc.stderr.readline()
            lines.append(line)
            m = re.search(r"listening on (127\.0\.0\.1:\d+)", line)
            if m:
                address = m.group(1)
            if not line and proc.poll() is not None:
                break
        assert address, "".join(lines)
        with NInferClient(address, timeout=30) as client:
            while time.monotonic() < deadline:
                status = client.health()
                if not seen or seen[-1] != status:
                    seen.append(status)
                if status == "SERVING":
                    break
                time.sleep(0.2)
            assert seen[-1] == "SERVING" and seen[0] == "NOT_SERVING", seen
            stream = client.generate_stream([1, 2, 3], sampling={"temperature": 0.0, "max_tokens": 8})
            next(stream)
            proc.send_signal(signal.SIGTERM)
            assert list(stream)[-1].finish_reason == pb.FINISH_REASON_LENGTH
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_generate_carries_explicit_save_points(real, settled):
    """recovery_point / markers over gRPC are Engine.submit's: a later prompt that leaves this
    one at the recovery point is served from it; a frontier outside the prompt is refused."""
    srv, client, engine = real
    ids = [(17 * i + 3) % 997 for i in range(120)]
    client.generate(ids, sampling=GREEDY, recovery_point=100, markers=[64], session="s1")
    got = client.generate(ids[:100] + [1, 2, 3], sampling=GREEDY, session="s1")
    assert got.usage["cached_tokens"] == 100
    assert got.token_ids == list(engine.generate(ids[:100] + [1, 2, 3], SamplingParams(**GREEDY)).token_ids)
    code, details = _code(lambda: client.generate(ids, sampling=GREEDY, anchors=[500]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "outside [1, 120]" in details
    with pytest.raises(grpc.RpcError, match="at most 4"):  # refused by the client before sending
        client.generate(ids, markers=[1, 2, 3, 4, 5])
    settled(srv, engine)
