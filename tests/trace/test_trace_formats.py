"""Parsing both trace formats, and a clear error (file:line: why) for every malformed line."""
import json

import pytest

from ninfer_jax.bench.trace import TraceError, check_vocab, load_trace, mooncake_block, parse_lines
from trace_helpers import marconi_line

SYSTEM = {"role": "system", "content": "Be brief."}


def _chat(**kw) -> str:
    obj = {"session": "s1", "messages": [{"role": "user", "content": "hi"}]}
    obj.update(kw)
    return json.dumps(obj)


def test_chat_lines_parse_with_defaults_and_optional_fields():
    reply = {"role": "assistant", "content": "ok", "reasoning_content": "think"}
    tr = parse_lines([_chat(messages=[SYSTEM, {"role": "user", "content": "hi"}], tools=[{"name": "f"}], turn=0,
                            ts=1.5, max_tokens=7, reply=reply, cache_markers=[{"message": 0}]),
                      "", _chat(turn=1, reply="plain text"), json.dumps({"messages": [{"role": "user", "content": "x"}]})])
    assert tr.format == "chat" and len(tr.requests) == 3 and tr.sessions == 2
    a, b, c = tr.requests
    assert (a.session, a.turn, a.ts, a.max_tokens, a.reply, a.tools) == ("s1", 0, 1.5, 7, reply, ({"name": "f"},))
    assert a.cache_markers == ({"message": 0},) and a.prompt_ids is None
    assert b.reply == {"role": "assistant", "content": "plain text"} and b.max_tokens is None
    assert c.session == "line-2" and c.ts == 2.0  # no session: a standalone request; ts defaults to line order


def test_marconi_lines_parse_with_outputs_and_exact_lengths():
    tr = parse_lines([marconi_line(7, 0, 0.5, [1, 2, 3], [4, 5]), marconi_line(7, 1, 0.9, [1, 2, 3, 4, 5, 6], [9])])
    assert tr.format == "marconi" and tr.sessions == 1
    r0, r1 = tr.requests
    assert (r0.session, r0.turn, r0.ts, r0.prompt_ids, r0.max_tokens) == ("7", 0, 0.5, (1, 2, 3), 2)
    assert r0.ignore_eos and r1.prompt_ids == (1, 2, 3, 4, 5, 6)
    assert tr.output_tokens == ((4, 5), (9,))


def test_format_is_forced_when_asked():
    with pytest.raises(TraceError, match="missing 'session_id'"):
        parse_lines([_chat()], fmt="marconi")
    with pytest.raises(TraceError, match="missing 'messages'"):
        parse_lines([marconi_line(1, 0, 0, [1], [2])], fmt="chat")


@pytest.mark.parametrize("line, why", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "a line must be a JSON object"),
    ('{"foo": 1}', "neither a chat request"),
])
def test_a_line_of_neither_format_is_an_error(tmp_path, line, why):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n" + line + "\n")
    with pytest.raises(TraceError) as e:
        load_trace(str(path))
    assert f"{path}:2: {why}" in str(e.value)


@pytest.mark.parametrize("line, why", [
    (_chat(messages=[]), "non-empty list of messages"),
    (_chat(messages=["hi"]), "non-empty list of messages"),
    (_chat(messages="hi"), "'messages' has the wrong type"),
    (_chat(max_tokens=0), "'max_tokens' must be positive"),
    (_chat(max_tokens=True), "'max_tokens' has the wrong type"),
    (_chat(reply=5), "'reply' must be an assistant message"),
    (_chat(reply={"role": "user", "content": "x"}), "'reply' must be an assistant message"),
    (_chat(tools={"name": "f"}), "'tools' has the wrong type"),
    ("{not json", "not valid JSON"),
    (marconi_line(1, 0, 0, [1, 2], [3], num_input_tokens=3), "num_input_tokens=3 but input_tokens holds 2"),
    (marconi_line(1, 0, 0, [1, 2], [3, 4], num_output_tokens=1), "num_output_tokens=1 but output_tokens holds 2"),
    (marconi_line(1, 0, 0, [1, -2], [3]), "non-negative integer token ids"),
    (marconi_line(1, 0, 0, [1, "a"], [3]), "non-negative integer token ids"),
    (marconi_line(1, 0, 0, [], [3], num_input_tokens=0), "'input_tokens' is empty"),
    (marconi_line(1, "0", 0, [1], [3]), "'turn_id' has the wrong type"),
    (marconi_line(1, 0, "soon", [1], [3]), "'ts' has the wrong type"),
])
def test_malformed_line_names_file_line_and_reason(tmp_path, line, why):
    good = marconi_line("ok", 0, 0, [1], [2]) if "input_tokens" in line else _chat(session="ok", turn=0)
    path = tmp_path / "bad.jsonl"
    path.write_text(good + "\n" + line + "\n")
    with pytest.raises(TraceError) as e:
        load_trace(str(path))
    assert f"{path}:2: " in str(e.value) and why in str(e.value)


def test_mixed_formats_and_repeated_turns_are_errors():
    with pytest.raises(TraceError, match=":2: missing 'messages'"):
        parse_lines([_chat(), marconi_line(1, 0, 0, [1], [2])])
    with pytest.raises(TraceError, match="session '1' has turn 0 twice"):
        parse_lines([marconi_line(1, 0, 0, [1], [2]), marconi_line(1, 0, 1, [1, 2], [3])])


def test_empty_and_missing_files(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(TraceError, match="no requests"):
        load_trace(str(empty))
    with pytest.raises(TraceError, match="missing.jsonl"):
        load_trace(str(tmp_path / "missing.jsonl"))


def test_ids_beyond_the_vocabulary_are_refused_never_folded():
    """Folding ids into a small vocabulary would invent shared prefixes: refused, naming the
    request and what to do instead."""
    tr = parse_lines([marconi_line(1, 0, 0, [5, 70, 151], [30]),
                      marconi_line(2, 0, 1, [5, 70000, 8], [1])])
    check_vocab(tr, 151936)  # a Qwen-sized vocabulary covers it
    with pytest.raises(TraceError, match=r"request 1 .*token id 70000.*--model=FOLDER"):
        check_vocab(tr, 1024)
    out_of_range = parse_lines([marconi_line(1, 0, 0, [5, 6], [2000])])
    with pytest.raises(TraceError, match="token id 2000"):
        check_vocab(out_of_range, 1024)  # recorded outputs are replayed too: checked alike


def test_mooncake_lines_parse_into_shared_blocks(tmp_path):
    lines = [json.dumps({"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [7, 8]}),
             json.dumps({"timestamp": 250, "input_length": 1000, "output_length": 2, "hash_ids": [7, 9],
                         "session_id": "s"}),
             json.dumps({"timestamp": 500, "input_length": 10, "output_length": 0, "hash_ids": [7]})]
    tr = parse_lines(lines)
    assert tr.format == "mooncake" and [len(r.prompt_ids) for r in tr.requests] == [600, 1000, 10]
    a, b, c = (r.prompt_ids for r in tr.requests)
    assert a[:512] == b[:512] == mooncake_block(7) and a[:10] == c and a[512:] != b[512:600]
    assert [r.max_tokens for r in tr.requests] == [4, 2, 1] and all(r.ignore_eos for r in tr.requests)
    assert [r.ts for r in tr.requests] == [0.0, 0.25, 0.5]  # milliseconds in the file
    assert tr.requests[1].session == "s" and tr.requests[0].session != tr.requests[2].session
    check_vocab(tr, 1024)
    with pytest.raises(TraceError, match=r"trace:1: input_length=600 needs 2 hash_ids"):
        parse_lines([json.dumps({"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [7]})])
    with pytest.raises(TraceError, match=r"trace:1: .*'output_length'"):
        parse_lines([json.dumps({"timestamp": 0, "input_length": 6, "hash_ids": [7]})])
