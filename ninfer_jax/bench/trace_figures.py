"""The figures of one `ninfer trace` replay: reuse against its bound, latency, cached vs cold.

`figures` turns the cached run (and the cold run, when there is one) into the flat dict the
command prints (docs/trace.md): prompt tokens served from the cache against the offline upper
bound (`offline_upper_bound`: `cache_replay.upper_bound` over the prompts and outputs this run
produced), prefill and replay tokens, H2D/D2H bytes, cache hits, and per-request latency (OBS-4:
time to first token, completion time and the largest inter-token gap, p50 and p99 by
bench/stats.py) of both runs and their ratios. `outputs_differing` compares the two runs token
for token: reuse must never change a token (doctrine 1).
"""
from __future__ import annotations

from typing import Sequence

from ninfer_jax.bench.stats import percent, ratio, summary
from ninfer_jax.bench.trace_formats import Trace
from ninfer_jax.bench.trace_replay import Outcome, RunResult


def offline_upper_bound(outcomes: Sequence[Outcome], within_sessions: bool = False) -> int:
    """Prompt tokens reusable with unlimited capacity: for each request the longest prefix any
    earlier-issued request's prompt and output share (the ledger replay harness's bound);
    `within_sessions` counts only earlier requests of the same session."""
    from ninfer_jax.bench.cache_replay import upper_bound

    groups: dict[str, list[dict]] = {}
    for o in outcomes:
        if o.prompt_ids:
            groups.setdefault(o.session if within_sessions else "", []).append(
                {"tokens": o.prompt_ids, "output": o.output_ids})
    return sum(sum(upper_bound(reqs)) for reqs in groups.values())


def offline_optimum(outcomes: Sequence[Outcome], trace: Trace | None, pools: dict | None,
                    concurrency: int | None) -> dict:
    """The offline optimum's figures (`offline_optimum.py`): an upper bound of what any policy
    serves at these pools from the save points the requests offered, over the requests in the
    order they ran; only at C = 1 (its argument is sequential), else None."""
    keys = ("offline_optimum_tokens", "offline_optimum_pct", "reuse_of_offline_optimum_pct", "offline_optimum_method",
            "offline_optimum_seconds")
    if concurrency != 1 or not pools or "main_kv" not in pools or "state_slots" not in pools:
        return dict.fromkeys(keys)
    from ninfer_jax.bench.offline_optimum import OfflineRequest, capacities, with_branch_points
    from ninfer_jax.bench.offline_optimum import offline_optimum as solve

    raw = {r.index: r.prompt_ids is not None for r in trace.requests} if trace is not None else {}
    ok = [o for o in outcomes if o.prompt_ids]
    reqs = [OfflineRequest(o.prompt_ids, o.output_ids, saves=o.save_frontiers or None, raw=raw.get(o.index, False),
                           ran=o.finish_reason != "error") for o in ok]
    kv_pages, state_slots = capacities(pools)
    opt = solve(with_branch_points(reqs), kv_pages=kv_pages, state_slots=state_slots)
    cached, prompt = sum(o.cached_tokens for o in ok), sum(len(o.prompt_ids) for o in ok)
    return dict(zip(keys, (opt.tokens, percent(opt.tokens, prompt), percent(cached, opt.tokens), opt.method,
                           round(opt.seconds, 3))))


def _ttft(outcomes: Sequence[Outcome], prefix: str) -> dict:
    """TTFT mean, p50 and p99 over the requests that have a first token."""
    return summary((o.ttft_s for o in outcomes), f"{prefix}ttft", with_mean=True)


def _latency(outcomes: Sequence[Outcome], prefix: str) -> dict:
    """OBS-4 beside TTFT: completion time and the largest inter-token gap, p50 and p99 over the
    requests that have one (OBS-3: a low TTFT can hide a long gap after a pause)."""
    fig = {}
    for name, attr in (("completion", "completion_s"), ("max_gap", "max_gap_s")):
        fig.update(summary((getattr(o, attr) for o in outcomes), f"{prefix}{name}"))
    return fig


def too_long(outcomes: Sequence[Outcome], trace: Trace | None) -> list[dict]:
    """The requests --skip_too_long left out: index, session, turn and the tokens each needs."""
    turns = {r.index: r.turn for r in trace.requests} if trace is not None else {}
    return [{"index": o.index, "session": o.session, "turn": turns.get(o.index), "tokens": o.too_long_tokens}
            for o in sorted(outcomes, key=lambda o: o.index) if o.finish_reason == "too_long"]


def figures(trace: Trace, hot: RunResult, cold: RunResult | None, *, program: str, cold_disabled: bool,
            max_context: int | None = None, budget=None, concurrency: int | None = None) -> dict:
    """`budget`: the `ninfer_jax.plan.CacheSplit` the pools were sized by (--cache_device_bytes);
    `concurrency`: the replay's C (the offline optimum is figured at C = 1 only)."""
    ok = [o for o in hot.outcomes if o.prompt_ids]
    skipped = too_long(hot.outcomes, trace)
    prompt = sum(len(o.prompt_ids) for o in ok)
    cached = sum(o.cached_tokens for o in ok)
    bound = offline_upper_bound(hot.outcomes)
    s = hot.stats
    fig = {
        "program": program, "clock": hot.clock, "format": trace.format, "sessions": trace.sessions,
        "requests": len(trace.requests), "requests_failed": sum(o.finish_reason == "error" for o in hot.outcomes),
        "requests_too_long": len(skipped), "too_long_requests": skipped,
        **({"max_context": max_context} if max_context is not None else {}),
        **({"split": budget.split, "cache_budget": budget.as_dict()} if budget is not None else {}),
        **({"pools": s["pools"]} if s.get("pools") else {}),
        "forced_outputs": sum(1 for o in trace.output_tokens if o),
        "branch_points": s.get("branch_points", 0),
        "cycles": s.get("cycles", 0),
        "cycles_per_s": round(s.get("cycles", 0) / hot.seconds, 1) if hot.seconds else None,
        **({"sim_cost": s["sim_cost"]} if "sim_cost" in s else {}),
        "prompt_tokens": prompt, "cached_tokens": cached, "reuse_pct": percent(cached, prompt),
        "upper_bound_tokens": bound, "upper_bound_pct": percent(bound, prompt),
        "upper_bound_within_sessions_tokens": offline_upper_bound(hot.outcomes, within_sessions=True),
        "reuse_of_upper_bound_pct": percent(cached, bound),
        **offline_optimum(hot.outcomes, trace, s.get("pools"), concurrency),
        "prefill_tokens": s.get("prefill_tokens", 0), "replay_tokens": s.get("replay_tokens", 0),
        "reused_tokens": s.get("reused_tokens", 0), "cache_hits": s.get("cache_hits", 0),
        "h2d_bytes": s.get("h2d_bytes", 0), "d2h_bytes": s.get("d2h_bytes", 0),
        "generated_tokens": s.get("generated_tokens", 0), "compilations": s.get("compilations", 0),
        "mean_decode_rows": ratio(s.get("generated_tokens", 0), s.get("decode_steps", 0)),
        "pauses": s.get("pauses_replay", 0) + s.get("pauses_snapshot", 0),
    }
    fig.update(_ttft(hot.outcomes, ""))
    fig.update(_latency(hot.outcomes, ""))
    fig["seconds_cached_run"] = round(hot.seconds, 2)
    if cold is not None:
        fig["cold_cache_disabled"] = cold_disabled
        fig["cold_prefill_tokens"] = cold.stats.get("prefill_tokens", 0)
        fig["cold_replay_tokens"] = cold.stats.get("replay_tokens", 0)
        fig["cold_mean_decode_rows"] = ratio(cold.stats.get("generated_tokens", 0), cold.stats.get("decode_steps", 0))
        fig.update(_ttft(cold.outcomes, "cold_"))
        fig.update(_latency(cold.outcomes, "cold_"))
        fig["ttft_mean_cached_over_cold"] = ratio(fig["ttft_mean_s"], fig["cold_ttft_mean_s"])
        fig["ttft_p50_cached_over_cold"] = ratio(fig["ttft_p50_s"], fig["cold_ttft_p50_s"])
        fig["prefill_cached_over_cold"] = ratio(fig["prefill_tokens"], fig["cold_prefill_tokens"])
        fig["outputs_differing"] = outputs_differing(hot, cold)
        fig["outputs_identical"] = fig["outputs_differing"] == 0
        fig["seconds_cold_run"] = round(cold.seconds, 2)
    return fig


def outputs_differing(a: RunResult, b: RunResult) -> int:
    """Doctrine 1 over the whole trace: how many requests did not produce the same prompt and
    output tokens in both runs (0: reuse changed nothing)."""
    xa = {o.index: (o.prompt_ids, o.output_ids) for o in a.outcomes}
    xb = {o.index: (o.prompt_ids, o.output_ids) for o in b.outcomes}
    return sum(xa.get(i) != xb.get(i) for i in set(xa) | set(xb))
