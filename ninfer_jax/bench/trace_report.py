"""`ninfer trace ... --report=DIR`: the figures as JSON, PNG plots and a markdown summary.

Plots (matplotlib, the Agg backend: no display needed):
* `ttft_cdf.png`: the TTFT distribution of the cached run against the cold run;
* `reuse_by_turn.png`: the share of prompt tokens served from the cache, by turn index;
* `occupancy.png`: Main KV pages, StateImage slots and Host arena bytes by kind over the run
  (sampled every few engine cycles on the run's clock);
* `pauses.png`: pauses and resumes so far, over the run.
`summary.md` links them with the headline figures; `figures.json` holds every figure.
"""
from __future__ import annotations

import json
import os
from typing import Sequence


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _cdf(values: Sequence[float]):
    xs = sorted(values)
    return xs, [(i + 1) / len(xs) for i in range(len(xs))]


def _ttft_cdf(path: str, hot, cold) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    for run, label in ((hot, "cache on"), (cold, "cache off")):
        if run is None:
            continue
        ttfts = [o.ttft_s for o in run.outcomes if o.ttft_s is not None]
        if ttfts:
            xs, ys = _cdf(ttfts)
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
                "ttft_p50_s", "ttft_p99_s", "cold_ttft_p50_s", "cold_ttft_p99_s", "ttft_mean_cached_over_cold",
                "prefill_tokens", "replay_tokens", "h2d_bytes", "d2h_bytes", "forced_outputs", "outputs_identical"):
        if key in figures:
            lines.append(f"| {key} | {figures[key]} |")
    lines += ["", "![TTFT](ttft_cdf.png)", "", "![Reuse by turn](reuse_by_turn.png)", "",
              "![Occupancy](occupancy.png)", "", "![Pauses](pauses.png)", "",
              "Every figure: [figures.json](figures.json).", ""]
    with open(path("summary.md"), "w") as f:
        f.write("\n".join(lines))
    return written
