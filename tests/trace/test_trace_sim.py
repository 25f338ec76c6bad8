"""`ninfer trace` end to end on the cost-model Program: a hand-made token-level trace whose
reuse is known, a synthetic agent trace, and the command line (JSON out, errors)."""
import dataclasses
import json
import os
import subprocess
import sys

import pytest

from ninfer_jax import EngineConfig
from ninfer_jax.bench import trace as T
from ninfer_jax.bench import trace_gen
from trace_helpers import marconi_line, write_lines

CFG = EngineConfig(max_concurrency=4, max_context=1024, chunk_size=128, progress=False)
SYSTEM = list(range(100, 300))  # 200 tokens every session opens with


@pytest.fixture(scope="module")
def known(tmp_path_factory):
    """Two sessions of three turns over a shared 200-token prefix; every turn extends the
    previous prompt and its recorded output (replayed as forced outputs, so E is a source)."""
    lines = []
    for s in range(2):
        prompt = SYSTEM + [400 + s]
        for turn in range(3):
            lines.append(marconi_line(s, turn, turn + 0.1 * s, prompt, [500 + turn] * 4))
            prompt = prompt + [500 + turn] * 4 + [600 + 10 * s + turn] * 20
    path = write_lines(tmp_path_factory.mktemp("known") / "known.jsonl", lines)
    return T.run_trace(path, CFG, program="sim", cold=True)


def test_known_trace_counts_add_up(known):
    f = known
    assert (f["program"], f["clock"], f["format"], f["requests"], f["sessions"]) == ("sim", "modelled", "marconi", 6, 2)
    assert f["requests_failed"] == 0 and f["forced_outputs"] == 6
    assert f["cycles"] > 0 and f["cycles_per_s"] > 0  # the replay's speed, a benchmark figure
    assert f["prompt_tokens"] == 2 * (201 + 225 + 249)
    assert f["generated_tokens"] == 6 * 4  # ignore_eos: exactly num_output_tokens each
    assert f["prefill_tokens"] + f["reused_tokens"] == f["prompt_tokens"]
    assert f["cold_prefill_tokens"] == f["prompt_tokens"] and f["cold_cache_disabled"] is True
    assert 0 <= f["cached_tokens"] <= f["upper_bound_tokens"]
    assert f["outputs_identical"] is True  # reuse never changes a token
    assert f["ttft_mean_s"] > 0 and f["cold_ttft_mean_s"] > 0


def test_obs4_known_trace_reports_completion_time_and_max_gap_cached_and_cold(known):
    """OBS-4 beside TTFT: completion time and the largest inter-token gap, p50 <= p99, for both
    runs; a request finishes no earlier than its first token, and gaps are never negative."""
    f = known
    for run in ("", "cold_"):
        for name in ("ttft", "completion", "max_gap"):
            p50, p99 = f[f"{run}{name}_p50_s"], f[f"{run}{name}_p99_s"]
            assert p50 is not None and 0 <= p50 <= p99, (run, name, p50, p99)
        assert f[f"{run}completion_p50_s"] >= f[f"{run}ttft_p50_s"]
        assert f[f"{run}completion_p99_s"] >= f[f"{run}ttft_p99_s"]
        assert f[f"{run}max_gap_p99_s"] <= f[f"{run}completion_p99_s"]


def test_known_trace_upper_bound():
    """The bound, by hand: a later turn shares its predecessor's whole prompt (its E goes on with
    output tokens the next prompt does not hold); the second session's first turn shares the
    200-token prefix with the first session's."""
    lines = []
    for s in range(2):
        prompt = SYSTEM + [2000 + s]
        for turn in range(2):
            lines.append(marconi_line(s, turn, turn + 0.1 * s, prompt, [1] * 4))
            prompt = prompt + [9] * 30
    outs = [T.Outcome(i, str(i // 2), tuple(r.prompt_ids), (1, 1, 1, 1)) for i, r in
            enumerate(T.parse_lines(lines).requests)]
    order = [outs[0], outs[2], outs[1], outs[3]]  # issue order: s0t0, s1t0, s0t1, s1t1
    assert T.offline_upper_bound(order) == 0 + 200 + 201 + 201


def test_known_trace_reuses_and_prefills_less_than_cold(known):
    f = known
    assert f["cold_cache_disabled"] is True
    assert f["cached_tokens"] > 0 and f["cache_hits"] > 0
    assert f["prefill_tokens"] < f["cold_prefill_tokens"]
    assert f["reuse_of_upper_bound_pct"] >= 50


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    path = tmp_path_factory.mktemp("agent") / "agent.jsonl"
    trace_gen.write(trace_gen.generate("agent", 6, 3, max_context=1024), str(path))
    return T.run_trace(str(path), CFG, program="sim", cold=True)


def test_agent_trace_replays_whole_and_identical_cached_and_cold(agent):
    f = agent
    assert f["format"] == "chat" and f["sessions"] == 6 and f["requests"] >= 12 and f["requests_failed"] == 0
    assert f["outputs_identical"] is True
    assert f["prefill_tokens"] + f["reused_tokens"] == f["prompt_tokens"]
    assert 0 < f["upper_bound_tokens"] < f["prompt_tokens"]
    assert 0 <= f["cached_tokens"] <= f["upper_bound_tokens"]


def test_agent_trace_reuses_across_tool_turns(agent):
    assert agent["reuse_pct"] > 20 and agent["prefill_cached_over_cold"] < 0.9


def _ninfer(*args):
    return subprocess.run([sys.executable, "-m", "ninfer_jax.cli", *args], capture_output=True, text=True,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=300)


def test_ninfer_trace_command_prints_one_json_object(tmp_path):
    path = write_lines(tmp_path / "t.jsonl", [marconi_line("a", 0, 0, [1, 2, 3] * 30, [4, 4]),
                                              marconi_line("a", 1, 1, [1, 2, 3] * 40, [4, 4])])
    out = _ninfer("trace", path, "--program=sim", "--json", "--max_concurrency=2", "--max_context=512")
    assert out.returncode == 0, out.stderr
    f = json.loads(out.stdout)
    assert f["requests"] == 2 and f["prompt_tokens"] == 210 and f["outputs_identical"] is True
    assert f["completion_p50_s"] <= f["completion_p99_s"] and f["cold_max_gap_p99_s"] >= 0
    assert f["upper_bound_tokens"] == 90 and "[trace]" in out.stderr and "[trace]" not in out.stdout
    one = T.run_trace(path, CFG, program="sim", cold=False, limit=1)
    assert one["requests"] == 1 and "cold_ttft_mean_s" not in one


def test_ninfer_trace_errors(tmp_path):
    from absl import flags

    from ninfer_jax import cli

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
    assert cli.cmd_trace([]) == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": "x"}\n')
    assert cli.cmd_trace([str(bad)]) == 2
    assert cli.cmd_trace([str(tmp_path / "none.jsonl")]) == 2


def test_a_turn_extending_the_previous_prompt_and_output_reuses_e(tmp_path):
    """Recorded outputs are replayed (forced), so request 2, which extends request 1's prompt
    and output, binds at E: every token but the last output one is served from the cache."""
    p1, out1 = list(range(100, 400)), [7, 8, 9, 10, 11]
    p2 = p1 + out1 + [20, 21, 22]
    path = write_lines(tmp_path / "e.jsonl", [marconi_line(0, 0, 0.0, p1, out1), marconi_line(0, 1, 1.0, p2, [3])])
    f = T.run_trace(path, CFG, program="sim", cold=False)
    assert f["forced_outputs"] == 2 and f["generated_tokens"] == len(out1) + 1
    assert f["cached_tokens"] == len(p1) + len(out1) - 1
