"""`ninfer trace`: replay a multi-turn trace through the engine and report context reuse.

    ninfer trace FILE [--program=model|sim] [--trace_format=auto|chat|marconi] [--json] ...

The trace runs twice on fresh engines with the same settings: once with the context cache on,
once with it off (`ContextCacheConfig(enabled=False)`: the cold baseline). The cold engine's
Program is fresh (empty pools, stores and ledger) but shares the model loaded and the steps
compiled for the first run, so the model is loaded and compiled once. The figures
(docs/trace.md): prompt tokens served from the cache against the offline upper bound
(`cache_replay.upper_bound` over the prompts and outputs this run produced), prefill and replay
tokens, H2D/D2H bytes, cache hits, and per-request latency cached vs cold (OBS-4): time to first
token, completion time and the largest inter-token gap, on the Program's clock (modelled seconds
on the cost-model Program, wall seconds on the real model). Outputs of
the two runs are compared token for token: reuse must never change a token (doctrine 1).

The command's parts, each in its own module that imports only those named before it:
`trace_formats.py` parses and checks the trace; `trace_replay.py` drives one engine through it
(`Replayer`, which also says how requests are scheduled); `trace_figures.py` turns the runs into
figures (with `stats.py`); `trace_sweep.py` sizes the pools from one cache byte budget and
compares the splits of a sweep; `trace_report.py` writes the --report folder. This module
builds the engines and runs the command (`run_trace`); the names the CLI and the tests use are
importable from it.
"""
from __future__ import annotations

import dataclasses
import os
import sys

from ninfer_jax.bench.trace_figures import figures, offline_upper_bound, outputs_differing, too_long
from ninfer_jax.bench.trace_formats import (
    FORMATS,
    MOONCAKE_BLOCK,
    Trace,
    TraceError,
    TraceRequest,
    check_vocab,
    load_trace,
    longest_request,
    mooncake_block,
    parse_lines,
    request_tokens,
)
from ninfer_jax.bench.trace_replay import (
    GC_YOUNG,
    MAX_SAMPLES,
    SAMPLE_EVERY,
    Outcome,
    Replayer,
    RunResult,
    assistant_message,
)
from ninfer_jax.bench.trace_report import write_report, write_sweep_report
from ninfer_jax.bench.trace_sweep import (
    SWEEP_COLUMNS,
    SWEEP_DECIDES,
    best_of_sweep,
    cache_budgets,
    check_cache_flags,
    parse_split_sweep,
    sweep_figures,
    sweep_rows,
    sweep_text,
)


__all__ = [  # the command's names and those it gathers from its parts (the CLI's and the tests' imports)
    "FORMATS", "GC_YOUNG", "MAX_SAMPLES", "MOONCAKE_BLOCK", "SAMPLE_EVERY", "SWEEP_COLUMNS", "SWEEP_DECIDES",
    "Outcome", "Replayer", "RunResult", "Trace", "TraceError", "TraceRequest",
    "assistant_message", "best_of_sweep", "cache_budgets", "check_cache_flags", "check_vocab", "cold_config",
    "figures", "load_trace", "longest_request", "make_engine", "mooncake_block", "offline_upper_bound",
    "outputs_differing", "parse_lines", "parse_split_sweep", "pool_sizes", "replay_once", "request_tokens",
    "run_trace", "sweep_figures", "sweep_rows", "sweep_text", "too_long",
]

# ---- engines and the two runs ---------------------------------------------------------------------
def make_engine(config, program: str, share=None, cost: str | None = None, plan=None):
    """A manually stepped engine on the real model or the cost-model Program. `share`: a real
    model Program whose loaded model and compiled steps the new engine reuses (loaded and
    compiled once for both runs); its pools, stores, ledger and cache are its own. `plan`: the
    `CapacityPlan` the cost-model Program builds its pools from instead of the device solve
    (--cache_device_bytes: `cache_budgets`)."""
    from ninfer_jax import Engine

    if program == "sim":
        from ninfer_jax.sim import SimProgram

        config = dataclasses.replace(config, progress=False)
        return Engine(config, program=SimProgram.for_model(config, cost, plan=plan), start=False)
    if plan is not None:
        from ninfer_jax.errors import ConfigError

        raise ConfigError("cache_device_bytes", "sizes the cost-model Program's pools: it needs --program=sim")
    if cost is not None:
        from ninfer_jax.errors import ConfigError

        raise ConfigError("cost", "sets the cost-model Program's costs: it needs --program=sim")
    if program != "model":
        raise ValueError(f"--program must be 'model' or 'sim', got {program!r}")
    if share is None:
        return Engine(config, start=False)
    from ninfer_jax.program.program import Program

    return Engine(config, program=Program(config, model=share.model, steps=share.steps), start=False)


def cold_config(config):
    """The same config with the context cache off, or None where this build cannot turn it off."""
    try:
        return dataclasses.replace(config, context_cache=dataclasses.replace(config.context_cache, enabled=False))
    except TypeError:
        return None


class _Shared:
    """What a later run may reuse of an earlier one's Program: the model and its compiled steps
    (not the Program itself, whose pools are freed with it)."""

    def __init__(self, program):
        self.model, self.steps = program.model, program.steps


def replay_once(config, program: str, trace: Trace, label: str, share: _Shared | None = None,
                cost: str | None = None, plan=None, **kw) -> tuple[RunResult, _Shared | None]:
    """One run on a fresh engine; returns its result and, on the real model, what the next run
    can reuse."""
    engine = make_engine(config, program, share, cost, plan)
    try:
        check_vocab(trace, engine.program.vocab_size, config.model)
        result = Replayer(engine, trace, concurrency=kw.pop("concurrency", None) or config.max_concurrency,
                          progress=label, max_context=config.max_context, **kw).run()
        sim_cost = getattr(engine.program, "cost", None)
        if hasattr(sim_cost, "as_dict"):  # the cost-model Program: what it priced the run with
            result.stats["sim_cost"] = dict(sim_cost.as_dict(), source=engine.program.cost_source)
        result.stats["pools"] = pool_sizes(engine.program)
        return result, (_Shared(engine.program) if program == "model" else None)
    finally:
        engine.close()


def pool_sizes(program) -> dict:
    """Each Device pool's units, unit bytes and bytes as the ledger sees them, and the Host
    arena's bytes (on `sim` with the built-in model every unit is one byte)."""
    state = getattr(program, "state", None)
    if state is None:
        return {}
    out: dict = {}
    for pid, pool in state.pools.items():
        spec = pool.spec
        out[pid] = {"units": spec.capacity, "unit_bytes": spec.unit_bytes, "bytes": spec.capacity * spec.unit_bytes}
    out["host_arena_bytes"] = state.arena.capacity
    return out


# ---- the command ---------------------------------------------------------------------------------
def run_trace(path, config, *, program: str = "model", fmt: str = "auto", cold: bool = True,
              limit: int | None = None, report: str | None = None, cache_device_bytes: int | None = None,
              split: float | None = None, split_sweep=None, skip_too_long: bool = False,
              max_context: int | None = None, name: str | None = None, **kw) -> dict:
    """Load (`path`: a file, or a parsed Trace), replay cached (and cold), and return the
    figures; `report`: a folder for the figures as JSON, PNG plots and a summary
    (bench/trace_report.py).

    `cache_device_bytes` (sim only): the pools get these bytes instead of the device solve,
    StateImage share `split` (None: the default rule), `max_context` (None: the trace's longest
    request, raised for CFG-6); `split_sweep`: replay at each of these shares and return
    `{"sweep": [...], "best_split": ...}`. `skip_too_long`: requests that cannot fit
    max_context are reported (`requests_too_long`) instead of replayed."""
    sweep = check_cache_flags(program, config, cache_device_bytes=cache_device_bytes, split=split,
                              split_sweep=split_sweep)
    trace = path if isinstance(path, Trace) else load_trace(path, fmt)
    name = name or (path if isinstance(path, str) else "trace")
    if limit:
        trace = dataclasses.replace(trace, requests=trace.requests[:limit], output_tokens=trace.output_tokens[:limit])
    budgets = [None]
    if cache_device_bytes is not None:
        budgets = cache_budgets(trace, config, cache_device_bytes=cache_device_bytes, split=split, split_sweep=sweep,
                                skip_too_long=skip_too_long, max_context=max_context,
                                default_max_tokens=kw.get("default_max_tokens", 32))
    print(f"[trace] {name}: {trace.format}, {trace.sessions} sessions, {len(trace.requests)} requests, "
          f"program={program}", file=sys.stderr)
    results = []
    for plan in budgets:
        share = plan.cache.split if plan is not None else None
        prefix = f"split {share:.4g}: " if sweep else ""
        if plan is not None:
            print(f"[trace] {prefix or 'cache: '}{plan.cache.text()}", file=sys.stderr)
        folder = report
        if report and sweep:
            folder = os.path.join(report, f"split_{share:.4g}")
        results.append(_run_budget(trace, config, plan, program=program, cold=cold, prefix=prefix,
                                   report=folder, skip_too_long=skip_too_long, **kw))
    if not sweep:
        return results[0]
    out = sweep_figures(results, cache_device_bytes)
    if report:
        written = write_sweep_report(report, out)
        print(f"[trace] sweep report: {len(written)} files in {report} (summary.md)", file=sys.stderr)
    return out


def _warn_failed(run: RunResult, prefix: str) -> None:
    """Failed requests are counted in the figures (`requests_failed`); say so on stderr too, with
    the first error, since a replay whose requests mostly fail answers nothing."""
    failed = [o for o in run.outcomes if o.finish_reason == "error"]
    if failed:
        print(f"[trace] {prefix}{len(failed):,} of {len(run.outcomes):,} requests failed; the first "
              f"(request {failed[0].index}): {failed[0].error} (--cache_device_bytes, --max_context or "
              f"--skip_too_long size the replay for the trace)", file=sys.stderr)


def _run_budget(trace: Trace, config, plan, *, program: str, cold: bool, prefix: str, report: str | None,
                skip_too_long: bool, **kw) -> dict:
    """The cached (and cold) run at one pool sizing (`plan`: the `CapacityPlan` of a cache byte
    budget, `cache_budgets`; or None for the device solve) and its figures, with the plan's split
    (`plan.cache`); the report written when asked."""
    extra = dict(kw, skip_too_long=skip_too_long, occupancy=bool(report))
    if plan is not None:
        config = dataclasses.replace(config, max_context=plan.max_context)
        extra["plan"] = plan
    hot, shared = replay_once(config, program, trace, f"{prefix}cached run", **dict(extra))
    cold_run, disabled = None, False
    if cold:
        cfg = cold_config(config)
        disabled = cfg is not None
        if cfg is None:
            print("[trace] this build cannot disable the cache: the cold run uses the same config", file=sys.stderr)
        # The cold run: a fresh Program (empty pools, cache off) on the model and compiled steps
        # the cached run loaded, so the model is loaded and compiled once.
        cold_run, _ = replay_once(cfg or config, program, trace, f"{prefix}cold run", share=shared, **dict(extra))
    out = figures(hot.trace, hot, cold_run, program=program, cold_disabled=disabled, max_context=config.max_context,
                  budget=plan.cache if plan is not None else None,
                  concurrency=kw.get("concurrency") or config.max_concurrency)
    _warn_failed(hot, prefix)
    if report:
        written = write_report(report, out, hot, cold_run)
        print(f"[trace] report: {len(written)} files in {report} (summary.md)", file=sys.stderr)
    return out
