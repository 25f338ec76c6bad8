"""Replay synthetic chat and agent sessions through the context-cache policy, no model.

    python -m ninfer_jax.bench.cache_replay [--sessions 24] [--turns 6] [--seed 0] [--json]

Workload (seeded): multi-turn chat sessions over a few shared system prompts (a shared marker at
the end of the system prompt, the input recovery point R at the end of each prompt, E at each
generation end), and agent sessions whose assistant turns carry reasoning and a tool call: the
next prompt drops the past reasoning (Qwen3-style), so it is no longer a token extension of the
cached E and only the input point R of the previous prompt still matches (SCN-1). Sessions
interleave at random; some requests are retries of the previous prompt.

For every capacity the ledger is driven by `ledger.simulate.CacheSim` (bind, chunked prefill
split at the semantic frontiers, captures, E, reclamation under pressure) and the harness
reports the prompt tokens taken from the cache against an offline upper bound: for each
request, the longest prefix any earlier request's tokens (prompt and output) share with it,
capacity ignored.
"""
from __future__ import annotations

import argparse
import bisect
import json
import random
import sys
import time

from ledger.cache_state import PointKind
from ledger.simulate import CacheSim, SavePoint, small_config

IM_START, IM_END, THINK, END_THINK, TOOL, END_TOOL = 1009, 1010, 1011, 1012, 1013, 1014


def _words(rng: random.Random, lo: int, hi: int) -> list[int]:
    return [rng.randrange(1, 1000) for _ in range(rng.randint(lo, hi))]


def workload(sessions: int, turns: int, seed: int) -> list[dict]:
    """A list of requests: tokens, save points, output tokens, session."""
    rng = random.Random(seed)
    systems = [[IM_START] + _words(rng, 200, 400) + [IM_END] for _ in range(3)]
    state = []
    for s in range(sessions):
        agent = s % 2 == 1
        state.append({"id": s, "agent": agent, "sys": rng.randrange(3), "msgs": [], "turn": 0})
    reqs = []
    live = list(range(sessions))
    while live:
        s = rng.choice(live)
        st = state[s]
        sys_toks = systems[st["sys"]]
        if st["turn"] > 0 and rng.random() < 0.1:  # a retry of the last prompt: same input, new output
            prompt = st["last_prompt"]
        else:
            user = [IM_START, 1] + _words(rng, 20, 120 if not st["agent"] else 60) + [IM_END]
            st["msgs"].append(("user", user))
            hist = []
            for role, toks in st["msgs"]:
                if role == "assistant_reasoning":
                    continue  # past reasoning is dropped from the prompt (REC-4 rewrite)
                hist.extend(toks)
            prompt = sys_toks + hist
        r_frontier = len(prompt)
        prompt = prompt + [IM_START, 2]  # assistant generation header after R (REC-7)
        if st["agent"]:
            reasoning = [THINK] + _words(rng, 40, 160) + [END_THINK]
            call = [TOOL] + _words(rng, 10, 30) + [END_TOOL, IM_END]
            out = reasoning + call
            st["msgs"].append(("assistant_reasoning", [IM_START, 2] + reasoning))
            st["msgs"].append(("assistant", [IM_START, 2] + call))
            st["msgs"].append(("tool", [IM_START, 3] + _words(rng, 30, 150) + [IM_END]))
        else:
            out = _words(rng, 40, 250) + [IM_END]
            st["msgs"].append(("assistant", [IM_START, 2] + out))
        st["last_prompt"] = prompt[:-2]
        saves = [SavePoint(len(sys_toks), PointKind.SHARED), SavePoint(r_frontier, PointKind.INPUT)]
        reqs.append({"session": s, "tokens": prompt, "saves": saves, "output": out})
        st["turn"] += 1
        if st["turn"] >= turns:
            live.remove(s)
    return reqs


def _common_prefix(a: tuple, b: tuple) -> int:
    """Length of the common prefix: slices compared at C speed in growing steps, then the one
    step that differs token by token (linear in the prefix, each token copied about once)."""
    n, i, step = min(len(a), len(b)), 0, 64
    while i < n:
        j = min(n, i + step)
        if a[i:j] != b[i:j]:
            while a[i] == b[i]:
                i += 1
            return i
        i, step = j, min(2 * step, 8192)
    return n


def upper_bound(reqs: list[dict]) -> list[int]:
    """For each request, the longest prefix any earlier request's tokens share (capacity ignored).

    The earlier sequences are kept sorted (tuples compare lexicographically, a prefix first):
    of a sorted set, the member sharing the longest prefix with x is one of x's two neighbours
    at its insertion point, so each request costs two comparisons and a search instead of one
    per earlier request (a 3,400-request agent trace: seconds, not a quarter of an hour)."""
    seen: list[tuple] = []
    out = []
    for r in reqs:
        toks = tuple(r["tokens"])
        i = bisect.bisect_left(seen, toks)
        out.append(max((_common_prefix(seen[j], toks) for j in (i - 1, i) if 0 <= j < len(seen)), default=0))
        bisect.insort(seen, toks + tuple(r["output"])[:-1])  # E: the last output token is not yet input
    return out


def replay(reqs: list[dict], main_pages: int, slots: int, host_bytes: int, chunk: int = 256) -> dict:
    sim = CacheSim(small_config(main_pages, slots, host_bytes), chunk=chunk)
    reused = prompt = captures = skipped = 0
    kinds: dict = {}
    for i, r in enumerate(reqs):
        o = sim.run(i, r["tokens"], r["saves"], r["output"], session=r["session"])
        reused += o.reused
        prompt += o.prompt_tokens
        captures += o.captures
        skipped += o.skipped
        kinds[o.source] = kinds.get(o.source, 0) + 1
    sim.clear()
    assert not sim.state.objects, "everything is free after clear"
    return {"reused": reused, "prompt": prompt, "captures": captures, "skipped": skipped, "sources": kinds}


CAPACITIES = (  # (Main KV pages, StateImage slots, Host bytes): page = 1 KiB, slot = 4 KiB in the model
    ("tiny", 48, 4, 0),
    ("small", 96, 8, 64 << 10),
    ("medium", 256, 16, 256 << 10),
    ("large", 4096, 512, 16 << 20),
)


def run(argv: list[str]) -> dict:
    ap = argparse.ArgumentParser(prog="python -m ninfer_jax.bench.cache_replay")
    ap.add_argument("--sessions", type=int, default=24)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    reqs = workload(args.sessions, args.turns, args.seed)
    bound = upper_bound(reqs)
    total_prompt = sum(len(r["tokens"]) for r in reqs)
    rows = []
    for name, pages, slots, host_bytes in CAPACITIES:
        got = replay(reqs, pages, slots, host_bytes)
        rows.append({"capacity": name, "main_kv_pages": pages, "state_slots": slots, "host_bytes": host_bytes,
                     "reused_tokens": got["reused"], "reuse_pct": round(100 * got["reused"] / total_prompt, 1),
                     "of_upper_bound_pct": round(100 * got["reused"] / max(1, sum(bound)), 1),
                     "captures": got["captures"], "skipped_saves": got["skipped"], "sources": got["sources"]})
    return {"requests": len(reqs), "prompt_tokens": total_prompt, "upper_bound_tokens": sum(bound),
            "upper_bound_pct": round(100 * sum(bound) / total_prompt, 1), "rows": rows,
            "seconds": round(time.perf_counter() - t0, 2)}


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    res = run(argv)
    if "--json" in argv:
        print(json.dumps(res, indent=1))
        return
    print(f"{res['requests']} requests, {res['prompt_tokens']} prompt tokens; offline upper bound "
          f"{res['upper_bound_tokens']} tokens ({res['upper_bound_pct']}%)")
    print(f"{'capacity':<8} {'pages':>6} {'slots':>5} {'host KiB':>8} {'reused':>8} {'reuse%':>7} {'of bound%':>9} "
          f"{'saves':>6} {'skipped':>7}")
    for r in res["rows"]:
        print(f"{r['capacity']:<8} {r['main_kv_pages']:>6} {r['state_slots']:>5} {r['host_bytes'] >> 10:>8} "
              f"{r['reused_tokens']:>8} {r['reuse_pct']:>7} {r['of_upper_bound_pct']:>9} {r['captures']:>6} "
              f"{r['skipped_saves']:>7}")
    print(f"({res['seconds']} s)")


if __name__ == "__main__":
    main()
