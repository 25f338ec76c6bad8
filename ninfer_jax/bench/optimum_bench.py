"""`ninfer bench optimum`: the engine's reuse against the offline optimum at small caches, C = 1.

    ninfer bench optimum [--json] [-- --sessions=50 --seed=0 --kinds=agent,chat,marconi --pcts=5,10,20,30]

For each trace_gen kind (`agent`; `chat`; `marconi`, whose agent sessions drop their past
reasoning at every turn and whose requests are retried one time in ten), `--sessions` sessions
are replayed on the cost-model Program with the built-in model's geometry, one request at a
time (C = 1), no Host arena, at each `--pcts` share of the trace's working set: that many bytes
of Device cache (`ninfer trace --cache_device_bytes`, the default split). Each row: the prompt
tokens served from the cache (reuse), the offline optimum at the same pools (an upper bound of
what any placement serves: bench/offline_optimum.py) and the infinite-cache bound
(`cache_replay.upper_bound`), and reuse as a share of each. A budget the engine refuses (a Main
KV below one max_context) is a row marked `cannot start` with the reason.

The working set is what keeps every object the trace makes: its distinct Main KV pages (a page
named by its tokens and all before it, so a branch inside a page makes two) and one StateImage
per distinct save point its requests offered (their save frontiers and ends E), at the
geometry's bytes, measured on a replay with room for all of it.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time

from ninfer_jax.bench.stats import percent

KINDS = ("agent", "chat", "marconi")
LABELS = {"agent": "agent", "chat": "chat", "marconi": "agent, thinking dropped (marconi)"}


def _parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="ninfer bench optimum")
    ap.add_argument("--sessions", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kinds", default=",".join(KINDS), help="trace_gen kinds, comma-separated")
    ap.add_argument("--pcts", default="5,10,20,30", help="cache sizes in percent of the working set")
    ap.add_argument("--chunk_size", type=int, default=256)
    ap.add_argument("--program", default="sim", choices=("sim",), help="the cost-model Program only")
    ap.add_argument("--quick", action="store_true", help="8 sessions")
    return ap.parse_args(argv)


def working_set_bytes(outcomes, page_bytes: int, state_bytes: int, page: int = 64) -> dict:
    """The bytes that keep every distinct page and save point the replay's requests made."""
    pages, points = set(), set()
    for o in outcomes:
        if not o.prompt_ids:
            continue
        seq = tuple(o.prompt_ids) + tuple(o.output_ids)[:-1]
        pages.update(seq[:min(j + page, len(seq))] for j in range(0, len(seq), page))
        points.update(seq[:f] for f in set(o.save_frontiers) | {len(seq)} if 0 < f <= len(seq))
    return {"pages": len(pages), "save_points": len(points),
            "bytes": len(pages) * page_bytes + len(points) * state_bytes}


def _config(chunk_size: int):
    from ninfer_jax import ContextCacheConfig, EngineConfig

    return EngineConfig(max_concurrency=1, chunk_size=chunk_size, progress=False,
                        context_cache=ContextCacheConfig(host_capacity_bytes=0))


def _kind(kind: str, args, folder: str, pcts: list[float]) -> list[dict]:
    from ninfer_jax import ContextCacheConfig
    from ninfer_jax.bench import trace as T
    from ninfer_jax.bench import trace_gen
    from ninfer_jax.errors import ConfigError
    from ninfer_jax.sim import SimProgram

    path = os.path.join(folder, f"{kind}.jsonl")
    trace_gen.write(trace_gen.generate(kind, args.sessions, seed=args.seed), path)
    config = _config(args.chunk_size)
    trace = T.load_trace(path)
    roomy = dataclasses.replace(config, context_cache=ContextCacheConfig())  # the default Host arena holds it all
    run, _ = T.replay_once(roomy, "sim", trace, f"{kind} working set")
    model, itemsize = SimProgram.geometry(config)
    ws = working_set_bytes(run.outcomes, model.kv_bytes_per_token(itemsize) * 64, model.state_image_bytes(itemsize))
    rows = []
    for pct in pcts:
        budget = int(pct / 100 * ws["bytes"])
        row = {"kind": kind, "label": LABELS.get(kind, kind), "pct": pct, "cache_device_bytes": budget,
               "working_set_bytes": ws["bytes"], "working_set_pages": ws["pages"],
               "working_set_save_points": ws["save_points"]}
        start = time.perf_counter()
        try:
            f = T.run_trace(trace, config, program="sim", cold=False, cache_device_bytes=budget, name=kind)
        except ConfigError as e:
            rows.append(dict(row, started=False, refused=str(e)))
            continue
        b = f["cache_budget"]
        rows.append(dict(row, started=True, state_slots=b["state_slots"], kv_pages=b["kv_pages"],
                         max_context=f["max_context"], requests=f["requests"], requests_failed=f["requests_failed"],
                         prompt_tokens=f["prompt_tokens"], cached_tokens=f["cached_tokens"],
                         offline_optimum_tokens=f["offline_optimum_tokens"],
                         upper_bound_tokens=f["upper_bound_tokens"],
                         reuse_of_offline_optimum=_ratio(f["cached_tokens"], f["offline_optimum_tokens"]),
                         reuse_of_upper_bound=_ratio(f["cached_tokens"], f["upper_bound_tokens"]),
                         optimum_of_upper_bound=_ratio(f["offline_optimum_tokens"], f["upper_bound_tokens"]),
                         reuse_pct=f["reuse_pct"], offline_optimum_method=f["offline_optimum_method"],
                         offline_optimum_seconds=f["offline_optimum_seconds"],
                         seconds=round(time.perf_counter() - start, 2)))
    return rows


def _ratio(a, b):
    return round(a / b, 3) if a is not None and b else None


def run(argv: list[str]) -> dict:
    args = _parse(argv)
    if args.quick:
        args.sessions = 8
    pcts = [float(p) for p in args.pcts.split(",") if p.strip()]
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    start = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory(prefix="ninfer-optimum-") as folder:
        for kind in kinds:
            print(f"[optimum] {kind}: {args.sessions} sessions, seed {args.seed}", file=sys.stderr)
            rows += _kind(kind, args, folder, pcts)
    started = [r for r in rows if r["started"]]
    worst = min((r["reuse_of_offline_optimum"] for r in started if r["reuse_of_offline_optimum"] is not None),
                default=None)
    return {"sessions": args.sessions, "seed": args.seed, "max_concurrency": 1, "program": "sim",
            "host_capacity_bytes": 0, "rows": rows, "worst_reuse_of_offline_optimum": worst,
            "target_reuse_of_offline_optimum": 0.9, "seconds": round(time.perf_counter() - start, 1)}


def text(figures: dict) -> str:
    """The rows as a markdown table (the CLI prints this without --json)."""
    head = ("trace", "% of working set", "slots / pages", "reuse (% of prompt)", "offline optimum",
            "infinite bound", "reuse ÷ optimum", "reuse ÷ bound")
    lines = [f"ninfer bench optimum: {figures['sessions']} sessions per trace (seed {figures['seed']}), C = 1, "
             f"cost-model Program, built-in geometry, no Host arena", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in figures["rows"]:
        if not r["started"]:
            lines.append(f"| {r['label']} | {r['pct']:g} | cannot start: {r['refused']} | | | | | |")
            continue
        lines.append(f"| {r['label']} | {r['pct']:g} | {r['state_slots']} / {r['kv_pages']} | "
                     f"{r['cached_tokens']:,} ({r['reuse_pct']}) | {r['offline_optimum_tokens']:,} | "
                     f"{r['upper_bound_tokens']:,} | {r['reuse_of_offline_optimum']} | {r['reuse_of_upper_bound']} |")
    lines += ["", f"worst reuse ÷ optimum {figures['worst_reuse_of_offline_optimum']} (target "
                  f"{figures['target_reuse_of_offline_optimum']}); {figures['seconds']} s"]
    return "\n".join(lines)
