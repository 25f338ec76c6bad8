"""`ninfer bench scanmix`: what one-off requests cost long conversations' reuse (issue 40).

    ninfer bench scanmix [--json] [-- --sessions=40 --mix=1 --kinds=agent,chat --pcts=10,20,30 --seed=0]

Conversations (trace_gen `agent` or `chat`, --sessions sessions) are replayed twice on the
cost-model Program with the built-in model's geometry, C = 1, no Host arena, with the same pools:
alone, and mixed with one-turn requests (`trace_gen.one_off_lines`: a system prompt and a
question each, sharing nothing with anything), --mix of them per conversation request, at
uniform times over the conversations' span. The pools are each --pcts share of the
conversations' own working set (`optimum_bench.working_set_bytes`), split by the default rule;
both runs use the plan made for the conversations alone (the one-offs are shorter, so the mix
changes nothing of it). The figure: the conversations' prompt tokens served from the cache with
the mix ÷ without; the target is ≥ 0.95 (the mix costs them at most 5 % of their reuse).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time

TARGET = 0.95


def _parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="ninfer bench scanmix")
    ap.add_argument("--sessions", type=int, default=40)
    ap.add_argument("--mix", type=float, default=1.0, help="one-turn requests per conversation request")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kinds", default="agent,chat", help="trace_gen conversation kinds, comma-separated")
    ap.add_argument("--pcts", default="10,20,30", help="cache sizes in percent of the conversations' working set")
    ap.add_argument("--chunk_size", type=int, default=256)
    a = ap.parse_args(argv)
    if a.sessions < 1 or a.mix < 0:
        ap.error("--sessions must be >= 1 and --mix >= 0")
    return a


def _served(run) -> dict:
    """The conversations' requests of a run: prompt tokens, those served from the cache, failures."""
    conv = [o for o in run.outcomes if not o.session.startswith("oneoff-")]
    return {"requests": len(conv), "prompt_tokens": sum(len(o.prompt_ids) for o in conv),
            "cached_tokens": sum(o.cached_tokens for o in conv),
            "failed": sum(o.finish_reason == "error" for o in conv),
            "one_offs": len(run.outcomes) - len(conv)}


def _kind(kind: str, args, folder: str, pcts: list[float]) -> list[dict]:
    from ninfer_jax import ContextCacheConfig
    from ninfer_jax.bench import trace as T
    from ninfer_jax.bench import trace_gen
    from ninfer_jax.bench.optimum_bench import _config, working_set_bytes
    from ninfer_jax.bench.trace_sweep import cache_budgets
    from ninfer_jax.sim import SimProgram

    conv_lines = trace_gen.generate(kind, args.sessions, seed=args.seed)
    t_end = max(line["ts"] for line in conv_lines) + 1.0
    ones = trace_gen.one_off_lines(round(args.mix * len(conv_lines)), args.seed + 1, t_end)
    mixed_lines = sorted(conv_lines + ones, key=lambda line: (line["ts"], line["session"], line["turn"]))
    traces = {}
    for name, lines in (("alone", conv_lines), ("mixed", mixed_lines)):
        path = os.path.join(folder, f"{kind}-{name}.jsonl")
        trace_gen.write(lines, path)
        traces[name] = T.load_trace(path)
    config = _config(args.chunk_size)
    roomy = dataclasses.replace(config, context_cache=ContextCacheConfig())
    run, _ = T.replay_once(roomy, "sim", traces["alone"], f"{kind} working set")
    model, itemsize = SimProgram.geometry(config)
    ws = working_set_bytes(run.outcomes, model.kv_bytes_per_token(itemsize) * 64, model.state_image_bytes(itemsize))
    rows = []
    for pct in pcts:
        budget = int(pct / 100 * ws["bytes"])
        plan = cache_budgets(traces["alone"], config, cache_device_bytes=budget)[0]
        cfg = dataclasses.replace(config, max_context=plan.max_context)
        got = {}
        for name in ("alone", "mixed"):
            r, _ = T.replay_once(cfg, "sim", traces[name], f"{kind} {pct:g}% {name}", plan=plan)
            got[name] = _served(r)
        a, m = got["alone"]["cached_tokens"], got["mixed"]["cached_tokens"]
        rows.append({"kind": kind, "pct": pct, "cache_device_bytes": budget, "state_slots": plan.state_slots,
                     "kv_pages": plan.kv_pages, "conversation_requests": got["alone"]["requests"],
                     "one_offs": got["mixed"]["one_offs"], "prompt_tokens": got["alone"]["prompt_tokens"],
                     "cached_alone": a, "cached_mixed": m, "mixed_over_alone": round(m / a, 3) if a else None,
                     "failed": got["alone"]["failed"] + got["mixed"]["failed"]})
        print(f"[scanmix] {kind} {pct:g}%: conversations' cached tokens {a:,} alone, {m:,} mixed "
              f"({rows[-1]['mixed_over_alone']})", file=sys.stderr)
    return rows


def run(argv: list[str]) -> dict:
    args = _parse(argv)
    pcts = [float(p) for p in args.pcts.split(",") if p.strip()]
    start = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory(prefix="ninfer-scanmix-") as folder:
        for kind in (k.strip() for k in args.kinds.split(",") if k.strip()):
            rows += _kind(kind, args, folder, pcts)
    ratios = [r["mixed_over_alone"] for r in rows if r["mixed_over_alone"] is not None]
    return {"sessions": args.sessions, "mix": args.mix, "seed": args.seed, "max_concurrency": 1, "program": "sim",
            "host_capacity_bytes": 0, "rows": rows, "worst_mixed_over_alone": min(ratios, default=None),
            "target_mixed_over_alone": TARGET, "seconds": round(time.perf_counter() - start, 1)}


def text(figures: dict) -> str:
    head = ("trace", "% of working set", "slots / pages", "conversation requests / one-offs",
            "cached alone", "cached mixed", "mixed ÷ alone")
    lines = [f"ninfer bench scanmix: {figures['sessions']} sessions, {figures['mix']:g} one-off per conversation "
             f"request (seed {figures['seed']}), C = 1, cost-model Program, built-in geometry, no Host arena", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in figures["rows"]:
        lines.append(f"| {r['kind']} | {r['pct']:g} | {r['state_slots']} / {r['kv_pages']} | "
                     f"{r['conversation_requests']} / {r['one_offs']} | {r['cached_alone']:,} | {r['cached_mixed']:,} | "
                     f"{r['mixed_over_alone']} |")
    lines += ["", f"worst mixed ÷ alone {figures['worst_mixed_over_alone']} (target {figures['target_mixed_over_alone']}); "
                  f"{figures['seconds']} s"]
    return "\n".join(lines)
