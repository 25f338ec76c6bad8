"""The cache figures of `ninfer bench ledger` and the replay harness run (tiny sizes here)."""
from __future__ import annotations

from ninfer_jax.bench import cache_replay, ledger_bench


def test_bench_ledger_reports_source_select_and_reclaim_quote_figures():
    figures = ledger_bench.run(["--pages", "1024", "--objects", "300", "--extents", "200", "--cycles", "20",
                                "--quotes", "3"])
    for key in ("source_select_us_p50", "source_select_us_p99", "reclaim_quote_us_p50", "reclaim_quote_us_p99"):
        assert figures[key] > 0, key
    assert figures["cache_records"] == 300 and figures["reclaim_actions"] >= 300


def test_replay_harness_reports_reuse_against_the_offline_upper_bound():
    res = cache_replay.run(["--sessions", "4", "--turns", "3"])
    assert res["requests"] == 12 and res["upper_bound_tokens"] > 0
    rows = {r["capacity"]: r for r in res["rows"]}
    assert rows["large"]["reused_tokens"] <= res["upper_bound_tokens"]
    assert rows["tiny"]["reused_tokens"] <= rows["large"]["reused_tokens"]
    assert rows["large"]["of_upper_bound_pct"] > 90
