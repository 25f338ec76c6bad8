"""Every RPC over a real loopback channel, on the fake engine: what streams is what the engine made."""
from __future__ import annotations

import pytest

from ninfer_jax.engine.types import SamplingParams
from server.proto import ninfer_pb2 as pb

GREEDY = {"temperature": 0.0, "max_tokens": 12}
SEEDED = {"temperature": 0.8, "top_p": 0.9, "seed": 1234, "max_tokens": 12}


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("prompt", ["Hello, how are you?", [5, 17, 99, 300]], ids=["text", "ids"])
def test_generate_stream_equals_engine_generate(fake_server, settled, sampling, prompt):
    srv, client, engine = fake_server
    want = engine.generate(prompt, SamplingParams(**sampling))
    got = client.generate(prompt, sampling=sampling)
    assert got.token_ids == list(want.token_ids)
    assert got.text == want.text
    assert got.finish_reason == want.finish_reason
    assert got.usage["prompt_tokens"] == want.usage.prompt_tokens
    assert got.usage["completion_tokens"] == len(want.token_ids)
    settled(srv, engine)


def test_stream_is_deltas_then_one_final(fake_server):
    _, client, engine = fake_server
    prompt = "stream this"
    probe = engine.submit(prompt, SamplingParams(max_tokens=1))
    probe.result()
    assert engine._length(probe) > 6  # the fake would go on: the stream ends by length
    msgs = list(client.generate_stream(prompt, sampling={"max_tokens": 6, "temperature": 0}))
    *deltas, final = msgs
    assert len(deltas) == 6 and all(len(m.token_ids) == 1 for m in deltas)
    assert all(m.finish_reason == pb.FINISH_REASON_UNSPECIFIED and not m.HasField("usage") for m in deltas)
    assert final.finish_reason == pb.FINISH_REASON_LENGTH and not final.token_ids
    assert final.usage.completion_tokens == 6
    assert len({m.request_id for m in msgs}) == 1


def test_request_id_and_logprobs_pass_through(fake_server):
    _, client, _ = fake_server
    got = client.generate("abc", sampling={"max_tokens": 3, "logprobs": 2}, request_id="my-req.1")
    assert got.request_id == "my-req.1"
    assert len(got.logprobs) == 3
    assert [len(lp.top) for lp in got.logprobs] == [2, 2, 2]
    assert got.logprobs[0].token_id == got.token_ids[0]


def test_unset_sampling_keeps_engine_defaults(fake_server):
    _, client, engine = fake_server
    got = client.generate("defaults please")
    assert got.usage["completion_tokens"] <= SamplingParams().max_tokens
    assert got.finish_reason in ("stop", "length")


def test_chat_second_turn_reports_cached_tokens(fake_server, settled):
    srv, client, engine = fake_server
    turn1 = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}]
    first = client.chat(turn1, sampling=GREEDY, session="s1")
    assert first.message["role"] == "assistant" and first.message["content"] == first.text
    turn2 = turn1 + [first.message, {"role": "user", "content": "Another one."}]
    second = client.chat(turn2, sampling=GREEDY, session="s1")
    assert second.usage["cached_tokens"] > 0
    assert second.usage["prompt_tokens"] > first.usage["prompt_tokens"]
    want = engine.chat(turn2, sampling=SamplingParams(**GREEDY))
    assert second.token_ids == list(want.token_ids)
    settled(srv, engine)


def test_chat_with_tools_markers_and_parts(fake_server):
    _, client, _ = fake_server
    tool = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.",
                                             "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?", "cache_control": {"type": "ephemeral"}}]},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    got = client.chat(messages, tools=[tool], cache_markers=[{"message": 0}, {"tools": True}], sampling=GREEDY)
    assert got.finish_reason in ("stop", "length") and got.token_ids


def test_assistant_message_is_parsed(fake_server):
    from server.convert import assistant_to_proto

    msg = assistant_to_proto('<think>hmm</think>ok<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>')
    assert msg.reasoning_content == "hmm" and msg.content == "ok"
    assert [(c.name, c.arguments_json) for c in msg.tool_calls] == [("f", '{"x": 1}')]


def test_tokenize_model_info_stats(fake_server):
    _, client, engine = fake_server
    assert client.tokenize("Hello world") == engine.tokenizer.encode("Hello world")
    info = client.model_info()
    assert info["vocab_size"] == engine.tokenizer.vocab_size and info["max_context"] == engine.max_context == 512
    assert info["eos_token_ids"] == list(engine.tokenizer.eos_token_ids)
    assert info["server_version"].startswith("ninfer.v1")
    before = client.stats()["requests_submitted"]
    client.generate("count me", sampling={"max_tokens": 2})
    stats = client.stats()
    assert stats["requests_submitted"] == before + 1
    assert isinstance(stats["step_seconds"], float)
