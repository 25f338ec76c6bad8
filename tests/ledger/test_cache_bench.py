"""The cache figures of `ninfer bench ledger` and the replay harness run (tiny sizes here)."""
from __future__ import annotations

from ninfer_jax.bench import cache_replay, ledger_bench


def test_bench_ledger_reports_source_select_and_reclaim_quote_figures():
    figures = ledger_bench.run(["--pages", "1024", "--objects", "300", "--extents", "200", "--cycles", "20",
                                "--quotes", "3", "--scaling", "300,900", "--scale-quotes", "8",
                                "--reference-max", "300"])
    for key in ("source_select_us_p50", "source_select_us_p99", "reclaim_quote_us_p50", "reclaim_quote_us_p99",
                "reclaim_quote_reference_us_p50"):
        assert figures[key] > 0, key
    assert figures["cache_records"] == 300 and figures["reclaim_actions"] >= 300
    small, large = figures["scaling"]
    assert 250 <= small["checkpoints"] <= 300 and 850 <= large["checkpoints"] <= 900
    for entry in (small, large):
        for key in ("records", "reclaim_quote_us_p50", "reclaim_quote_us_p99", "source_select_us_p50", "cycle_us_p50"):
            assert entry[key] > 0, key
        assert entry["reclaim_chosen_per_quote"] > 0  # the mix's quotes really pick victims
    assert small["reference_matches"] is True  # the old path, side by side, selects the same
    assert "reclaim_quote_reference_us_p50" not in large and "skipped" in large["reclaim_quote_reference"]


def test_replay_harness_reports_reuse_against_the_offline_upper_bound():
    res = cache_replay.run(["--sessions", "4", "--turns", "3"])
    assert res["requests"] == 12 and res["upper_bound_tokens"] > 0
    rows = {r["capacity"]: r for r in res["rows"]}
    assert rows["large"]["reused_tokens"] <= res["upper_bound_tokens"]
    assert rows["tiny"]["reused_tokens"] <= rows["large"]["reused_tokens"]
    assert rows["large"]["of_upper_bound_pct"] > 90
