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
