#!/usr/bin/env python
"""Device check: the Pallas kernels against their references, their bandwidth, and the model's speed.

The one short script to run when a GPU is lent (issue 33). Two sections, one JSON file:

kernels  For every kernel and dtype (float32, bfloat16): the max abs error against the pure-JAX
         reference, pass/fail, and the median wall time of both backends over --reps runs after a
         warm-up (outputs fed back with donation where the kernel updates a pool or state in
         place); the bytes one call must move, computed from the shapes (dense inputs read and
         outputs written in full; for paged attention only the pages the rows' lengths address,
         for the page movers only the entries whose index is not negative), hence GB/s per
         backend and the fraction of the device's peak memory bandwidth (PEAK_BYTES_PER_S by
         device kind; unknown kinds report null unless --peak_gbs is given).
models   Random-weight checkpoints built in memory (no files, nothing downloaded) at a
         Qwen3.5-0.8B-like and a Qwen3.5-9B-like geometry (GEOMETRIES), run through the engine's
         own path: `parse_config` of the config dict, `param_shapes` filled with normal * 0.02
         (the zero-centred norms 0, the GDN output norm 1), `Model`, `CompiledSteps` (backend
         "pallas" on a GPU, "xla" on a CPU) over `init_pools`. Measured after a warm-up, with
         jax.block_until_ready: prefill tokens/s (one row, --chunk tokens per call) and decode
         tokens/s at C = 1 (the engine's bucket of 2 rows, the second a padding row of slot -1)
         and C = 8 (8 rows), each at a context of --prompt_len tokens, plus the weight bytes one
         decode step reads ÷ its time (a lower bound of the bandwidth it achieves). A model that
         fails (a Triton lowering error, memory) is recorded with its error and the next one runs;
         the 9B-like model is skipped when the device has too little free memory, and any model
         when the --budget_s time budget is nearly spent.

Progress goes to stderr with the elapsed time. The last stdout line is the whole JSON record, which
is also written to --out (default device_check.json here) and, when $OUT is set, to
$OUT/<same name> (the device tool brings those files back). Exit status 1 if any kernel mismatched
or failed, or a model section raised; a skipped model is not a failure.

    python scripts/device_check.py                              # GPU: all of it, budgeted to 5 minutes
    python scripts/device_check.py --models none                # GPU: the kernels only
    python scripts/device_check.py --backend interpret --tiny   # CPU smoke test, seconds
"""
from __future__ import annotations

import argparse
import functools
import gc
import json
import math
import os
import statistics
import sys
import time
import traceback
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from pallas_kernels import conv1d, gdn, page_copy, paged_attention  # noqa: E402

_START = [time.perf_counter()]  # reset by main(): progress times and the budget count from there

# Error is max|got - want| / max(1, max|want|): outputs are O(1), states may be larger.
TOL = {"float32": 2e-4, "bfloat16": 3e-2}

MODERATE = dict(rows=8, context=4096, chunk=512, hq=16, hkv=2, head_dim=256, page_size=64,
                gdn_heads=32, dk=128, dv=128, gdn_chunk=64, conv_channels=8192, copies=16)
TINY = dict(rows=2, context=64, chunk=12, hq=4, hkv=2, head_dim=32, page_size=16,
            gdn_heads=2, dk=16, dv=32, gdn_chunk=16, conv_channels=64, copies=3)

# Peak memory bandwidth (bytes/s) by device kind, from the vendors' data sheets. Matched in order
# on jax's `device_kind` (e.g. "NVIDIA H100 80GB HBM3" is the SXM part, "NVIDIA H100 PCIe").
PEAK_BYTES_PER_S = (
    (("H200",), "H200", 4.8e12),
    (("H100", "PCIE"), "H100 PCIe", 2.0e12),
    (("H100", "NVL"), "H100 NVL", 3.9e12),
    (("H100", "HBM3"), "H100 SXM", 3.35e12),
    (("H100", "SXM"), "H100 SXM", 3.35e12),
)


def _say(msg: str) -> None:
    print(f"[device_check {time.perf_counter() - _START[0]:6.1f}s] {msg}", file=sys.stderr, flush=True)


def peak_bandwidth(device_kind: str, override_gbs: float | None) -> dict:
    """{"bytes_per_s", "source"}; bytes_per_s None (with a note) for a device not in the table."""
    if override_gbs:
        return {"bytes_per_s": override_gbs * 1e9, "source": "--peak_gbs"}
    kind = device_kind.upper()
    for needles, name, peak in PEAK_BYTES_PER_S:
        if all(n in kind for n in needles):
            return {"bytes_per_s": peak, "source": f"table: {name}"}
    return {"bytes_per_s": None, "source": None,
            "note": f"no peak bandwidth known for device kind {device_kind!r}: pass --peak_gbs to set one"}


# ---------------------------------------------------------------------------------------- kernels

def _cases(s, dtype, seed=0):
    """name -> (fn, args, kwargs, feedback): feedback maps argument index -> output index."""
    # Host-side RNG: eager jax.random ops compile one by one, which dominates tiny runs.
    rng = np.random.default_rng(seed)
    dev = lambda x, dt=dtype: jnp.asarray(np.asarray(x, np.float32), dt)  # noqa: E731
    rnd = lambda shape, dt=dtype: dev(rng.standard_normal(shape, np.float32), dt)  # noqa: E731
    r, ps, hkv, hq, d = s["rows"], s["page_size"], s["hkv"], s["hq"], s["head_dim"]
    p = s["context"] // ps
    n = r * p + 1  # page 0 left unused: a stray write to it would show up
    table = jnp.asarray((rng.permutation(n - 1)[: r * p] + 1).reshape(r, p), jnp.int32)
    kp, vp = rnd((n, ps, hkv, d)), rnd((n, ps, hkv, d))
    t = s["chunk"]
    start = jnp.full((r,), s["context"] - t, jnp.int32)
    lengths = jnp.array([t, t - 1, t // 3, 0, 1, t, t // 2, t][:r], jnp.int32)
    ctx = jnp.array([s["context"], 1, 0, s["context"] // 3, ps, ps + 1, 7, s["context"] - 5][:r], jnp.int32)
    scale = d ** -0.5

    h, dk, dv, tg = s["gdn_heads"], s["dk"], s["dv"], s["chunk"]

    def unit(shape):
        x = rng.standard_normal(shape, np.float32)
        return x / np.linalg.norm(x, axis=-1, keepdims=True)

    gq, gk = dev(unit((r, tg, h, dk)) * dk ** -0.5), dev(unit((r, tg, h, dk)))
    gv = rnd((r, tg, h, dv))
    g = dev(rng.uniform(-2.0, 0.0, (r, tg, h)), jnp.float32)
    beta = dev(rng.uniform(0.0, 1.0, (r, tg, h)), jnp.float32)
    state = rnd((r, h, dk, dv), jnp.float32)

    c = s["conv_channels"]
    conv_state = rnd((r, 3, c))
    w = rnd((c, 4))
    m = s["copies"]
    idx = jnp.array(([5, -1] + list(range(7, 7 + m)))[:m], jnp.int32)
    dst = jnp.array(([9, 3, -1] + list(range(20, 20 + m)))[:m], jnp.int32)
    return {
        "write_kv": (paged_attention.write_kv,
                     (kp, vp, rnd((r, t, hkv, d)), rnd((r, t, hkv, d)), table, start, lengths), {}, {0: 0, 1: 1}),
        "prefill_attention": (paged_attention.prefill_attention,
                              (rnd((r, t, hq, d)), kp, vp, table, start, lengths), {"scale": scale}, {}),
        "decode_attention": (paged_attention.decode_attention,
                             (rnd((r, hq, d)), kp, vp, table, ctx), {"scale": scale}, {}),
        "chunk_gated_delta_rule": (gdn.chunk_gated_delta_rule, (gq, gk, gv, g, beta, state),
                                   {"chunk_size": s["gdn_chunk"]}, {5: 1}),
        "recurrent_gated_delta_rule_step": (gdn.recurrent_gated_delta_rule_step,
                                            (gq[:, 0], gk[:, 0], gv[:, 0], g[:, 0], beta[:, 0], state), {}, {5: 1}),
        "causal_conv1d_prefill": (conv1d.causal_conv1d_prefill,
                                  (rnd((r, t, c)), conv_state, w, lengths), {}, {1: 1}),
        "causal_conv1d_update": (conv1d.causal_conv1d_update, (rnd((r, c)), conv_state, w), {}, {1: 1}),
        "gather": (page_copy.gather, (kp, idx), {}, {}),
        "scatter": (page_copy.scatter, (kp, idx, rnd((m, ps, hkv, d))), {}, {0: 0}),
        "copy": (page_copy.copy, (kp, idx, dst), {}, {0: 0}),
    }


def _nbytes(*xs) -> int:
    return sum(math.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in xs)


def _entry_bytes(pool) -> int:
    """Bytes of one page (or slot) of a pool: its leading axis indexes the entries."""
    return _nbytes(pool) // pool.shape[0]


def moved_bytes(name: str, args: tuple, out, page_size: int) -> int:
    """The bytes one call must move: what it has to read plus what it has to write, from the shapes.

    Dense inputs and outputs count in full. A pool updated in place counts only the entries
    written (and, for paged attention, the pages the rows' lengths address, each read once);
    index arrays count in full (they are small). Re-reads a kernel makes (a KV page per query
    block) are not counted: this is the floor the kernel is measured against."""
    outs = tuple(jax.tree.leaves(out))
    ivals = lambda x: np.asarray(x).astype(np.int64)  # noqa: E731
    pages = lambda tokens: -(-tokens // page_size)  # noqa: E731
    if name == "write_kv":
        kp, vp, k, v, table, start, lengths = args
        per_token = k.shape[2] * k.shape[3] * jnp.dtype(k.dtype).itemsize  # one token of K (or V): [Hkv, D]
        tokens = int(ivals(lengths).clip(0).sum())
        return 2 * 2 * tokens * per_token + _nbytes(table, start, lengths)  # K and V: read the token, write it
    if name in ("prefill_attention", "decode_attention"):
        q, kp, vp, table = args[:4]
        if name == "prefill_attention":
            start, lengths = ivals(args[4]), ivals(args[5])
            keys = np.where(lengths > 0, start + lengths, 0)
        else:
            keys = ivals(args[4]).clip(0)
        read_pages = int(pages(keys).sum())
        return _nbytes(q, *args[3:]) + _nbytes(*outs) + 2 * read_pages * _entry_bytes(kp)
    if name == "gather":
        pool, idx = args
        return int((ivals(idx) >= 0).sum()) * _entry_bytes(pool) + _nbytes(idx, *outs)
    if name == "scatter":
        pool, idx, values = args
        return 2 * int((ivals(idx) >= 0).sum()) * _entry_bytes(pool) + _nbytes(idx)
    if name == "copy":
        pool, src, dst = args
        pairs = int(((ivals(src) >= 0) & (ivals(dst) >= 0)).sum())
        return 2 * pairs * _entry_bytes(pool) + _nbytes(src, dst)
    return _nbytes(*args) + _nbytes(*outs)  # dense: every input read, every output written


def _rel_err(got, want):
    errs = []
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        errs.append((float(np.max(np.abs(a - b), initial=0.0)), float(np.max(np.abs(b), initial=0.0))))
    abs_err = max(e for e, _ in errs)
    rel = max(e / max(1.0, m) for e, m in errs)
    return abs_err, rel


def _fresh(args, feedback):
    """The arguments with a private copy of each donated one (the originals stay valid)."""
    return [jnp.copy(a) if i in feedback else a for i, a in enumerate(args)]


def _time(jf, args, feedback, reps):
    """Median ms of reps calls of `jf` (compiled with the fed-back arguments donated) after one
    warm-up; each call's outputs become the next call's donated arguments."""
    args = _fresh(args, feedback)

    def call():
        out = jax.block_until_ready(jf(*args))
        outs = out if isinstance(out, tuple) else (out,)
        for ai, oi in feedback.items():
            args[ai] = outs[oi]

    call()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _gbs(nbytes: int, ms: float) -> float:
    return nbytes / (ms * 1e-3) / 1e9


def run_kernels(a, shapes, peak) -> list[dict]:
    reps = a.reps if a.reps is not None else (2 if a.tiny else 20)
    only = {x for x in a.only.split(",") if x}
    dtypes = a.dtypes or ("float32" if a.tiny else "float32,bfloat16")
    results = []
    for dt_name in dtypes.split(","):
        cases = _cases(shapes, jnp.dtype(dt_name))
        for name, (fn, args, kw, feedback) in cases.items():
            if only and name not in only:
                continue
            row = {"kernel": name, "dtype": dt_name, "tol": TOL[dt_name]}
            try:
                # One compilation per backend: donating, so correctness runs on private copies.
                donate = tuple(feedback)
                j_ref = jax.jit(functools.partial(fn, backend="xla", **kw), donate_argnums=donate)
                j_new = jax.jit(functools.partial(fn, backend=a.backend, **kw), donate_argnums=donate)
                want = jax.block_until_ready(j_ref(*_fresh(args, feedback)))
                got = jax.block_until_ready(j_new(*_fresh(args, feedback)))
                row["max_abs_err"], row["rel_err"] = _rel_err(got, want)
                row["ok"] = bool(row["rel_err"] <= row["tol"])
                row["bytes"] = moved_bytes(name, args, want, shapes["page_size"])
                for backend, jf in ((a.backend, j_new), ("xla", j_ref)):
                    ms = _time(jf, args, feedback, reps)
                    row["ms_" + backend] = ms
                    row["gbs_" + backend] = _gbs(row["bytes"], ms)
                    row["peak_frac_" + backend] = (row["gbs_" + backend] * 1e9 / peak["bytes_per_s"]
                                                   if peak["bytes_per_s"] else None)
            except Exception as e:  # report every kernel even if one fails to compile
                row["ok"] = False
                row["error"] = f"{type(e).__name__}: {str(e)[:500]}"
                traceback.print_exc(limit=3)
            results.append(row)
            status = "PASS" if row["ok"] else "FAIL"
            if "error" in row:
                detail = row["error"]
            else:
                frac = row["peak_frac_" + a.backend]
                detail = (f"max_abs_err={row['max_abs_err']:.3g} rel={row['rel_err']:.3g} (tol {row['tol']:g})  "
                          f"{a.backend}={row['ms_' + a.backend]:.3f}ms xla={row['ms_xla']:.3f}ms  "
                          f"{row['bytes'] / 1e6:.3g} MB: {a.backend} {row['gbs_' + a.backend]:.1f} GB/s"
                          + (f" ({100 * frac:.0f}% of peak)" if frac is not None else "")
                          + f", xla {row['gbs_xla']:.1f} GB/s")
            print(f"{status} {name:34s} {dt_name:9s} {detail}", flush=True)
    return results


# ----------------------------------------------------------------------------------------- models

from ninfer_jax.bench.geometries import GEOMETRIES  # noqa: E402  (0.8b, 9b: the published shapes)


def _tiny_geometry() -> dict:
    """The CPU smoke model: the built-in model's geometry (4 layers, hidden 64), random weights."""
    from ninfer_jax.model import builtin

    return dict(builtin.HF_CONFIG)


# Seconds a model section needs at least (compiling three buckets dominates); below this much of
# the --budget_s budget left, it is skipped rather than started.
MODEL_MIN_S = {"0.8b": 60.0, "9b": 90.0, "tiny": 0.0}


def random_params(cfg, dtype, seed: int = 0) -> dict:
    """`param_shapes(cfg)` filled on the device: normal * 0.02, the zero-centred norms 0 (scale 1)
    and the GDN output norm (a plain weight) 1."""
    from ninfer_jax.model.weights import param_shapes

    count = iter(range(1 << 30))
    host = np.random.default_rng(seed) if cfg.param_count() < 50_000_000 else None

    @functools.partial(jax.jit, static_argnums=(1,))
    def device_normal(i, shape):  # one compilation per distinct shape; leaf i gets its own key
        key = jax.random.fold_in(jax.random.key(seed), i)
        return jax.random.normal(key, shape, dtype) * jnp.asarray(0.02, dtype)

    def normal(i, shape):  # a small model on the host (no compilations), a large one on the device
        if host is not None:
            return jnp.asarray(host.standard_normal(shape, np.float32) * 0.02, dtype)
        return device_normal(i, shape)

    def leaf(name: str, shape, in_gdn: bool):
        if name == "norm" and in_gdn:
            return jnp.ones(shape, dtype)
        if name.endswith("norm"):
            return jnp.zeros(shape, dtype)
        return normal(np.int32(next(count)), tuple(shape))

    shapes = param_shapes(cfg)
    params = {k: leaf(k, v, False) for k, v in shapes.items() if k != "layers"}
    params["layers"] = [{k: leaf(k, v, "conv" in layer) for k, v in layer.items()} for layer in shapes["layers"]]
    return {k: params[k] for k in shapes}


def _free_device_bytes() -> int | None:
    stats = jax.devices()[0].memory_stats() or {}
    if "bytes_limit" not in stats:
        return None
    return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))


def run_model(res: dict, raw: dict, a, peak: dict, budget_left) -> None:
    """Prefill and decode figures of one random-weight model, into `res` as they are measured (so
    a failure keeps what came before it); raises on a failure, which the caller records.
    `budget_left()` is the seconds left of --budget_s."""
    from ninfer_jax.model.config import parse_config
    from ninfer_jax.model.model import Model
    from ninfer_jax.model.compiled import CompiledSteps
    from ninfer_jax.model.pools import PAGE_SIZE, init_pools
    from ninfer_jax.program.program import decode_buckets

    dtype = jnp.dtype(a.model_dtype)
    cfg = parse_config(raw)
    chunk, prompt_len, steps_n = a.chunk, a.prompt_len, a.decode_steps
    if prompt_len % chunk:
        raise ValueError(f"--prompt_len {prompt_len} is not a multiple of --chunk {chunk}")
    rows = max(a.concurrency)
    warm = 2
    weights = cfg.weights_bytes(dtype.itemsize)
    # A decode step reads every weight but the embedding table, of which it gathers B rows (when
    # the head is tied the table is the head and is read whole).
    step_weights = weights - (0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size * dtype.itemsize)
    name = res["model"]
    res.update({"geometry": {k: raw.get(k) for k in (
                    "hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads",
                    "num_key_value_heads", "head_dim", "linear_num_key_heads", "linear_num_value_heads",
                    "vocab_size", "tie_word_embeddings")},
                "params": cfg.param_count(), "weights_bytes": weights, "dtype": dtype.name,
                "backend": a.model_backend, "chunk": chunk, "prompt_len": prompt_len, "decode_steps": steps_n})

    # Pages for `rows` requests of the prompt plus every decode run (row 0 takes part in each).
    per_row = -(-(prompt_len + len(a.concurrency) * (warm + steps_n) + 1) // PAGE_SIZE)
    num_pages = rows * per_row
    need = int(1.2 * weights) + int(2 * 2**30)
    free = _free_device_bytes()
    res["device_free_bytes"] = free
    if free is not None and free < need:
        res["skipped"] = (f"needs ~{need / 1e9:.1f} GB of device memory (weights {weights / 1e9:.1f} GB), "
                          f"{free / 1e9:.1f} GB free")
        _say(f"{name}: skipped: {res['skipped']}")
        return

    t = time.perf_counter()
    _say(f"{name}: building random weights ({cfg.param_count() / 1e6:,.1f}M parameters, {dtype.name})")
    params = random_params(cfg, dtype)
    model = Model(config=cfg, params=params, dtype=dtype, name=f"random:qwen3.5-{name}-like")
    steps = CompiledSteps(model, backend=a.model_backend, progress=False)
    res["compilations"] = steps.compilations  # made JSON-ready by the caller, failure or not
    kv, state = init_pools(cfg, num_pages, rows, dtype, steps.backend)
    jax.block_until_ready((params, kv, state))
    res["setup_s"] = time.perf_counter() - t
    table = np.arange(num_pages, dtype=np.int32).reshape(rows, per_row)
    prompt = np.random.default_rng(1).integers(0, cfg.vocab_size, prompt_len).astype(np.int32)
    # Every per-call array made up front: the timed loops only dispatch steps.
    i32 = lambda x: jnp.asarray(np.asarray(x, np.int32))  # noqa: E731
    pieces = [(i32(prompt[s:s + chunk][None]), i32([s])) for s in range(0, prompt_len, chunk)]
    length = i32([chunk])
    row_args = [(i32(table[r:r + 1]), i32([r])) for r in range(rows)]

    def prefill_row(kv, state, r: int):
        logits = None
        for tokens, start in pieces:
            logits, _, kv, state = steps.prefill(kv, state, tokens, start, length, *row_args[r])
        jax.block_until_ready(logits)
        return kv, state

    _say(f"{name}: prefill warm-up (compiles the chunk of {chunk})")
    kv, state = prefill_row(kv, state, 0)
    runs = []
    for _ in range(a.prefill_reps):
        t = time.perf_counter()
        kv, state = prefill_row(kv, state, 0)
        runs.append(time.perf_counter() - t)
    res["prefill"] = {"rows": 1, "chunk": chunk, "tokens": prompt_len, "runs_s": runs,
                      "tokens_per_s": prompt_len / statistics.median(runs)}
    _say(f"{name}: prefill {res['prefill']['tokens_per_s']:.0f} tokens/s")

    frontier = np.zeros(rows, np.int64)
    frontier[0] = prompt_len
    res["decode"] = {}
    for c in a.concurrency:
        if budget_left() < (0 if a.tiny else 20):  # rows to prefill and a bucket to compile
            res["decode"][f"c{c}"] = {"skipped": f"time budget: {budget_left():.0f}s left of --budget_s"}
            _say(f"{name}: decode C={c} skipped: time budget nearly spent")
            continue
        for r in range(c):  # every real row starts from a prefilled context
            if frontier[r] == 0:
                kv, state = prefill_row(kv, state, r)
                frontier[r] = prompt_len
        bucket = next(b for b in decode_buckets(max(a.concurrency)) if b >= c)
        pad = bucket - c
        # Padding rows as the engine pads them: token 0, position 0, a zero page table, slot -1.
        tokens = i32(np.concatenate([prompt[-c:], np.zeros(pad)]))
        tab = i32(np.concatenate([table[:c], np.zeros((pad, per_row))]))
        slots = i32(list(range(c)) + [-1] * pad)
        positions = [i32(np.concatenate([frontier[:c] + i, np.zeros(pad)])) for i in range(warm + steps_n)]

        def decode(kv, state, first: int, n: int):
            logits = None
            for i in range(first, first + n):
                logits, _, kv, state = steps.decode(kv, state, tokens, positions[i], tab, slots)
            jax.block_until_ready(logits)
            return kv, state

        _say(f"{name}: decode C={c} warm-up (compiles the bucket of {bucket} rows)")
        kv, state = decode(kv, state, 0, warm)
        t = time.perf_counter()
        kv, state = decode(kv, state, warm, steps_n)
        seconds = time.perf_counter() - t
        context = int(frontier[0]) + warm  # row 0's, at the first timed step
        frontier[:c] += warm + steps_n
        step_s = seconds / steps_n
        fig = {"bucket": bucket, "padding_rows": pad, "context": context,
               "steps": steps_n, "step_ms": 1e3 * step_s, "tokens_per_s": c * steps_n / seconds,
               "weights_read_gbs": step_weights / step_s / 1e9}
        fig["weights_read_peak_frac"] = (fig["weights_read_gbs"] * 1e9 / peak["bytes_per_s"]
                                         if peak["bytes_per_s"] else None)
        res["decode"][f"c{c}"] = fig
        _say(f"{name}: decode C={c}: {fig['tokens_per_s']:.1f} tokens/s, {fig['step_ms']:.2f} ms/step, "
             f"weights {fig['weights_read_gbs']:.0f} GB/s")


def run_models(a, peak: dict, deadline: float) -> list[dict]:
    names = [m for m in a.models.split(",") if m and m != "none"]
    out = []
    for name in names:
        raw = _tiny_geometry() if name == "tiny" else GEOMETRIES.get(name)
        if raw is None:
            out.append({"model": name, "error": f"unknown model; known: {', '.join(['tiny', *GEOMETRIES])}"})
            continue
        left = deadline - time.perf_counter()
        if left < MODEL_MIN_S.get(name, 60.0) and not a.tiny:
            out.append({"model": name, "skipped": f"time budget: {left:.0f}s left of --budget_s {a.budget_s:g}"})
            _say(f"{name}: skipped ({out[-1]['skipped']})")
            continue
        t = time.perf_counter()
        res = {"model": name}
        try:
            run_model(res, raw, a, peak, lambda: deadline - time.perf_counter())
        except Exception as e:  # a failed model is recorded with what it measured; the next one runs
            traceback.print_exc(limit=6)
            res["error"] = f"{type(e).__name__}: {str(e)[:1500]}"
            _say(f"{name}: FAILED {res['error'][:300]}")
        compilations = res.pop("compilations", [])
        if compilations:
            res["compilations"] = [{"kind": c.bucket[0], "tokens_shape": list(c.bucket[1]), "seconds": c.seconds}
                                   for c in compilations]
            res["compile_s_total"] = sum(c.seconds for c in compilations)
        res["wall_s"] = time.perf_counter() - t
        out.append(res)
        gc.collect()  # the model's weights and pools go before the next one is built
    return out


# ------------------------------------------------------------------------------------------- main

def _write(record: dict, path: str) -> None:
    """`record` as JSON to `path` and, when $OUT is set, to $OUT/<its name>; the files written
    (and any that could not be) are recorded in it first."""
    targets = [os.path.abspath(path)]
    if os.environ.get("OUT"):
        targets.append(os.path.abspath(os.path.join(os.environ["OUT"], os.path.basename(path))))
    record["written"] = list(dict.fromkeys(targets))
    for target in record["written"]:
        try:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "w", encoding="utf-8") as f:
                json.dump(record, f, indent=1)
                f.write("\n")
            _say(f"wrote {target}")
        except OSError as e:
            _say(f"could not write {target}: {e}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="pallas", choices=["pallas", "interpret"], help="kernel backend checked")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes and a tiny model (CPU smoke test)")
    ap.add_argument("--reps", type=int, default=None, help="timed kernel runs (default 20, tiny 2)")
    ap.add_argument("--only", default="", help="comma-separated kernel names (none: skip the kernels)")
    ap.add_argument("--dtypes", default=None, help="kernel dtypes; default float32,bfloat16 (tiny: float32)")
    ap.add_argument("--peak_gbs", type=float, default=None, help="peak memory bandwidth in GB/s (overrides the table)")
    ap.add_argument("--models", default=None,
                    help=f"comma-separated: {', '.join(GEOMETRIES)}, tiny or none (default 0.8b,9b; tiny: tiny)")
    ap.add_argument("--model_backend", default=None, help="default pallas on a GPU, xla on a CPU")
    ap.add_argument("--model_dtype", default=None, help="default bfloat16 on a GPU, float32 on a CPU")
    ap.add_argument("--chunk", type=int, default=None, help="prefill tokens per call (default 512, tiny 32)")
    ap.add_argument("--prompt_len", type=int, default=None,
                    help="prefill tokens timed, and the decode context (default 2048, tiny 64)")
    ap.add_argument("--prefill_reps", type=int, default=None, help="timed prefill passes (default 3, tiny 1)")
    ap.add_argument("--decode_steps", type=int, default=None, help="timed decode steps (default 64, tiny 2)")
    ap.add_argument("--concurrency", default="1,8", help="decode rows measured (default 1,8)")
    ap.add_argument("--budget_s", type=float, default=285.0,
                    help="time budget: a model section is not started, nor a decode run, once it is spent")
    ap.add_argument("--out", default="device_check.json", help="the JSON file (also written under $OUT when set)")
    a = ap.parse_args(argv)
    _START[0] = time.perf_counter()
    warnings.filterwarnings("ignore", message=".*donated.*")
    dev = jax.devices()[0]
    gpu = dev.platform != "cpu"
    a.models = a.models if a.models is not None else ("tiny" if a.tiny else "0.8b,9b")
    a.model_backend = a.model_backend or ("pallas" if gpu else "xla")
    a.model_dtype = a.model_dtype or ("bfloat16" if gpu else "float32")
    a.chunk = a.chunk or (32 if a.tiny else 512)
    a.prompt_len = a.prompt_len or (64 if a.tiny else 2048)
    a.prefill_reps = a.prefill_reps or (1 if a.tiny else 3)
    a.decode_steps = a.decode_steps or (2 if a.tiny else 64)
    a.concurrency = sorted({int(c) for c in a.concurrency.split(",") if c})
    if not a.concurrency or a.concurrency[0] < 1 or a.concurrency[-1] > 8:
        ap.error("--concurrency: rows between 1 and 8")
    deadline = _START[0] + a.budget_s
    shapes = TINY if a.tiny else MODERATE
    peak = peak_bandwidth(dev.device_kind, a.peak_gbs)
    print(f"device: {dev.device_kind}  backend: {a.backend}  shapes: {shapes}", flush=True)
    print("peak memory bandwidth: " + (f"{peak['bytes_per_s'] / 1e9:.0f} GB/s ({peak['source']})"
                                       if peak["bytes_per_s"] else f"unknown ({peak['note']})"), flush=True)

    results = [] if a.only == "none" else run_kernels(a, shapes, peak)
    kernels_ok = all(r["ok"] for r in results) and (bool(results) or a.only == "none")
    _say(f"kernels done: {'all pass' if kernels_ok else 'FAILURES'}")
    models = run_models(a, peak, deadline)
    models_ok = not any("error" in m for m in models)
    for m in models:
        parts = []
        if "prefill" in m:
            parts.append(f"{m['dtype']} {m['backend']}: prefill {m['prefill']['tokens_per_s']:.0f} tokens/s")
            dec = ", ".join(f"C={k[1:]} {v['tokens_per_s']:.1f}" for k, v in m.get("decode", {}).items()
                            if "tokens_per_s" in v)
            parts.append(f"decode tokens/s {dec or '-'}")
        if "compile_s_total" in m:
            parts.append(f"compile {m['compile_s_total']:.1f}s")
        if "error" in m:
            parts.append("ERROR " + m["error"][:300])
        elif "skipped" in m:
            parts.append("skipped: " + m["skipped"])
        print(f"MODEL {m['model']:6s} " + ", ".join(parts), flush=True)

    ok = kernels_ok and models_ok
    record = {"device": dev.device_kind, "platform": dev.platform, "jax": jax.__version__,
              "backend": a.backend, "tiny": a.tiny, "ok": ok, "kernels_ok": kernels_ok, "models_ok": models_ok,
              "peak_bytes_per_s": peak["bytes_per_s"], "peak_source": peak["source"],
              **({"peak_note": peak["note"]} if "note" in peak else {}),
              "kernel_shapes": shapes, "results": results, "models": models,
              "elapsed_s": time.perf_counter() - _START[0]}
    _write(record, a.out)
    print(json.dumps(record, separators=(",", ":")))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
