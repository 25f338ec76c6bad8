"""On the real built-in model: a tiny chat trace through `ninfer trace`'s replay, and the
multi-turn `ninfer chat` reading user messages from stdin (cached tokens per turn on stderr)."""
import json
import os
import re
import subprocess
import sys

import pytest

from ninfer_jax import EngineConfig
from ninfer_jax.bench import trace as T
from trace_helpers import write_lines

SMALL = dict(max_concurrency=1, max_context=512)


def _chat_line(session, turn, text, reply):
    return json.dumps({"session": session, "turn": turn, "ts": turn + 0.5 * (session == "b"), "max_tokens": 4,
                       "messages": ([{"role": "system", "content": "You answer in one short line."}] if turn == 0
                                    else []) + [{"role": "user", "content": text}],
                       "reply": reply})


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    lines = []
    for s in ("a", "b"):
        lines += [_chat_line(s, 0, f"What is the weather in the {s} city?",
                             {"role": "assistant", "content": "Sunny.", "reasoning_content": "Look it up."}),
                  _chat_line(s, 1, "And tomorrow?", "Rain."),
                  _chat_line(s, 2, "Thanks, read the file.", "Done.")]
    path = write_lines(tmp_path_factory.mktemp("real") / "chat.jsonl", lines)
    return T.run_trace(path, EngineConfig(progress=False, **SMALL), program="model", cold=False)


def test_real_model_trace_runs_every_request(real):
    f = real
    assert (f["program"], f["clock"], f["requests"], f["sessions"], f["requests_failed"]) == ("model", "wall", 6, 2, 0)
    assert f["generated_tokens"] <= 6 * 4 and f["prefill_tokens"] + f["reused_tokens"] == f["prompt_tokens"]
    assert 0 < f["ttft_p50_s"] <= f["ttft_p99_s"] < 30
    assert f["ttft_p50_s"] <= f["completion_p50_s"] <= f["completion_p99_s"] and f["ttft_p99_s"] <= f["completion_p99_s"]
    assert 0 <= f["max_gap_p50_s"] <= f["max_gap_p99_s"] <= f["completion_p99_s"]  # OBS-4
    assert 0 < f["upper_bound_tokens"] < f["prompt_tokens"]
    assert 0 <= f["cached_tokens"] <= f["upper_bound_tokens"]


def test_real_model_trace_reuses_earlier_turns(real):
    assert real["cached_tokens"] > 0 and real["cache_hits"] > 0 and real["reuse_of_upper_bound_pct"] >= 30


TURN = re.compile(r"\[ninfer\] turn (\d+): (\d+) prompt tokens \((\d+) cached\), (\d+) generated")


@pytest.fixture(scope="module")
def conversation():
    out = subprocess.run([sys.executable, "-m", "ninfer_jax.cli", "chat", "--turns=3", "--max_tokens=6",
                          "--max_concurrency=1", "--max_context=512",
                          '--messages=[{"role": "system", "content": "Be brief."}]'],
                         input="Hello there, what is the weather?\n\nAnd tomorrow in the city?\nRead the file.\n"
                               "This fourth line is past --turns.\n",
                         capture_output=True, text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=300)
    assert out.returncode == 0, out.stderr
    return out, [tuple(map(int, m)) for m in TURN.findall(out.stderr)]


def test_chat_reads_one_user_message_per_line_and_reports_each_turn(conversation):
    out, turns = conversation
    assert [t[0] for t in turns] == [1, 2, 3]  # blank lines skipped, --turns caps it
    prompts = [t[1] for t in turns]
    assert prompts[0] < prompts[1] < prompts[2], "each turn's prompt holds the conversation so far"
    assert turns[0][2] == 0 and all(t[3] == 6 or t[3] < 6 for t in turns)
    assert all(t[2] <= t[1] for t in turns)
    assert out.stdout.strip() and "[ninfer]" not in out.stdout


def test_chat_later_turns_are_served_from_the_cache(conversation):
    _, turns = conversation
    assert all(t[2] > 0 for t in turns[1:])
    assert turns[2][2] > turns[1][2], "the third turn reuses more than the second"


def test_stdin_turns_only_when_lines_wait(tmp_path, monkeypatch):
    """No lines on stdin (and no --turns): None, so `ninfer chat` keeps its single-turn path."""
    from absl import flags

    from ninfer_jax import cli_flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
    empty = tmp_path / "empty"
    empty.write_text("")
    with open(empty) as f:
        monkeypatch.setattr(sys, "stdin", f)
        assert cli_flags.stdin_turns() is None
    full = tmp_path / "full"
    full.write_text("one\n\n two \nthree")
    with open(full) as f:
        monkeypatch.setattr(sys, "stdin", f)
        assert list(cli_flags.stdin_turns()) == ["one", " two ", "three"]
    r, w = os.pipe()  # an open pipe nobody writes to: not waited on
    with os.fdopen(r) as f:
        monkeypatch.setattr(sys, "stdin", f)
        assert cli_flags.stdin_turns() is None
    os.close(w)
