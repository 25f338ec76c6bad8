"""The synthetic trace generator: deterministic by seed, the structure the replay relies on
(tool calls answered by tool messages, reasoning kept in the stored replies and dropped from
the next user turn's prompt), and sessions that fit the context they were made for."""
import collections
import json
import pytest

from ninfer_jax.bench import trace_gen
from ninfer_jax.bench.trace import parse_lines
from ninfer_jax.frontend import ChatFrontend, Tokenizer


@pytest.fixture(scope="module")
def front():
    return ChatFrontend(Tokenizer.load("builtin:tiny-hybrid"), max_input_tokens=1 << 16)


def _sessions(lines):
    out = collections.defaultdict(list)
    for line in lines:
        out[line["session"]].append(line)
    return out


def _conversations(lines):
    """Per session, per request: (the messages sent, the tools, the stored reply, max_tokens)."""
    for sess in _sessions(lines).values():
        history, tools, seq = [], None, []
        for line in sorted(sess, key=lambda l: l["turn"]):
            tools = line.get("tools", tools)
            history = history + line["messages"]
            seq.append((list(history), tools, line["reply"], line["max_tokens"]))
            history.append(line["reply"])
        yield seq


@pytest.mark.parametrize("kind", ["chat", "agent", "marconi"])
def test_same_seed_same_bytes_other_seed_other_trace(tmp_path, kind):
    paths = [tmp_path / f"{kind}{i}.jsonl" for i in range(3)]
    for path, seed in zip(paths, (3, 3, 4)):
        trace_gen.write(trace_gen.generate(kind, 12, seed), str(path))
    assert paths[0].read_bytes() == paths[1].read_bytes()
    assert paths[0].read_bytes() != paths[2].read_bytes()
    tr = parse_lines(paths[0].read_text().splitlines())
    assert tr.format == ("marconi" if kind == "marconi" else "chat") and tr.sessions == 12


def test_main_writes_the_trace(tmp_path, capsys):
    out = tmp_path / "a.jsonl"
    assert trace_gen.main(["--kind", "agent", "--sessions", "5", "--seed", "1", "--out", str(out)]) == 0
    assert out.read_text().splitlines() == [json.dumps(l, separators=(",", ":"))
                                            for l in trace_gen.generate("agent", 5, 1)]
    assert "5 sessions" in capsys.readouterr().err


def test_lines_are_in_timestamp_order_and_turns_count_up():
    lines = trace_gen.generate("agent", 30, 0)
    assert [l["ts"] for l in lines] == sorted(l["ts"] for l in lines)
    for sess in _sessions(lines).values():
        assert [l["turn"] for l in sess] == list(range(len(sess)))
        assert "tools" in sess[0] and all("tools" not in l for l in sess[1:])


def test_agent_trace_has_tool_calls_answered_and_reasoning_in_every_stored_reply():
    lines = trace_gen.generate("agent", 40, 0)
    replies = [l["reply"] for l in lines]
    assert all(r.get("reasoning_content") for r in replies)
    calls = [r for r in replies if r.get("tool_calls")]
    assert len(calls) > len(lines) // 3 and any(not r.get("tool_calls") for r in replies)
    by_session = _sessions(lines)
    for sess in by_session.values():
        for prev, line in zip(sess, sess[1:]):
            if prev["reply"].get("tool_calls"):  # the next request opens with the tool's answer
                first = line["messages"][0]
                assert first["role"] == "tool" and first["tool_call_id"] == prev["reply"]["tool_calls"][0]["id"]
    assert max(sum(m["role"] == "user" for l in s for m in l["messages"]) for s in by_session.values()) >= 2


def test_agent_prompts_drop_past_reasoning_and_keep_the_current_tasks(front):
    """The point of the agent trace: within a task the reasoning stays in the prompt; a new user
    message makes the template drop it, so the prompt stops extending the previous one (SCN-1)."""
    dropped = kept = 0
    for seq in _conversations(trace_gen.generate("agent", 12, 0)):
        for (hist, tools, _, _), (nxt, _, _, _) in zip(seq, seq[1:]):
            prev_reply = nxt[len(hist)]
            text = front.render_chat(nxt, tools=tools).text
            if nxt[-1]["role"] == "user":
                assert prev_reply["reasoning_content"] not in text
                dropped += 1
            else:
                assert prev_reply["reasoning_content"] in text
                kept += 1
    assert dropped >= 3 and kept >= 3


def test_chat_trace_mixes_thinking_and_plain_replies():
    replies = [l["reply"] for l in trace_gen.generate("chat", 40, 0)]
    with_reasoning = sum("reasoning_content" in r for r in replies)
    assert 0 < with_reasoning < len(replies)
    assert all(not r.get("tool_calls") for r in replies)


@pytest.mark.parametrize("kind, max_context", [("chat", 512), ("agent", 512), ("agent", 2048)])
def test_every_request_fits_the_context_it_was_made_for(front, kind, max_context):
    lines = trace_gen.generate(kind, 12, 5, max_context)
    assert len(lines) >= 12
    for seq in _conversations(lines):
        for hist, tools, _, max_tokens in seq:
            assert len(front.render_chat(hist, tools=tools).token_ids) + max_tokens <= max_context


def test_marconi_lines_carry_the_replay_harness_workload():
    from ninfer_jax.bench.cache_replay import workload

    lines = trace_gen.generate("marconi", 6, 2)
    reqs = workload(6, 6, 2)
    assert [l["input_tokens"] for l in lines] == [r["tokens"] for r in reqs]
    assert all(l["num_input_tokens"] == len(l["input_tokens"]) and l["num_output_tokens"] == len(l["output_tokens"])
               for l in lines)
    assert [l["ts"] for l in lines] == sorted(l["ts"] for l in lines)
    for sid in {l["session_id"] for l in lines}:
        assert [l["turn_id"] for l in lines if l["session_id"] == sid] == list(range(6))
