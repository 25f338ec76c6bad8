"""`ninfer bench preempt [--json] [--quick] [--program=sim|model]`: preemption under overload,
by pause route.

A burst of requests whose prompt + output tokens add up to about three times the Main KV is
submitted at once to a small engine (C = 4, max_context 512, `kv_capacity` two pages above the
CFG-6 minimum, a Host arena of a few StateImages plus a few pages), so the oldest residents
keep progressing only by pausing younger ones (G-5, SCH-4). The same load runs, side by side in
one process, under `EngineConfig(pause_route=...)` "auto", "snapshot" and "replay" (PAUSE-2), on
the built-in model (`Program`, wall seconds) and on the cost-model Program (`SimProgram`,
modelled seconds). Half the requests are greedy, half sampled with a fixed seed. Each route
gets one engine, stepped by the bench (`Engine(start=False)`); its passes over the load are
separated by `clear_cache()` and an integrity check of the idle, empty engine (doctrine 2). On
the model one untimed warm-up pass per engine comes first, then `--repeats` (3) timed passes
interleaved across the routes; the cost-model Program is deterministic and runs one.

Per configuration (OBS-1, OBS-3, OBS-4): completion time, TTFT and the largest inter-token gap
(p50/p99 over the requests of every timed pass, from `Completion`), the median pass's total
time of the burst, prefill / replay
tokens, transfer and snapshot bytes, pauses and resumes by route, snapshot revocations, the time
the recovery permit was held, and `outputs_equal`: every request's tokens equal those of a cold
uncontended run (C = 1, the context cache off, the same seeds; doctrine 1). A mismatch or an
engine error is reported, never dropped. Ratios Snapshot ÷ Replay (below 1: Snapshot is faster)
for completion p99, TTFT p99, max gap p99 and total time close each Program's figures.

The bench reports what the engine does: counters it does not have yet read as 0.

Own flags (after `--`, e.g. `ninfer bench preempt -- --overload 4`): --programs sim,model
--routes auto,snapshot,replay --overload 3.0 --max_tokens 128 --prompt_min 64 --prompt_max 192
--concurrency 4 --max_context 512 --kv_extra_pages 2 --host_states 4 --host_pages 16
--chunk_size 64 --seed 0 --repeats N --run_timeout_s S (a hang guard per pass, not a figure)
--quick (the cost-model Program only; seconds). The CLI passes its own `--quick` and `--program`
on.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import random
import signal
import sys
import threading
import time

import ledger
from ninfer_jax.bench.stats import ratio, summary

ROUTES = ("auto", "snapshot", "replay")
PROGRAMS = ("sim", "model")
STAT_KEYS = ("prefill_tokens", "replay_tokens", "reused_tokens", "generated_tokens", "h2d_bytes", "d2h_bytes",
             "snapshot_bytes", "pauses_replay", "pauses_snapshot", "resumes_replay", "resumes_snapshot",
             "snapshot_revocations", "recovery_permit_seconds", "capacity_errors", "cycles", "decode_steps",
             "prefill_chunks", "compilations")
PAUSE_KEYS = ("pauses_replay", "pauses_snapshot", "resumes_replay", "resumes_snapshot", "replay_tokens",
              "snapshot_bytes", "snapshot_revocations")
RATIOS = (("completion_p99", "completion_p99_s"), ("ttft_p99", "ttft_p99_s"), ("max_gap_p99", "max_gap_p99_s"),
          ("total", "total_s"))
INTEGRITY_EVERY = 32  # cycles between integrity checks (doctrine 2); once more at the end
STALL_CYCLES = 4096  # cycles with no token computed or generated and no request ended: a stall


def _parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="ninfer bench preempt")
    ap.add_argument("--programs", default=None, help="comma-separated: sim, model (default both; --quick: sim)")
    ap.add_argument("--routes", default=",".join(ROUTES), help="comma-separated pause routes")
    ap.add_argument("--overload", type=float, default=3.0, help="Σ(prompt + max_tokens) ÷ kv_capacity tokens")
    # Outputs long beside the prompts: residents are admitted on their first chunk's pages and
    # outgrow the Main KV while decoding, so the oldest keeps pausing the youngest (SCH-4).
    ap.add_argument("--max_tokens", type=int, default=128)
    ap.add_argument("--prompt_min", type=int, default=64)
    ap.add_argument("--prompt_max", type=int, default=192)
    ap.add_argument("--concurrency", type=int, default=4, help="C")
    ap.add_argument("--max_context", type=int, default=512)
    ap.add_argument("--kv_extra_pages", type=int, default=2, help="Main KV pages above the CFG-6 minimum")
    ap.add_argument("--host_states", type=int, default=4, help="Host arena: this many StateImages ...")
    ap.add_argument("--host_pages", type=int, default=16, help="... plus this many Main KV pages")
    ap.add_argument("--chunk_size", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=None,
                    help="timed passes per route (default 3 on the model after an untimed warm-up pass, 1 on sim)")
    ap.add_argument("--run_timeout_s", type=float, default=None,
                    help="a run still going after this many wall seconds is reported as an error (a hang guard, "
                         "not a figure; default 600, --quick 120)")
    ap.add_argument("--quick", action="store_true", help="the cost-model Program only (seconds)")
    ap.add_argument("--program", choices=PROGRAMS, default=None, help="the CLI's --program: only this one")
    ap.add_argument("--json", action="store_true", help="accepted for symmetry; the CLI's --json decides printing")
    args = ap.parse_args(argv)
    if args.programs is None:
        args.programs = args.program or ("sim" if args.quick else ",".join(PROGRAMS))
    args.programs = tuple(p for p in args.programs.split(",") if p)
    args.routes = tuple(r for r in args.routes.split(",") if r)
    if args.run_timeout_s is None:
        args.run_timeout_s = 120.0 if args.quick else 600.0
    for p in args.programs:
        if p not in PROGRAMS:
            ap.error(f"--programs: {p!r} is not one of {PROGRAMS}")
    for r in args.routes:
        if r not in ROUTES:
            ap.error(f"--routes: {r!r} is not one of {ROUTES}")
    if not 0 < args.prompt_min <= args.prompt_max or args.prompt_max + args.max_tokens > args.max_context:
        ap.error("need 0 < prompt_min <= prompt_max and prompt_max + max_tokens <= max_context")
    return args


def _log(msg: str) -> None:
    print(f"[bench preempt] {msg}", file=sys.stderr, flush=True)


# ---- the load -------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Load:
    prompts: tuple[tuple[int, ...], ...]
    sampling: tuple  # SamplingParams per request
    kv_pages: int
    host_states: int
    host_pages: int
    seed: int = 0

    @property
    def tokens(self) -> int:
        return sum(len(p) + s.max_tokens for p, s in zip(self.prompts, self.sampling))

    def variant(self, k: int) -> "Load":
        """The same lengths, budgets and kinds with other token ids and seeds: pass k of an engine
        gets variant k, so the cache policy's demand evidence from earlier passes (which
        `clear_cache` keeps) finds nothing to repeat and every pass schedules alike."""
        if k == 0:
            return self
        rng = random.Random(f"{self.seed}/{k}")
        prompts = tuple(tuple(rng.randrange(1000) for _ in p) for p in self.prompts)
        sampling = tuple(s if s.seed is None else dataclasses.replace(s, seed=s.seed + 100_000 * k)
                         for s in self.sampling)
        return dataclasses.replace(self, prompts=prompts, sampling=sampling)


def make_load(args) -> Load:
    """Requests until Σ(prompt + max_tokens) reaches `overload` × kv_capacity; even ones greedy,
    odd ones sampled with seed `seed·1000 + i` (PAUSE-5: a pause must not change a draw). EOS is
    ignored so every request runs its whole budget and the overload is exact."""
    from ninfer_jax import SamplingParams

    lo, _ = ledger.kv_page_range(args.max_context, args.concurrency)  # CFG-6
    pages = lo + args.kv_extra_pages
    rng = random.Random(args.seed)
    prompts, sampling, total = [], [], 0
    while total < args.overload * pages * ledger.PAGE_TOKENS:
        i = len(prompts)
        n = rng.randint(args.prompt_min, args.prompt_max)
        prompts.append(tuple(rng.randrange(1000) for _ in range(n)))  # ordinary ids of the built-in vocabulary
        if i % 2 == 0:
            sampling.append(SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True))
        else:
            sampling.append(SamplingParams(temperature=0.9, top_k=50, seed=args.seed * 1000 + i,
                                           max_tokens=args.max_tokens, ignore_eos=True))
        total += n + args.max_tokens
    return Load(tuple(prompts), tuple(sampling), pages, args.host_states, args.host_pages, args.seed)


# ---- engines ----------------------------------------------------------------------------------
def _unit_bytes(program: str) -> tuple[int, int]:
    """(StateImage, Main KV page) bytes on this Program: the built-in model's float32 sizes, or
    one byte per unit on the cost-model Program."""
    if program == "sim":
        return 1, 1
    from ninfer_jax.model import builtin

    cfg = builtin.config()
    return cfg.state_image_bytes(4), cfg.kv_bytes_per_token(4) * ledger.PAGE_TOKENS


def _configs(args, load: Load, program: str) -> dict:
    from ninfer_jax import ContextCacheConfig, EngineConfig

    state_b, page_b = _unit_bytes(program)
    host = load.host_states * state_b + load.host_pages * page_b
    base = dict(max_context=args.max_context, chunk_size=args.chunk_size, progress=False,
                max_queue=max(4096, 2 * len(load.prompts)))
    out = {"reference": EngineConfig(max_concurrency=1, kv_capacity=ledger.pages_for_tokens(args.max_context)
                                     * ledger.PAGE_TOKENS, context_cache=ContextCacheConfig(enabled=False), **base)}
    for route in args.routes:
        out[route] = EngineConfig(max_concurrency=args.concurrency, kv_capacity=load.kv_pages * ledger.PAGE_TOKENS,
                                  context_cache=ContextCacheConfig(host_capacity_bytes=host), pause_route=route,
                                  **base)
    return out


def _engine(cfg, program: str, model):
    from ninfer_jax import Engine

    if program == "sim":
        from ninfer_jax.sim.program import SimProgram

        return Engine(cfg, program=SimProgram(cfg), start=False)
    from ninfer_jax.program.program import Program

    return Engine(cfg, program=Program(cfg, model=model), start=False)


class RunTimeout(Exception):
    pass


@contextlib.contextmanager
def _wall_limit(seconds: float | None):
    """Raise RunTimeout in this thread after `seconds` of wall time (main thread only): an engine
    that hangs inside one cycle is reported instead of hanging the bench."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise RunTimeout(f"no end after {seconds:g} s of wall time (--run_timeout_s)")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _progress(stats: dict) -> tuple:
    """What changes when the engine makes progress: tokens computed or generated, requests ended."""
    return tuple(stats.get(k, 0) for k in ("prefill_tokens", "replay_tokens", "generated_tokens", "requests_finished",
                                           "requests_failed", "requests_cancelled"))


def _drive(engine, load: Load, timeout_s: float | None, variant: int = 0) -> dict:
    """One pass of the load on an idle engine: submit every request at once, step to the end.
    An engine error, a stall or a hang ends the pass and is reported in `error`."""
    clock = engine.program.clock
    before = engine.stats()
    handles, seen_done, error, hung, cycles = [], {}, None, False, 0
    t0, wall0 = clock(), time.perf_counter()
    try:
        with _wall_limit(timeout_s):
            handles = [engine.submit(list(p), s) for p, s in zip(load.prompts, load.sampling)]
            last, last_cycle = None, 0
            while len(seen_done) < len(handles):
                engine.step()
                cycles += 1
                now = clock()
                for i, h in enumerate(handles):
                    if i not in seen_done and h.done():
                        seen_done[i] = now - t0  # fallback when the Completion has no completion_s
                if cycles % INTEGRITY_EVERY == 0:
                    engine.check_integrity()  # doctrine 2
                    progress = _progress(engine.stats())
                    if progress != last:
                        last, last_cycle = progress, cycles
                    elif cycles - last_cycle >= STALL_CYCLES:
                        raise RuntimeError(f"stalled: {cycles - last_cycle} cycles without progress "
                                           f"({len(seen_done)}/{len(handles)} requests ended)")
            engine.check_integrity()
    except Exception as e:  # the figures say what happened (never hidden)
        hung = isinstance(e, RunTimeout)
        error = f"{type(e).__name__}: {e}"
    t_end, wall = clock(), time.perf_counter() - wall0
    try:
        after = engine.stats()
    except Exception:  # noqa: BLE001 - a broken engine still gets reported
        after = dict(engine.core.counters)
    results = [h.result(timeout=0) if h.done() else None for h in handles]
    results += [None] * (len(load.prompts) - len(results))  # never submitted (an error at submission)
    # Latencies over the requests that ended normally; failures are counted, not timed.
    completion, source = [], "engine"
    for i, r in enumerate(results):
        c = None if r is None or r.finish_reason == "error" else getattr(r, "completion_s", None)
        if c is None and r is not None and r.finish_reason != "error":
            c, source = seen_done.get(i), "bench"
        completion.append(c)
    # the burst's span on the Program's clock: submission of all → the last finish (with an
    # error: up to the moment the pass stopped)
    total = t_end - t0 if error or None in completion else max(completion, default=0.0)
    return {"variant": variant, "error": error, "hung": hung, "results": results, "completion": completion,
            "source": source,
            "total_s": total, "wall_s": wall, "cycles": cycles,
            "stats": {k: after.get(k, 0) - before.get(k, 0) for k in STAT_KEYS},
            "tokens": [None if r is None else tuple(r.token_ids) for r in results]}


def _reset(engine) -> None:
    """Between passes: drop every cached point; an idle engine with an empty cache must then hold
    nothing (doctrine 2; `check_integrity` checks every pool and the arena)."""
    engine.clear_cache()
    engine.check_integrity()


def _close(engine, hung: bool) -> None:
    if hung:  # a hung engine may be inside a cycle: leave it to the garbage collector
        return
    try:
        engine.close()
    except Exception:  # noqa: BLE001
        pass


def _compare(passes: list[dict], references: dict, load: Load) -> dict:
    """Doctrine 1: every request's tokens, greedy or seeded, in every pass, equal the cold
    uncontended run's of the same variant; a request missing from either run counts as differing."""
    differing = sorted({i for run in passes
                        for i, (a, b) in enumerate(zip(run["tokens"], references[run["variant"]]["tokens"]))
                        if a is None or b is None or a != b})
    seeded = sum(load.sampling[i].temperature > 0 for i in differing)
    failed = any(r is not None and r.finish_reason == "error" for run in passes for r in run["results"])
    return {"outputs_equal": bool(passes) and not differing and not failed
            and all(references[run["variant"]]["error"] is None and run["error"] is None for run in passes),
            "outputs_differing": len(differing), "outputs_differing_greedy": len(differing) - seeded,
            "outputs_differing_seeded": seeded, "differing_requests": differing[:16]}


def _figures(passes: list[dict], load: Load, build_s: float, error: str | None) -> dict:
    """One configuration's figures: latencies pooled over its timed passes (OBS-4: one
    trajectory proves no distribution), the median total, the first pass's counters."""
    done = [r for run in passes for r in run["results"] if r is not None]
    ok = [r for r in done if r.finish_reason != "error"]

    totals = sorted(run["total_s"] for run in passes)
    stats = passes[0]["stats"] if passes else {k: 0 for k in STAT_KEYS}
    fig = {"error": error, "requests": len(load.prompts), "passes": len(passes),
           "requests_done": len(done), "requests_failed": len(done) - len(ok)}
    fig.update(summary([c for run in passes for c in run["completion"]], "completion"))
    fig.update(summary([r.ttft_s for r in ok], "ttft"))
    fig.update(summary([getattr(r, "max_output_gap_s", None) for r in ok], "max_gap"))
    fig.update(summary([getattr(r, "admitted_s", None) for r in ok], "admitted"))
    fig.update({
        # "bench": the engine did not fill Completion.completion_s; the end of the finishing cycle is used
        "completion_source": "bench" if any(run["source"] == "bench" for run in passes) else "engine",
        "total_s": totals[len(totals) // 2] if totals else None,  # the median pass
        "total_s_runs": [round(run["total_s"], 6) for run in passes],
        "wall_s": round(sum(run["wall_s"] for run in passes), 3), "build_s": round(build_s, 3),
        "pauses": stats.get("pauses_replay", 0) + stats.get("pauses_snapshot", 0),
        "resumes": stats.get("resumes_replay", 0) + stats.get("resumes_snapshot", 0),
    })
    fig.update(stats)
    fig["bench_cycles"] = passes[0]["cycles"] if passes else 0
    counted = [k for k in STAT_KEYS if k != "recovery_permit_seconds"]  # the one counter on the clock
    fig["runs_same_counters"] = len({tuple(run["stats"][k] for k in counted) for run in passes}) <= 1
    fig["finish_reasons"] = dict(collections.Counter(r.finish_reason for r in done))
    fig["request_errors"] = sorted({r.error for r in done if r.error})[:4]  # distinct, as the engine reported them
    return fig


def run_program(args, load: Load, program: str, model=None) -> dict:
    """The reference, then every route: one engine per route, an untimed warm-up pass on the
    model, then `repeats` timed passes interleaved across the routes (auto, snapshot, replay,
    auto, ...) so drift on a shared machine falls on every route alike."""
    cfgs = _configs(args, load, program)
    clock = "modelled" if program == "sim" else "wall"
    repeats = args.repeats if args.repeats is not None else (1 if program == "sim" or args.quick else 3)
    warmup = program == "model"
    variants = list(range(repeats + warmup))  # the warm-up pass takes variant 0, timed pass i variant i + warmup
    out: dict = {"clock": clock, "repeats": repeats}
    _log(f"{program}: cold uncontended reference (C=1, cache off), {len(variants)} × {len(load.prompts)} requests")
    engine = _engine(cfgs.pop("reference"), program, model)
    refs: dict = {}
    for k in variants:
        refs[k] = _drive(engine, load.variant(k), args.run_timeout_s, k)
        if refs[k]["hung"]:
            break
    for k in variants:  # after a hang, the later variants have no reference
        refs.setdefault(k, {"error": "not run (the reference engine hung)", "tokens": [None] * len(load.prompts),
                            "total_s": None, "wall_s": 0.0, "stats": {}, "results": [None] * len(load.prompts)})
    _close(engine, any(r.get("hung") for r in refs.values()))
    out["reference"] = {"error": next((r["error"] for r in refs.values() if r["error"]), None),
                        "total_s": refs[variants[0]]["total_s"],
                        "pauses": sum(r["stats"].get("pauses_replay", 0) + r["stats"].get("pauses_snapshot", 0)
                                      for r in refs.values()),
                        "wall_s": round(sum(r["wall_s"] for r in refs.values()), 3),
                        "requests_failed": sum(r is None or r.finish_reason == "error"
                                               for run in refs.values() for r in run["results"])}
    if out["reference"]["error"]:
        _log(f"{program}: the reference run failed: {out['reference']['error']}")
    engines, builds, errors = {}, {}, {}
    passes: dict = {route: [] for route in cfgs}
    for route, cfg in cfgs.items():
        t = time.perf_counter()
        try:
            engines[route] = _engine(cfg, program, model)
        except Exception as e:  # noqa: BLE001 - e.g. a config this build refuses
            errors[route] = f"{type(e).__name__}: {e}"
        builds[route] = time.perf_counter() - t
    if program == "model":
        # Wall time: a first pass also pays one-time compilations (the page gather/scatter/copy
        # functions, first calls of each step); one untimed pass per engine takes them out.
        for route, engine in engines.items():
            _log(f"{program}: untimed warm-up pass, pause_route={route}")
            warm = _drive(engine, load.variant(0), args.run_timeout_s, 0)
            if warm["error"]:
                errors[route] = f"warm-up pass: {warm['error']}"
                passes[route].append(warm)  # its figures are all there is
                continue
            try:
                _reset(engine)
            except Exception as e:  # noqa: BLE001 - a leak after the pass
                errors[route] = f"after the warm-up pass: {type(e).__name__}: {e}"
    for rep in range(repeats):
        for route, engine in engines.items():
            if route in errors:
                continue
            _log(f"{program}: pause_route={route}, pass {rep + 1}/{repeats}")
            run = _drive(engine, load.variant(rep + warmup), args.run_timeout_s, rep + warmup)
            passes[route].append(run)
            if run["error"]:
                errors[route] = f"pass {rep + 1}: {run['error']}"
                continue
            try:
                _reset(engine)
            except Exception as e:  # noqa: BLE001 - a leak after the pass
                errors[route] = f"after pass {rep + 1}: {type(e).__name__}: {e}"
    for route, engine in engines.items():
        _close(engine, any(run["hung"] for run in passes[route]))
    for route in cfgs:
        fig = _figures(passes[route], load, builds[route], errors.get(route))
        fig.update(_compare(passes[route], refs, load))
        out[route] = fig
        _log(f"{program} {route}: {fig['pauses']} pauses ({fig['pauses_snapshot']} snapshot), "
             f"{fig['replay_tokens']} replay tokens, total {_fmt(fig['total_s'])} s ({clock}), "
             f"outputs_equal={fig['outputs_equal']}" + (f", error {fig['error']}" if fig["error"] else ""))
        if not fig["outputs_equal"]:
            _log(f"{program} {route}: OUTPUTS DIFFER from the cold uncontended run: requests "
                 f"{fig['differing_requests']}" + (" ..." if fig["outputs_differing"] > 16 else ""))
    if "snapshot" in out and "replay" in out:
        broken = out["snapshot"]["error"] or out["replay"]["error"]  # no ratio of a run that did not finish
        out["snapshot_over_replay"] = {name: None if broken else ratio(out["snapshot"][key], out["replay"][key])
                                       for name, key in RATIOS}
    routes = [r for r in args.routes if r in out]
    out["routes_same_pause_counters"] = len({tuple(out[r][k] for k in PAUSE_KEYS) for r in routes}) <= 1
    return out


def run(argv: list[str]) -> dict:
    args = _parse(argv)
    start = time.perf_counter()
    load = make_load(args)
    figures: dict = {
        "bench": "preempt", "programs": list(args.programs), "routes": list(args.routes),
        "load": {"requests": len(load.prompts), "greedy": sum(s.temperature == 0 for s in load.sampling),
                 "seeded": sum(s.temperature > 0 for s in load.sampling), "tokens": load.tokens,
                 "max_tokens": args.max_tokens, "prompt_tokens": sum(len(p) for p in load.prompts),
                 "max_concurrency": args.concurrency, "max_context": args.max_context, "chunk_size": args.chunk_size,
                 "kv_pages": load.kv_pages, "kv_capacity_tokens": load.kv_pages * ledger.PAGE_TOKENS,
                 "cfg6_min_pages": ledger.kv_page_range(args.max_context, args.concurrency)[0],
                 "overload": round(load.tokens / (load.kv_pages * ledger.PAGE_TOKENS), 3),
                 "host_states": load.host_states, "host_pages": load.host_pages, "seed": args.seed},
    }
    _log(f"{figures['load']['requests']} requests, {load.tokens} prompt + output tokens = "
         f"{figures['load']['overload']} × kv_capacity ({load.kv_pages} pages); programs {args.programs}, "
         f"routes {args.routes}")
    for program in args.programs:
        model = None
        if program == "model":
            from ninfer_jax.model import builtin
            from ninfer_jax.model.model import load_model

            model = load_model(builtin.NAME)
        figures[program] = run_program(args, load, program, model)
        state_b, page_b = _unit_bytes(program)
        figures[program]["host_capacity_bytes"] = load.host_states * state_b + load.host_pages * page_b
    figures["outputs_equal"] = all(figures[p][r]["outputs_equal"] for p in args.programs for r in args.routes)
    figures["seconds"] = round(time.perf_counter() - start, 2)
    return figures


# ---- text ---------------------------------------------------------------------------------------
ROWS = (("timed passes", "passes", None),
        ("requests done / failed", "requests_done", "requests_failed"),
        ("completion p50 / p99", "completion_p50_s", "completion_p99_s"),
        ("TTFT p50 / p99", "ttft_p50_s", "ttft_p99_s"),
        ("max gap p50 / p99", "max_gap_p50_s", "max_gap_p99_s"),
        ("admitted p50 / p99", "admitted_p50_s", "admitted_p99_s"),
        ("total (median pass)", "total_s", None),
        ("pauses replay / snapshot", "pauses_replay", "pauses_snapshot"),
        ("resumes replay / snapshot", "resumes_replay", "resumes_snapshot"),
        ("replay / prefill tokens", "replay_tokens", "prefill_tokens"),
        ("snapshot bytes", "snapshot_bytes", None),
        ("D2H / H2D bytes", "d2h_bytes", "h2d_bytes"),
        ("snapshot revocations", "snapshot_revocations", None),
        ("recovery permit s", "recovery_permit_seconds", None),
        ("cycles", "cycles", None),
        ("outputs equal (differing)", "outputs_equal", "outputs_differing"))


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def text(figures: dict) -> str:
    """The figures as aligned tables, one per Program (the CLI prints this without --json)."""
    ld = figures["load"]
    lines = [f"ninfer bench preempt: {ld['requests']} requests ({ld['greedy']} greedy, {ld['seeded']} seeded), "
             f"{ld['tokens']} prompt + output tokens = {ld['overload']} × kv_capacity {ld['kv_capacity_tokens']} "
             f"({ld['kv_pages']} pages, CFG-6 minimum {ld['cfg6_min_pages']}); C={ld['max_concurrency']}, "
             f"max_context={ld['max_context']}, Host arena {ld['host_states']} StateImages + {ld['host_pages']} pages"]
    routes = figures["routes"]
    for program in figures["programs"]:
        p = figures[program]
        unit = "modelled s" if p["clock"] == "modelled" else "wall s"
        lines += ["", f"{program} ({unit}; Host arena {p['host_capacity_bytes']} B; reference total "
                      f"{_fmt(p['reference']['total_s'])}{', ERROR ' + p['reference']['error'] if p['reference']['error'] else ''})"]
        rows = [["", *routes]]
        for label, a, b in ROWS:
            rows.append([label] + [_fmt(p[r][a]) + ("" if b is None else f" / {_fmt(p[r][b])}") for r in routes])
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
        for r in routes:
            if p[r]["error"]:
                lines.append(f"  {r}: ERROR {p[r]['error']}")
        ratios = p.get("snapshot_over_replay")
        if ratios:
            lines.append("  snapshot ÷ replay: " + ", ".join(f"{k} {_fmt(v)}" for k, v in ratios.items()))
        if p["routes_same_pause_counters"]:
            lines.append("  (every route paused and resumed the same way: same pause/resume/replay/snapshot counters)")
    lines += ["", f"outputs equal to the cold uncontended run: {_fmt(figures['outputs_equal'])}; "
                  f"{figures['seconds']} s in all"]
    return "\n".join(lines)
