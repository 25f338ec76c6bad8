"""One cache byte budget and its split: --cache_device_bytes, --split and --split_sweep.

On the cost-model Program the pools can be sized from one Device byte budget instead of the
device solve: `check_cache_flags` checks the flags before anything is loaded (ConfigError
naming the flag), `cache_budgets` gives the `ninfer_jax.plan.CapacityPlan` of each StateImage
share to replay (`plan_capacity` with `CacheBytes`, on the model's geometry and the trace's
longest request; the plan's `cache` is the split), and a sweep's
results are compared by `best_of_sweep` (most prompt tokens from the cache, SWEEP_DECIDES) and
laid out as rows of SWEEP_COLUMNS (`sweep_rows`), as text (`sweep_text`) or in the sweep report
(trace_report.py).
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

from ninfer_jax.bench.trace_formats import Trace, longest_request

SWEEP_DECIDES = "cached_tokens"  # the figure that picks best_split (docs/trace.md)


def parse_split_sweep(value) -> tuple[float | None, ...]:
    """--split_sweep: comma-separated StateImage shares in (0, 1), or `default` for the default
    rule's; ConfigError naming the flag for anything else (empty, repeated, out of range)."""
    from ninfer_jax.errors import ConfigError
    from ninfer_jax.plan import check_split

    items = value.split(",") if isinstance(value, str) else list(value)
    out: list[float | None] = []
    for item in items:
        if isinstance(item, str):
            item = item.strip()
            if item == "default":
                item = None
            else:
                try:
                    item = float(item)
                except ValueError:
                    raise ConfigError("split_sweep", f"expected comma-separated shares in (0, 1) or 'default', got "
                                                     f"{value!r}") from None
        if item is not None:
            item = check_split(item, "split_sweep")
        if item in out:
            raise ConfigError("split_sweep", f"{'default' if item is None else item} appears twice in {value!r}")
        out.append(item)
    if not out:
        raise ConfigError("split_sweep", "give at least one share, e.g. --split_sweep=0.1,0.25,0.5")
    return tuple(out)


def check_cache_flags(program: str, config, *, cache_device_bytes: int | None = None, split: float | None = None,
                      split_sweep=None) -> tuple[float | None, ...] | None:
    """The cache byte budget flags, checked before anything is loaded or replayed: ConfigError
    naming the flag. Returns the sweep's shares (None: no sweep)."""
    from ninfer_jax.errors import ConfigError
    from ninfer_jax.plan import check_cache_device_bytes, check_split

    sweep = None
    if split is not None and cache_device_bytes is None:
        raise ConfigError("split", "is the StateImage share of --cache_device_bytes: give --cache_device_bytes=N too")
    if split_sweep is not None:
        if cache_device_bytes is None:
            raise ConfigError("split_sweep", "replays one --cache_device_bytes budget at several splits: give "
                                             "--cache_device_bytes=N too")
        if split is not None:
            raise ConfigError("split_sweep", "give --split or --split_sweep, not both")
        sweep = parse_split_sweep(split_sweep)
    if cache_device_bytes is None:
        return None
    check_cache_device_bytes(cache_device_bytes)
    if program != "sim":
        raise ConfigError("cache_device_bytes", "sizes the cost-model Program's pools: it needs --program=sim (the "
                                                "real Program solves its pools from the device's memory)")
    if split is not None:
        check_split(split)
    for name, value in (("kv_capacity", config.kv_capacity),
                        ("device_state_slots", config.context_cache.device_state_slots),
                        ("device_memory_bytes", config.device_memory_bytes)):
        if value is not None:
            raise ConfigError(name, "is decided by --cache_device_bytes and its split (the device solve is "
                                    f"bypassed): leave --{name} unset")
    if config.speculative_tokens:  # refused by the cost-model Program; its plan would size no MTP pool
        raise ConfigError("speculative_tokens", "the cost-model Program does not model speculative decoding: use 0")
    return sweep


def cache_budgets(trace: Trace, config, *, cache_device_bytes: int, split: float | None = None,
                  split_sweep=None, skip_too_long: bool = False, max_context: int | None = None,
                  default_max_tokens: int = 32) -> list:
    """The `ninfer_jax.plan.CapacityPlan` of each split to replay (one without a sweep): the plan
    of `config` on the cost-model Program's geometry with the pools sharing `cache_device_bytes`
    (`plan_capacity(..., cache_bytes=CacheBytes(N))`; its `cache` is the split); max_context from
    `max_context` or the trace's longest request (plan.split_cache_bytes). ConfigError naming the
    flag when one cannot be split."""
    from ninfer_jax.plan import CacheBytes, plan_capacity
    from ninfer_jax.sim import SimProgram

    sweep = parse_split_sweep(split_sweep) if split_sweep is not None else None
    if max_context is not None and max_context != config.max_context:
        config = dataclasses.replace(config, max_context=max_context)  # --max_context is kept as given
    model, itemsize = SimProgram.geometry(config)
    longest = longest_request(trace, default_max_tokens)
    source = "--split_sweep" if sweep else None
    return [plan_capacity(config, model, itemsize, cache_bytes=CacheBytes(
                cache_device_bytes, split=s, split_source=source if s is not None else "default rule",
                max_context_given=max_context is not None, longest_request=longest[0] if longest else None,
                skip_too_long=skip_too_long))
            for s in (sweep or (split,))]


def best_of_sweep(results: Sequence[dict]) -> dict:
    """The split with the most prompt tokens served from the cache; ties: fewer requests too
    long, then the lower mean TTFT, then the smaller split."""
    def key(f):
        ttft = f.get("ttft_mean_s")
        return (f[SWEEP_DECIDES], -f.get("requests_too_long", 0), -(ttft if ttft is not None else float("inf")),
                -f["split"])

    return max(results, key=key)


def sweep_figures(results: Sequence[dict], cache_device_bytes: int) -> dict:
    best = best_of_sweep(results)
    first = results[0]
    common = {k: first[k] for k in ("program", "clock", "format", "sessions", "requests") if k in first}
    return dict(common, cache_device_bytes=cache_device_bytes, sweep=list(results), best_split=best["split"],
                best_by=SWEEP_DECIDES)


SWEEP_COLUMNS = ("split", "state_slots", "kv_pages", "max_context", "requests_too_long", "cached_tokens", "reuse_pct",
                 "reuse_of_upper_bound_pct", "reuse_of_offline_optimum_pct", "ttft_mean_s", "ttft_mean_cached_over_cold",
                 "h2d_bytes", "pauses")


def sweep_rows(sweep: dict) -> list[dict]:
    """One row per split of the sweep's headline figures (SWEEP_COLUMNS)."""
    rows = []
    for f in sweep["sweep"]:
        b = f.get("cache_budget", {})
        row = dict(f, state_slots=b.get("state_slots"), kv_pages=b.get("kv_pages"))
        rows.append({k: row.get(k) for k in SWEEP_COLUMNS})
    return rows


def sweep_text(sweep: dict) -> str:
    """The sweep as an aligned table and the best split (`ninfer trace --split_sweep` without --json)."""
    rows = sweep_rows(sweep)

    def cell(v):
        return "-" if v is None else f"{v:.4g}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else str(v)

    table = [list(SWEEP_COLUMNS)] + [[cell(r[k]) for k in SWEEP_COLUMNS] for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(SWEEP_COLUMNS))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in table]
    lines.append(f"best_split {sweep['best_split']:.4g} (by {sweep['best_by']}) of cache_device_bytes "
                 f"{sweep['cache_device_bytes']:,}; --json gives every figure of every split")
    return "\n".join(lines)
