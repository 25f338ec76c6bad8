"""`ninfer bench preempt` in its quick form on the cost-model Program: an overload of ~3× the
Main KV under every pause route (PAUSE-2), the OBS-4 figures per route, and every output equal
to a cold uncontended run (doctrine 1, PAUSE-5); a mismatch or an engine error is reported,
never hidden. Nothing here asserts on wall time."""
import json
import os
import subprocess
import sys

import pytest

from ninfer_jax.bench import preempt_bench
from ninfer_jax.sim.program import SimProgram

ROUTES = ("auto", "snapshot", "replay")
ROUTE_KEYS = ("error", "requests", "requests_done", "requests_failed", "completion_source", "total_s",
              "replay_tokens", "prefill_tokens", "snapshot_bytes", "pauses", "resumes", "pauses_replay",
              "pauses_snapshot", "resumes_replay", "resumes_snapshot", "snapshot_revocations",
              "recovery_permit_seconds", "h2d_bytes", "d2h_bytes", "outputs_equal", "outputs_differing",
              "outputs_differing_greedy", "outputs_differing_seeded", "differing_requests")
LATENCIES = ("completion", "ttft", "max_gap", "admitted")


@pytest.fixture(scope="module")
def quick():
    return preempt_bench.run(["--quick"])


def test_pause2_quick_preempt_bench_reports_every_route_on_the_sim_program(quick):
    f = quick
    assert f["bench"] == "preempt" and f["programs"] == ["sim"] and f["routes"] == list(ROUTES)
    load = f["load"]
    assert load["kv_pages"] == load["cfg6_min_pages"] + 2  # just above the CFG-6 minimum
    assert load["overload"] >= 3.0 and load["tokens"] >= 3 * load["kv_capacity_tokens"]
    assert load["greedy"] > 0 and load["seeded"] > 0 and load["greedy"] + load["seeded"] == load["requests"]
    sim = f["sim"]
    assert sim["clock"] == "modelled" and sim["reference"]["error"] is None
    assert sim["reference"]["pauses"] == 0  # the reference is uncontended
    for route in ROUTES:
        r = sim[route]
        assert r["error"] is None, (route, r["error"])
        assert set(ROUTE_KEYS) <= set(r), set(ROUTE_KEYS) - set(r)
        assert r["passes"] == sim["repeats"] == 1  # the cost-model Program is deterministic: one pass
        assert r["requests_done"] == load["requests"] and r["requests_failed"] == 0
        assert r["runs_same_counters"] is True and r["completion_source"] in ("engine", "bench")
        for name in LATENCIES:
            assert 0 <= r[f"{name}_p50_s"] <= r[f"{name}_p99_s"], (route, name)
        assert r["ttft_p99_s"] <= r["completion_p99_s"] <= r["total_s"]
        assert r["max_gap_p99_s"] <= r["completion_p99_s"]
        # The overload preempts, and every paused request came back (it finished).
        assert r["pauses"] >= 1 and r["pauses"] == r["pauses_replay"] + r["pauses_snapshot"]
        assert r["resumes"] == r["pauses"]
        assert r["generated_tokens"] == load["requests"] * load["max_tokens"]  # PAUSE-5: nothing resampled
        assert r["outputs_equal"] is True and r["outputs_differing"] == 0, (route, r["differing_requests"])
    assert f["outputs_equal"] is True
    ratios = sim["snapshot_over_replay"]
    assert set(ratios) == {"completion_p99", "ttft_p99", "max_gap_p99", "total"}
    assert all(v is not None and v > 0 for v in ratios.values()), ratios
    assert isinstance(sim["routes_same_pause_counters"], bool)
    json.dumps(f)


def test_preempt_bench_text_names_every_route_and_the_ratios(quick):
    out = preempt_bench.text(quick)
    assert "sim (modelled s" in out and "snapshot ÷ replay" in out
    for route in ROUTES:
        assert route in out
    assert "outputs equal to the cold uncontended run: yes" in out


def test_passes_repeat_on_one_engine_cleared_between_them():
    """Two timed passes per route on the same engine, `clear_cache()` and an integrity check of the
    idle engine between them (doctrine 2); the second pass runs the same lengths with other ids
    and seeds, checked against its own cold reference, and schedules exactly like the first."""
    f = preempt_bench.run(["--quick", "--routes", "replay", "--repeats", "2"])
    r = f["sim"]["replay"]
    assert r["error"] is None and r["passes"] == 2 and r["requests_done"] == 2 * f["load"]["requests"]
    assert r["runs_same_counters"] is True and r["outputs_equal"] is True
    first, second = r["total_s_runs"]
    assert second == pytest.approx(first, rel=1e-6) and r["total_s"] == pytest.approx(first, rel=1e-6)


def test_doctrine1_a_changed_token_is_reported_not_hidden(monkeypatch):
    """Contended runs (C > 1) that draw other tokens than the reference: outputs_equal is false
    and the differing requests are named."""
    logits = SimProgram._logits

    def skewed(self, token, position):
        return logits(self, token + (self.config.max_concurrency > 1), position)

    monkeypatch.setattr(SimProgram, "_logits", skewed)
    f = preempt_bench.run(["--quick", "--routes", "replay"])
    r = f["sim"]["replay"]
    assert r["error"] is None and r["outputs_equal"] is False and f["outputs_equal"] is False
    assert r["outputs_differing"] == f["load"]["requests"] == len(r["differing_requests"])
    assert r["outputs_differing_greedy"] == f["load"]["greedy"]


def test_an_engine_error_is_reported_with_the_figures_so_far(monkeypatch):
    decode = SimProgram.decode
    calls = {"n": 0}

    def failing(self, rows):
        if self.config.max_concurrency > 1:
            calls["n"] += 1
            if calls["n"] == 40:
                raise RuntimeError("device lost")
        return decode(self, rows)

    monkeypatch.setattr(SimProgram, "decode", failing)
    f = preempt_bench.run(["--quick", "--routes", "snapshot,replay"])
    snap, rep = f["sim"]["snapshot"], f["sim"]["replay"]
    # The engine may raise, or fail the requests itself (its failure cleanup): either is reported.
    assert "device lost" in " ".join([snap["error"] or ""] + snap["request_errors"])
    assert snap["outputs_equal"] is False
    assert rep["error"] is None and rep["outputs_equal"] is True  # the next configuration still runs
    if snap["error"]:
        assert all(v is None for v in f["sim"]["snapshot_over_replay"].values())  # no ratio of a broken run
    assert f["outputs_equal"] is False
    assert "ERROR" in preempt_bench.text(f)


def test_ninfer_bench_preempt_quick_prints_one_json_object():
    out = subprocess.run([sys.executable, "-m", "ninfer_jax.cli", "bench", "preempt", "--quick", "--json"],
                         capture_output=True, text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=600)
    assert out.returncode == 0, out.stderr
    f = json.loads(out.stdout)
    assert f["programs"] == ["sim"] and set(ROUTES) <= set(f["sim"]) and "outputs_equal" in f
    assert "[bench preempt]" in out.stderr and "[bench preempt]" not in out.stdout
