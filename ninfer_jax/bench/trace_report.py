"""`ninfer trace ... --report=DIR`: the figures as JSON, PNG plots and a markdown summary.

Plots (matplotlib, the Agg backend: no display needed):
* `ttft_cdf.png`: the TTFT distribution of the cached run against the cold run;
* `reuse_by_turn.png`: the share of prompt tokens served from the cache, by turn index;
* `occupancy.png`: Main KV pages, StateImage slots and Host arena bytes by kind over the run
  (sampled every few engine cycles on the run's clock);
* `pauses.png`: pauses and resumes so far, over the run.
`summary.md` links them with the headline figures, the pools' sizes in bytes (Main KV pages,
StateImage slots, Host arena; with --cache_device_bytes the byte budget, the split used and the
`max_context` it gave) and the requests left out as too long (--skip_too_long);
`figures.json` holds every figure. A split sweep (`write_sweep_report`) writes one such report
per split in `split_<S>/`, and `sweep.json` and a `summary.md` comparing them.
"""
from __future__ import annotations

import json
import os

from ninfer_jax.bench.stats import cdf
from ninfer_jax.bench.trace_sweep import SWEEP_COLUMNS, sweep_rows


OPTIONAL = ("offline_optimum_tokens", "offline_optimum_pct", "reuse_of_offline_optimum_pct")  # None: left out (C > 1)


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _ttft_cdf(path: str, hot, cold) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    for run, label in ((hot, "cache on"), (cold, "cache off")):
        if run is None:
            continue
        ttfts = [o.ttft_s for o in run.outcomes if o.ttft_s is not None]
        if ttfts:
            xs, ys = cdf(ttfts)
            ax.step(xs, ys, where="post", label=label)
    ax.set_xlabel(f"TTFT (s, {hot.clock} clock)")
    ax.set_ylabel("share of requests")
    ax.set_title("Time to first token")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def reuse_by_turn(hot) -> list[dict]:
    """Per turn index: requests, prompt tokens, cached tokens and the cached share."""
    turns = {r.index: r.turn for r in hot.trace.requests} if hot.trace is not None else {}
    rows: dict[int, list[int]] = {}
    order = sorted(set(turns.values()))
    rank = {t: i for i, t in enumerate(order)}  # turn ids may be sparse: their rank is the index
    for o in hot.outcomes:
        if not o.prompt_ids:
            continue
        k = rank.get(turns.get(o.index, 0), 0)
        row = rows.setdefault(k, [0, 0, 0])
        row[0] += 1
        row[1] += len(o.prompt_ids)
        row[2] += o.cached_tokens
    return [{"turn": k, "requests": n, "prompt_tokens": p, "cached_tokens": c,
             "cached_pct": round(100.0 * c / p, 2) if p else 0.0} for k, (n, p, c) in sorted(rows.items())]


def _reuse_plot(path: str, rows: list[dict]) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.bar([r["turn"] for r in rows], [r["cached_pct"] for r in rows], color="tab:green")
    ax.set_xlabel("turn index in the session")
    ax.set_ylabel("prompt tokens from the cache (%)")
    ax.set_ylim(0, 100)
    ax.set_title("Reuse by turn")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _occupancy_plot(path: str, samples: list[dict], clock: str) -> None:
    plt = _plt()
    fig, axes = plt.subplots(3, 1, figsize=(7, 7), sharex=True)
    t = [s["t"] for s in samples]
    for ax, pool, label in ((axes[0], "main_kv", "Main KV pages"), (axes[1], "state_slots", "StateImage slots")):
        ax.plot(t, [s.get(f"pool_{pool}_used", 0) for s in samples], label="in use")
        total = samples[0].get(f"pool_{pool}_total") if samples else None
        if total:
            ax.axhline(total, color="grey", linestyle="--", linewidth=1, label=f"capacity {total:,}")
        ax.set_ylabel(label)
        ax.legend(loc="upper left", fontsize=8)
        ax.grid(alpha=0.3)
    kinds = sorted({k for s in samples for k in s if k.startswith("host_bytes_") and k not in
                    ("host_bytes_total", "host_bytes_used")})
    if kinds:
        axes[2].stackplot(t, [[s.get(k, 0) / 2 ** 20 for s in samples] for k in kinds],
                          labels=[k[len("host_bytes_"):] for k in kinds])
    total = samples[0].get("host_bytes_total") if samples else None
    if total:
        axes[2].axhline(total / 2 ** 20, color="grey", linestyle="--", linewidth=1, label="capacity")
    axes[2].set_ylabel("Host arena (MiB)")
    axes[2].set_xlabel(f"time ({clock} clock, s)")
    axes[2].legend(loc="upper left", fontsize=8)
    axes[2].grid(alpha=0.3)
    fig.suptitle("Pool occupancy over the cached run")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _pauses_plot(path: str, samples: list[dict], clock: str) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    t = [s["t"] for s in samples]
    for key, label in (("pauses_snapshot", "pauses (Snapshot)"), ("pauses_replay", "pauses (Replay)"),
                       ("resumes_snapshot", "resumes (Snapshot)"), ("resumes_replay", "resumes (Replay)")):
        ax.plot(t, [s.get(key, 0) for s in samples], label=label)
    ax.set_xlabel(f"time ({clock} clock, s)")
    ax.set_ylabel("count so far")
    ax.set_title("Pauses and resumes")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_report(folder: str, figures: dict, hot, cold) -> list[str]:
    """Write the report into `folder` (created); returns the paths written."""
    os.makedirs(folder, exist_ok=True)
    rows = reuse_by_turn(hot)
    out = dict(figures, reuse_by_turn=rows)
    written = []

    def path(name):
        p = os.path.join(folder, name)
        written.append(p)
        return p

    with open(path("figures.json"), "w") as f:
        json.dump(out, f, indent=1, sort_keys=True, default=str)
    _ttft_cdf(path("ttft_cdf.png"), hot, cold)
    _reuse_plot(path("reuse_by_turn.png"), rows)
    samples = getattr(hot, "samples", None) or []
    _occupancy_plot(path("occupancy.png"), samples, hot.clock)
    _pauses_plot(path("pauses.png"), samples, hot.clock)
    lines = [
        "# Trace replay", "",
        f"{figures.get('requests')} requests in {figures.get('sessions')} sessions ({figures.get('format')}), "
        f"program `{figures.get('program')}`, {hot.clock} clock.", "",
        "| figure | value |", "|---|---|",
    ]
    for key in ("prompt_tokens", "cached_tokens", "reuse_pct", "upper_bound_pct", "reuse_of_upper_bound_pct",
                "offline_optimum_tokens", "offline_optimum_pct", "reuse_of_offline_optimum_pct",
                "ttft_p50_s", "ttft_p99_s", "cold_ttft_p50_s", "cold_ttft_p99_s", "ttft_mean_cached_over_cold",
                "prefill_tokens", "replay_tokens", "h2d_bytes", "d2h_bytes", "forced_outputs", "outputs_identical",
                "max_context", "requests_too_long"):
        if key in figures and not (key in OPTIONAL and figures[key] is None):
            lines.append(f"| {key} | {figures[key]} |")
    lines += capacity_lines(figures)
    lines += too_long_lines(figures)
    lines += ["", "![TTFT](ttft_cdf.png)", "", "![Reuse by turn](reuse_by_turn.png)", "",
              "![Occupancy](occupancy.png)", "", "![Pauses](pauses.png)", "",
              "Every figure: [figures.json](figures.json).", ""]
    with open(path("summary.md"), "w") as f:
        f.write("\n".join(lines))
    return written


def _bytes(n) -> str:
    from ninfer_jax.plan import size

    return f"{n:,} B ({size(n)})" if isinstance(n, int) else "-"


def capacity_lines(figures: dict) -> list[str]:
    """The pools in bytes, and the cache byte budget and its split where one sized them."""
    pools = figures.get("pools") or {}
    lines = []
    if pools:
        lines += ["", "## Pools", "", "| pool | units | bytes each | bytes |", "|---|---|---|---|"]
        for pid, label in (("main_kv", "Main KV pages"), ("state_slots", "StateImage slots")):
            p = pools.get(pid)
            if p:
                lines.append(f"| {label} | {p['units']:,} | {_bytes(p['unit_bytes'])} | {_bytes(p['bytes'])} |")
        if "host_arena_bytes" in pools:
            lines.append(f"| Host arena | | | {_bytes(pools['host_arena_bytes'])} |")
    b = figures.get("cache_budget")
    if b:
        lines += ["", "## Cache byte budget", "",
                  f"{_bytes(b['cache_device_bytes'])} shared by the pools (--cache_device_bytes), split "
                  f"S = {b['split']:.4g} ({b['split_source']}): the StateImages hold {b['state_share']:.2%} of it.", "",
                  "| part | count | bytes each | bytes |", "|---|---|---|---|",
                  f"| StateImage slots ({b['basic_slots']} basic) | {b['state_slots']:,} | "
                  f"{_bytes(b['state_slot_bytes'])} | {_bytes(b['state_bytes'])} |",
                  f"| Main KV pages ({b['kv_tokens']:,} tokens; {b['kv_limited_by']}) | {b['kv_pages']:,} | "
                  f"{_bytes(b['kv_page_bytes'])} | {_bytes(b['kv_bytes'])} |",
                  f"| backend pools | | | {_bytes(b['backend_pool_bytes'])} |",
                  f"| unused | | | {_bytes(b['unused_bytes'])} |", "",
                  f"max_context {b['max_context']:,}: {b['max_context_source']}."]
    return lines


def too_long_lines(figures: dict, most: int = 50) -> list[str]:
    """The requests --skip_too_long left out, at most `most` of them listed."""
    rows = figures.get("too_long_requests") or []
    if not rows:
        return []
    lines = ["", f"## Requests too long ({len(rows)}, not replayed)", "",
             f"Each needs more than max_context = {figures.get('max_context')} tokens (prompt + output).", "",
             "| request | session | turn | tokens |", "|---|---|---|---|"]
    lines += [f"| {r['index']} | {r['session']} | {r['turn']} | {r['tokens']} |" for r in rows[:most]]
    if len(rows) > most:
        lines.append(f"| … {len(rows) - most} more in figures.json | | | |")
    return lines


def write_sweep_report(folder: str, sweep: dict) -> list[str]:
    """`sweep.json` (the sweep's figures) and a `summary.md` comparing the splits, beside the
    per-split reports already written in `split_<S>/`; returns the paths written."""
    os.makedirs(folder, exist_ok=True)
    written = [os.path.join(folder, "sweep.json"), os.path.join(folder, "summary.md")]
    with open(written[0], "w") as f:
        json.dump(sweep, f, indent=1, sort_keys=True, default=str)
    lines = ["# Split sweep", "",
             f"{sweep.get('requests')} requests in {sweep.get('sessions')} sessions ({sweep.get('format')}), program "
             f"`{sweep.get('program')}`: one cache byte budget of {_bytes(sweep['cache_device_bytes'])} replayed at "
             f"{len(sweep['sweep'])} StateImage shares. Best split: **{sweep['best_split']:.4g}** (by "
             f"`{sweep['best_by']}`).", "",
             "| " + " | ".join(SWEEP_COLUMNS) + " | report |", "|" + "---|" * (len(SWEEP_COLUMNS) + 1)]
    for row in sweep_rows(sweep):
        cells = ["-" if row[k] is None else f"{row[k]:.4g}" if isinstance(row[k], float) else str(row[k])
                 for k in SWEEP_COLUMNS]
        sub = f"split_{row['split']:.4g}"
        link = f"[{sub}]({sub}/summary.md)" if os.path.exists(os.path.join(folder, sub, "summary.md")) else "-"
        lines.append("| " + " | ".join(cells) + f" | {link} |")
    lines += ["", "Every figure of every split: [sweep.json](sweep.json).", ""]
    with open(written[1], "w") as f:
        f.write("\n".join(lines))
    return written
