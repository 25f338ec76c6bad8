"""`trace_gen --kind agent_long`: token-level coding / tool agents at realistic lengths. A pure
function of the seed, ids inside the Qwen3 vocabulary, prompts that grow by the previous output
and a tool result or a user message, occasional retries and dropped reasoning, and lines that
`ninfer trace` reads (the Marconi format). Small session counts: seconds."""
import collections
import json
import statistics

import pytest

from ninfer_jax.bench import trace_gen
from ninfer_jax.bench.trace import TraceError, check_vocab, load_trace

SHAPE = trace_gen.AgentLongShape()


@pytest.fixture(scope="module")
def lines():
    return trace_gen.generate("agent_long", 40, 0)


def _sessions(lines):
    out = collections.defaultdict(list)
    for line in lines:
        out[line["session_id"]].append(line)
    return {k: sorted(v, key=lambda l: l["turn_id"]) for k, v in out.items()}


def _kind(prev, line):
    """How a request follows its session's previous one."""
    end = prev["input_tokens"] + prev["output_tokens"]
    if line["input_tokens"] == prev["input_tokens"]:
        return "retry"
    if line["input_tokens"][:len(end)] == end:
        return "extension"
    return "other"


def test_same_seed_same_bytes_other_seed_other_trace(tmp_path):
    paths = [tmp_path / f"a{i}.jsonl" for i in range(3)]
    for path, seed in zip(paths, (5, 5, 6)):
        trace_gen.write(trace_gen.generate("agent_long", 6, seed), str(path))
    assert paths[0].read_bytes() == paths[1].read_bytes()
    assert paths[0].read_bytes() != paths[2].read_bytes()


def test_main_writes_a_trace_that_load_trace_reads(tmp_path, capsys):
    out = tmp_path / "t.jsonl"
    assert trace_gen.main(["--kind", "agent_long", "--sessions", "4", "--seed", "2", "--out", str(out)]) == 0
    want = trace_gen.generate("agent_long", 4, 2)
    assert out.read_text().splitlines() == [json.dumps(l, separators=(",", ":")) for l in want]
    err = capsys.readouterr().err
    assert "4 sessions" in err and "prompt tokens" in err and "output tokens" in err
    tr = load_trace(str(out))
    assert tr.format == "marconi" and tr.sessions == 4 and len(tr.requests) == len(want)
    for req, out_ids, line in zip(tr.requests, tr.output_tokens, want):
        assert list(req.prompt_ids) == line["input_tokens"] and list(out_ids) == line["output_tokens"]
        assert req.max_tokens == line["num_output_tokens"] and req.ignore_eos
    check_vocab(tr, trace_gen.QWEN3_VOCAB)  # inside the Qwen3-Next vocabulary ...
    with pytest.raises(TraceError, match="beyond the vocabulary"):
        check_vocab(tr, trace_gen.TEXT_IDS)  # ... and using its special tokens


def test_lengths_ids_and_order(lines):
    assert [l["ts"] for l in lines] == sorted(l["ts"] for l in lines)
    for line in lines:
        assert line["num_input_tokens"] == len(line["input_tokens"]) <= SHAPE.max_prompt
        assert line["num_output_tokens"] == len(line["output_tokens"]) > 0
        ids = line["input_tokens"] + line["output_tokens"]
        assert all(isinstance(t, int) and 0 <= t < trace_gen.QWEN3_VOCAB for t in ids)
    for sess in _sessions(lines).values():
        assert [l["turn_id"] for l in sess] == list(range(len(sess)))
        assert 1_600 <= sess[0]["num_input_tokens"] <= 3_200  # the ~2k shared prefix + the first task
    prompts = [l["num_input_tokens"] for l in lines]
    assert max(prompts) > 25_000  # sessions grow toward the limit
    outputs = [l["num_output_tokens"] for l in lines]
    assert 200 <= statistics.mean(outputs) <= 380  # ~280 by default
    assert 10 <= len(lines) / 40 <= 25  # ~17 requests a session by default


def test_prompts_extend_prompt_and_output_with_retries_and_dropped_reasoning(lines):
    kinds = collections.Counter()
    for sess in _sessions(lines).values():
        for prev, line in zip(sess, sess[1:]):
            kind = _kind(prev, line)
            kinds[kind] += 1
            if kind == "extension":  # grows by a tool result or a user message
                grown = line["num_input_tokens"] - prev["num_input_tokens"] - prev["num_output_tokens"]
                assert 60 <= grown <= SHAPE.tool_result_len[1] + 32
                assert line["input_tokens"][-3:] == [trace_gen.IM_START, trace_gen.ROLE_ASSISTANT, trace_gen.NL]
            elif kind == "other":  # a new task after a final answer, all past reasoning dropped
                assert trace_gen.TOOL_CALL not in prev["output_tokens"]
                assert trace_gen.THINK not in line["input_tokens"]
                assert trace_gen.THINK in prev["input_tokens"] + prev["output_tokens"]
                # everything before the first reasoning block is kept
                first = (prev["input_tokens"] + prev["output_tokens"]).index(trace_gen.THINK)
                assert line["input_tokens"][:first] == prev["input_tokens"][:first]
    assert kinds["extension"] > 5 * (kinds["retry"] + kinds["other"])  # occasional: ~4 % and ~5 %
    assert kinds["retry"] >= 3 and kinds["other"] >= 3


def test_sessions_share_a_few_system_prompts_and_tool_schemas(lines):
    heads = collections.Counter(tuple(s[0]["input_tokens"][:1_500]) for s in _sessions(lines).values())
    assert 2 <= len(heads) <= SHAPE.systems * SHAPE.toolsets and max(heads.values()) >= 3
    # the same system prompt with different tool schemas: prompts share a shorter prefix
    systems = collections.Counter(tuple(s[0]["input_tokens"][:400]) for s in _sessions(lines).values())
    assert len(systems) == SHAPE.systems


def test_each_session_its_own_tokens_and_independent_of_the_count():
    """Session s is the same whatever the session count (only its start time scales)."""
    few, many = (_sessions(trace_gen.generate("agent_long", n, 1)) for n in (3, 6))
    for s in range(3):
        assert [l["input_tokens"] for l in few[s]] == [l["input_tokens"] for l in many[s]]
    a, b = many[0][0]["input_tokens"], many[1][0]["input_tokens"]
    assert a[-100:] != b[-100:]  # different tasks


def test_shape_bounds_the_prompts():
    shape = trace_gen.AgentLongShape(max_prompt=8_000, ceiling=(4_000, 8_000), p_retry=0.0, p_drop_reasoning=0.0)
    lines = trace_gen.generate("agent_long", 10, 3, shape=shape)
    assert max(l["num_input_tokens"] for l in lines) <= 8_000
    for sess in _sessions(lines).values():
        assert all(_kind(p, l) == "extension" for p, l in zip(sess, sess[1:]))


@pytest.mark.parametrize("argv", [["--min_ceiling", "3000"], ["--p_retry", "1.0"], ["--max_prompt", "3999"],
                                  ["--tool_result_median", "0"]])
def test_bad_options_are_refused(tmp_path, argv):
    with pytest.raises(SystemExit):
        trace_gen.main(["--kind", "agent_long", "--sessions", "2", "--out", str(tmp_path / "x.jsonl"), *argv])
