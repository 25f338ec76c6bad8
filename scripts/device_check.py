#!/usr/bin/env python
"""Device check for pallas_kernels: each kernel's backend (default "pallas") against "xla".

For every kernel and dtype (float32, bfloat16) it prints the max abs error against the
pure-JAX reference, pass/fail, and the median wall time of both backends over --reps runs
after a warm-up (outputs fed back with donation where the kernel updates a pool or state in
place). The last line is one JSON summary; the exit status is 1 if any kernel mismatched or
failed to compile.

    python scripts/device_check.py                           # GPU: moderate shapes
    python scripts/device_check.py --backend interpret --tiny  # CPU smoke test, seconds
"""
from __future__ import annotations

import argparse
import functools
import json
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

# Error is max|got - want| / max(1, max|want|): outputs are O(1), states may be larger.
TOL = {"float32": 2e-4, "bfloat16": 3e-2}

MODERATE = dict(rows=8, context=4096, chunk=512, hq=16, hkv=2, head_dim=256, page_size=64,
                gdn_heads=32, dk=128, dv=128, gdn_chunk=64, conv_channels=8192, copies=16)
TINY = dict(rows=2, context=64, chunk=12, hq=4, hkv=2, head_dim=32, page_size=16,
            gdn_heads=2, dk=16, dv=32, gdn_chunk=16, conv_channels=64, copies=3)


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


def _rel_err(got, want):
    errs = []
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        errs.append((float(np.max(np.abs(a - b), initial=0.0)), float(np.max(np.abs(b), initial=0.0))))
    abs_err = max(e for e, _ in errs)
    rel = max(e / max(1.0, m) for e, m in errs)
    return abs_err, rel


def _time(fn, args, feedback, reps, jitted=None):
    """Median ms of reps calls after one warm-up; fed-back arguments are donated.

    With `jitted` (tiny mode) the already compiled, non-donating function is reused: one
    compilation per kernel instead of two.
    """
    if jitted is not None:
        jf, feedback = jitted, {}
    else:
        jf = jax.jit(fn, donate_argnums=tuple(feedback))
        args = [jnp.copy(a) if i in feedback else a for i, a in enumerate(args)]

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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="pallas", choices=["pallas", "interpret"])
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (CPU smoke test)")
    ap.add_argument("--reps", type=int, default=None, help="timed runs (default 20, tiny 2)")
    ap.add_argument("--only", default="", help="comma-separated kernel names")
    ap.add_argument("--dtypes", default=None, help="default float32,bfloat16 (tiny: float32)")
    a = ap.parse_args(argv)
    warnings.filterwarnings("ignore", message=".*donated.*")
    shapes = TINY if a.tiny else MODERATE
    reps = a.reps if a.reps is not None else (2 if a.tiny else 20)
    only = {x for x in a.only.split(",") if x}
    dtypes = a.dtypes or ("float32" if a.tiny else "float32,bfloat16")
    print(f"device: {jax.devices()[0].device_kind}  backend: {a.backend}  shapes: {shapes}", flush=True)

    results = []
    for dt_name in dtypes.split(","):
        cases = _cases(shapes, jnp.dtype(dt_name))
        for name, (fn, args, kw, feedback) in cases.items():
            if only and name not in only:
                continue
            row = {"kernel": name, "dtype": dt_name, "tol": TOL[dt_name]}
            try:
                f_ref = functools.partial(fn, backend="xla", **kw)
                f_new = functools.partial(fn, backend=a.backend, **kw)
                j_ref, j_new = jax.jit(f_ref), jax.jit(f_new)
                want = jax.block_until_ready(j_ref(*args))
                got = jax.block_until_ready(j_new(*args))
                row["max_abs_err"], row["rel_err"] = _rel_err(got, want)
                row["ok"] = bool(row["rel_err"] <= row["tol"])
                row["ms_" + a.backend] = _time(f_new, args, feedback, reps, j_new if a.tiny else None)
                row["ms_xla"] = _time(f_ref, args, feedback, reps, j_ref if a.tiny else None)
            except Exception as e:  # report every kernel even if one fails to compile
                row["ok"] = False
                row["error"] = f"{type(e).__name__}: {str(e)[:500]}"
                traceback.print_exc(limit=3)
            results.append(row)
            status = "PASS" if row["ok"] else "FAIL"
            detail = row.get("error") or (
                f"max_abs_err={row['max_abs_err']:.3g} rel={row['rel_err']:.3g} (tol {row['tol']:g})  "
                f"{a.backend}={row['ms_' + a.backend]:.3f}ms xla={row['ms_xla']:.3f}ms"
            )
            print(f"{status} {name:34s} {dt_name:9s} {detail}", flush=True)

    ok = all(r["ok"] for r in results) and bool(results)
    print(json.dumps({"device": jax.devices()[0].device_kind, "backend": a.backend, "tiny": a.tiny,
                      "ok": ok, "results": results}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
