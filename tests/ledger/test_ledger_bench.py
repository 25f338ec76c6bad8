"""`ninfer bench ledger` runs (tiny sizes here) and reports the documented figures."""
from __future__ import annotations

import json

from ninfer_jax.bench import ledger_bench


def test_ledger_bench_small_run_reports_figures():
    figures = ledger_bench.run(["--pages", "2048", "--objects", "500", "--extents", "400", "--cycles", "50",
                                "--scaling", ""])
    for key in ("cycle_us_p50", "cycle_us_p99", "cycle_full_us_p50", "arena_alloc_us", "arena_free_us"):
        assert figures[key] > 0, key
    assert figures["live_objects"] == 500 and figures["rows"] == 8 and figures["scaling"] == []
    json.dumps(figures)


def test_ledger_bench_scaling_entry_matches_the_reference_with_room_and_with_a_full_host_arena():
    """One small `scaling` entry: the quote mix through the victim order chooses what the full
    enumeration chooses, with Host room and with a full Host arena (demotions need Host
    victims, RCL-5); the figures are there."""
    figures = ledger_bench.run(["--pages", "256", "--objects", "50", "--extents", "50", "--cycles", "5",
                                "--scaling", "400", "--scale-quotes", "16"])
    (entry,) = figures["scaling"]
    assert entry["reference_matches"] is True and entry["full_host_reference_matches"] is True
    assert entry["host_reference_matches"] is True
    assert entry["checkpoints"] >= 300 and entry["reclaim_quotes"] == 16
    for key in ("reclaim_quote_us_p99", "full_host_quote_us_p99", "host_quote_us_p50", "source_select_us_p50"):
        assert entry[key] > 0, key
