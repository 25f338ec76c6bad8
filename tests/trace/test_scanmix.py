"""`ninfer bench scanmix` (issue 40): one-turn requests mixed into conversations, and what they
cost the conversations' reuse at the same pools."""
from ninfer_jax.bench import scanmix_bench, trace_gen


def test_one_offs_share_nothing_and_follow_the_seed():
    lines = trace_gen.one_off_lines(6, seed=3, t_end=50.0)
    assert lines == trace_gen.one_off_lines(6, seed=3, t_end=50.0)
    assert [line["session"] for line in lines] == [f"oneoff-{i:04d}" for i in range(6)]
    assert all(line["turn"] == 0 and 0 <= line["ts"] < 50.0 for line in lines)
    systems = [line["messages"][0]["content"] for line in lines]
    assert len(set(systems)) == 6  # each its own system prompt: nothing to reuse


def test_bench_replays_the_same_conversations_alone_and_mixed():
    f = scanmix_bench.run(["--sessions=4", "--kinds=agent", "--pcts=30", "--mix=1"])
    (row,) = f["rows"]
    assert row["one_offs"] == row["conversation_requests"] > 0 and row["failed"] == 0
    assert 0 < row["cached_alone"] <= row["prompt_tokens"] and 0 <= row["cached_mixed"] <= row["prompt_tokens"]
    assert row["mixed_over_alone"] == round(row["cached_mixed"] / row["cached_alone"], 3)
    assert f["worst_mixed_over_alone"] == row["mixed_over_alone"]
    assert "| agent | 30 |" in scanmix_bench.text(f)
    none = scanmix_bench.run(["--sessions=4", "--kinds=agent", "--pcts=30", "--mix=0"])["rows"][0]
    assert none["one_offs"] == 0 and none["cached_mixed"] == none["cached_alone"]  # no mix: the same run
