"""`ninfer bench spec [--json]`: speculative decoding on the trained built-in model, its MTP head
against its shipped DFlash drafter (`builtin:tiny-hybrid-dflash`, issue 35) and no drafts.

For C = 1 and 8, k = 0..4 MTP drafts and k = 1, 3, 5, 7 DFlash drafts, side by side in one run
on the same model: 4·C requests
whose prompts are 48-token windows of held-out English text (the Python documentation topics
the built-in model was not trained on, `train/corpus.py`), greedy, 128 output tokens each (EOS
ignored), submitted at once to a running engine after its warm-up, three rounds on the same
engine. Reported per (C, k): decode tokens/s (output tokens after each request's first ÷ the
wall time from the first first-token to the last token; the median round, and every round),
acceptance by draft position (Verify units that emitted draft j ÷ Verify units), mean accepted
length (tokens per Verify unit) and the tokens, which must equal
k = 0's (the run fails otherwise). `best_k` and `speedup` per C and method: the fastest k over
k = 0 (keys `c{C}_k{k}_…` for MTP, `c{C}_dflash_k{k}_…` for DFlash).

Flags after `spec`: --max_tokens N (default 128), --requests_per_lane N (default 4), --repeats N
(default 3), --methods mtp,dflash (default both).
"""
from __future__ import annotations

import sys

from ninfer_jax import ContextCacheConfig, Engine, EngineConfig, SamplingParams
from ninfer_jax.bench import int_arg, str_arg
from ninfer_jax.bench.engine_bench import submit_streams
from ninfer_jax.bench.stats import median
from ninfer_jax.model.model import load_model
from ninfer_jax.program.program import Program

LANES = (1, 8)
DRAFTS = (0, 1, 2, 3, 4)
DFLASH_DRAFTS = (1, 3, 5, 7)  # the shipped drafter's block of 8 drafts up to 7
METHODS = ("mtp", "dflash")
WINDOW = 48


def prompts(n: int) -> list[list[int]]:
    """`n` 48-token windows of held-out documentation text, in a fixed order."""
    from ninfer_jax.frontend.tokenizer import Tokenizer
    from ninfer_jax.train.corpus import _topic_documents, is_heldout

    tok = Tokenizer.builtin()
    out = []
    for doc in _topic_documents():
        if not is_heldout(doc.id):
            continue
        ids = tok.encode(doc.text)
        for lo in range(0, len(ids) - WINDOW, 2 * WINDOW):  # every other window (about 50)
            out.append(ids[lo:lo + WINDOW])
            if len(out) == n:
                return out
    raise RuntimeError(f"the held-out topics hold fewer than {n} prompt windows")


def _one(model, c: int, k: int, work: list[list[int]], max_tokens: int, repeats: int, method: str = "mtp") -> dict:
    from ninfer_jax.model import builtin

    drafter = dict(speculative_method="dflash", draft_model=builtin.DRAFTER_NAME) if method == "dflash" and k else {}
    cfg = EngineConfig(max_concurrency=c, max_context=256, chunk_size=64, progress=False, speculative_tokens=k,
                       context_cache=ContextCacheConfig(enabled=False), **drafter)
    engine = Engine(cfg, program=Program(cfg, model=model))
    sp = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    rates, tokens = [], None
    for _ in range(repeats):  # the same work on the warm engine; the median round is reported
        handles, stamps = submit_streams(engine, work, sp)  # one stamp per delta: a Verify unit streams token by token
        got = [h.result().token_ids for h in handles]
        if tokens is not None and got != tokens:
            raise AssertionError(f"C={c} k={k}: a repeat gave other tokens")
        tokens = got
        first = min(t[0] for t in stamps)
        last = max(t[-1] for t in stamps)
        decoded = sum(len(t) - 1 for t in got)  # stamps may hold a final text-only delta
        rates.append(decoded / (last - first) if last > first else float("nan"))
    stats = engine.stats()
    engine.close()
    units = stats["spec_verify_units"]
    # Per draft position j: the share of Verify units that emitted draft j (the last units of a
    # request draft fewer, as max_tokens leaves less room).
    by_pos = stats["spec_accepted_by_position"]
    return {"tokens": tokens, "decode_tokens_per_s": median(rates), "rounds": [round(r, 1) for r in rates],
            "verify_units": units, "drafted": stats["spec_drafted_tokens"], "accepted": stats["spec_accepted_tokens"],
            "acceptance_by_position": [round(a / units, 4) if units else 0.0 for a in by_pos],
            "mean_accepted_length": round(stats["spec_mean_accepted_length"], 4) if units else 1.0,
            "decode_steps": stats["decode_steps"] // repeats}


def run(argv: list[str]) -> dict:
    max_tokens = int_arg(argv, "max_tokens", 128)
    per_lane = int_arg(argv, "requests_per_lane", 4)
    repeats = int_arg(argv, "repeats", 3)
    methods = _methods(argv)
    model = load_model("builtin:tiny-hybrid")
    out: dict = {"model": "builtin:tiny-hybrid", "max_tokens": max_tokens, "requests_per_lane": per_lane,
                 "repeats": repeats, "methods": list(methods)}
    for c in LANES:
        work = prompts(per_lane * c)
        print(f"[bench spec] C={c} k=0: warming up and decoding {len(work)} requests", file=sys.stderr)
        base_row = _one(model, c, 0, work, max_tokens, repeats)
        for method in methods:
            rows = {0: base_row}
            for k in (DRAFTS if method == "mtp" else DFLASH_DRAFTS):
                if not k:
                    continue
                print(f"[bench spec] C={c} {method} k={k}: warming up and decoding {len(work)} requests",
                      file=sys.stderr)
                rows[k] = _one(model, c, k, work, max_tokens, repeats, method)
                if rows[k]["tokens"] != base_row["tokens"]:
                    raise AssertionError(f"C={c} {method} k={k}: the tokens differ from k=0's (doctrine 1)")
            _report(out, c, "" if method == "mtp" else "dflash_", rows)
    out["tokens_equal_across_k"] = True
    return out


def _methods(argv: list[str]) -> tuple[str, ...]:
    methods = tuple(m for m in str_arg(argv, "methods", ",".join(METHODS)).split(",") if m)
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        raise ValueError(f"--methods: each of {METHODS}, got {bad or 'none'}")
    return methods


def _report(out: dict, c: int, tag: str, rows: dict) -> None:
    """One method's rows (k → figures, k = 0 the no-draft run) as `c{c}_{tag}k{k}_…` keys."""
    base = rows[0]["decode_tokens_per_s"]
    best = max(rows, key=lambda k: rows[k]["decode_tokens_per_s"])
    for k, r in rows.items():
        pre = f"c{c}_{tag}k{k}_"
        out[pre + "decode_tokens_per_s"] = round(r["decode_tokens_per_s"], 1)
        out[pre + "rounds_tokens_per_s"] = r["rounds"]
        out[pre + "speedup"] = round(r["decode_tokens_per_s"] / base, 3)
        if k:
            out[pre + "mean_accepted_length"] = r["mean_accepted_length"]
            out[pre + "acceptance_by_position"] = r["acceptance_by_position"]
        out[pre + "decode_steps"] = r["decode_steps"]
    out[f"c{c}_{tag}best_k"] = best
    out[f"c{c}_{tag}best_speedup"] = round(rows[best]["decode_tokens_per_s"] / base, 3)
