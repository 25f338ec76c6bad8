#!/usr/bin/env python
"""bfloat16 against float32: the compiled decode step's time, and the memory a bf16 decode holds.

Issue 33 ("Dtypes"): a bf16 checkpoint must decode within 1.1x of float32's step time on a CPU,
and its peak RSS while decoding stay within weights + pools + 10%.

time  The decode step (`CompiledSteps.decode`, the engine's buckets) of the same model in
      float32 and in bfloat16, both compiled in this process and timed in turn (--rounds rounds,
      alternating, after a warm-up; a round is --steps steps of the dense model, 20x as many of
      the built-in one, whose step takes well under a millisecond), at --rows rows; reports the
      median step time of each and the median over rounds of bf16 ÷ f32 (each round's pair).
      Two models: the built-in one (`load_model("builtin:tiny-hybrid", dtype)`) and a random
      dense hybrid where the weights
      dominate (DENSE: hidden 1024, 8 layers, intermediate 3584, vocabulary 32000; normal * 0.02
      drawn once in float32 on the Host and rounded to bf16, so both models hold the same values).
rss   A bf16 checkpoint of DENSE (config.json + model.safetensors, written once to --folder by
      a child process) loaded by `load_model` in this process and decoded at the largest of
      --rows: its RSS is read before the load (the Python + JAX runtime), after it, and after
      the step is compiled and warmed up, each time also after glibc's `malloc_trim(0)` (the
      loader and the compiler leave freed heap that glibc keeps: RSS, but nothing holds it);
      then the peak RSS is reset (/proc/self/clear_refs) and --steps steps are decoded.
      Reports the peak over those steps against runtime + weights + pools, what the decode
      steps added to the RSS they started from, and the compiled step's scratch buffer
      (`memory_analysis().temp_size_in_bytes`). "runtime" is read once JAX's CPU client exists
      (one op run) and the model's modules (flax) are imported, so the runtime's own memory is
      not counted as the model's. With --cache DIR the step goes through JAX's persistent
      compilation cache in DIR (`compile_cache.enable`): run it twice and the second process
      reads the executable back instead of compiling it, as a second `ninfer generate` /
      `serve` does; the report says which it did.

    python scripts/bench_dtype.py time            # both models, 2 and 8 rows
    python scripts/bench_dtype.py rss             # a process of its own: peak RSS of a bf16 decode
    python scripts/bench_dtype.py rss --cache /tmp/cc   # twice: the second reads the step from the cache
    python scripts/bench_dtype.py time --plain    # as before issue 33: bf16 products asked for a bf16 result
    python scripts/bench_dtype.py pools [--unpacked]  # decode with 64 vs 8192 KV pages (packed pools)

--plain swaps `layers._product` for a plain `jnp.matmul` (what every product was before this
change), to measure what the change removed.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from ninfer_jax.model import layers
from ninfer_jax.model.config import parse_config
from ninfer_jax.model.model import Model, load_model
from ninfer_jax.model.compiled import CompiledSteps
from ninfer_jax.model.pools import PAGE_SIZE, init_pools
from ninfer_jax.model.weights import hf_tensors, param_shapes

_ROPE = {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25}
DENSE = {
    "model_type": "qwen3_5_text", "vocab_size": 32000, "hidden_size": 1024, "intermediate_size": 3584,
    "num_hidden_layers": 8, "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 2,
    "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256, "rope_parameters": _ROPE,
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_num_key_heads": 16, "linear_num_value_heads": 16, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True, "max_position_embeddings": 32768,
}
CONTEXT = 256  # tokens of Main KV each row holds (its pages); decode runs at position CONTEXT - 1


def _say(msg: str) -> None:
    print(f"[bench dtype] {msg}", file=sys.stderr, flush=True)


def _plain_product(x, w, w_nk):
    precision = jax.lax.Precision.HIGHEST if w.dtype == jnp.float32 else None
    return jnp.matmul(x, w.T if w_nk else w, precision=precision)


def dense_params(seed: int = 0, config: dict | None = None) -> dict:
    """`param_shapes(config)` (DENSE by default) as float32 numpy: normal * 0.02, zero-centred
    norms 0, the GDN output norm 1."""
    rng = np.random.default_rng(seed)

    def leaf(name, shape, gdn):
        if name == "norm" and gdn:
            return np.ones(shape, np.float32)
        if name.endswith("norm"):
            return np.zeros(shape, np.float32)
        return rng.standard_normal(shape, np.float32) * np.float32(0.02)

    shapes = param_shapes(parse_config(config or DENSE))
    params = {k: leaf(k, v, False) for k, v in shapes.items() if k != "layers"}
    params["layers"] = [{k: leaf(k, v, "conv" in layer) for k, v in layer.items()} for layer in shapes["layers"]]
    return {k: params[k] for k in shapes}


def dense_model(dtype, host: dict | None = None) -> Model:
    host = dense_params() if host is None else host
    params = jax.tree.map(lambda a: jnp.asarray(a, dtype), host)
    return Model(config=parse_config(DENSE), params=params, dtype=jnp.dtype(dtype), name="random:dense1024")


class Decoder:
    """One model's compiled decode step at `rows` rows, with its own pools."""

    def __init__(self, model: Model, rows: int, context: int = CONTEXT, unpacked: bool = False):
        cfg = model.config
        self.steps = CompiledSteps(model, progress=False)
        per_row = -(-context // PAGE_SIZE)
        # unpacked: bf16 pools stored as bfloat16, as before packing (the Pallas path's storage)
        storage = "pallas" if unpacked else self.steps.backend
        self.kv, self.state = init_pools(cfg, rows * per_row, rows, model.dtype, storage)
        self.pool_bytes = sum(a.nbytes for a in jax.tree.leaves((self.kv, self.state)))
        self.weight_bytes = sum(a.nbytes for a in jax.tree.leaves(model.params))
        self.args = (jnp.arange(rows, dtype=jnp.int32) % cfg.vocab_size,
                     jnp.full((rows,), context - 1, jnp.int32),
                     jnp.arange(rows * per_row, dtype=jnp.int32).reshape(rows, per_row),
                     jnp.arange(rows, dtype=jnp.int32))

    def run(self, n: int) -> float:
        """Seconds per step over n steps."""
        start = time.perf_counter()
        logits = None
        for _ in range(n):
            logits, _, self.kv, self.state = self.steps.decode(self.kv, self.state, *self.args)
        jax.block_until_ready(logits)
        return (time.perf_counter() - start) / n


def side_by_side(models: dict, rows: int, steps: int, rounds: int, context: int = CONTEXT,
                 unpacked: bool = False) -> dict:
    decoders = {name: Decoder(m, rows, context, unpacked) for name, m in models.items()}
    for d in decoders.values():
        d.run(2)  # compile and warm up
    times = {name: [] for name in decoders}
    for _ in range(rounds):
        for name, d in decoders.items():
            times[name].append(d.run(steps))
    med = {name: statistics.median(t) for name, t in times.items()}
    # The ratio of each round's two neighbouring runs, then their median: load from other
    # processes changes between rounds far more than within one.
    paired = statistics.median(b / f for b, f in zip(times["bfloat16"], times["float32"]))
    return {"rows": rows, "f32_ms": 1e3 * med["float32"], "bf16_ms": 1e3 * med["bfloat16"],
            "bf16_over_f32": paired}


def run_time(a) -> list[dict]:
    out = []
    host = dense_params()
    builders = {"builtin": (lambda dt: load_model("builtin:tiny-hybrid", jnp.dtype(dt).name), 20 * a.steps),
                "dense1024": (lambda dt: dense_model(dt, host), a.steps)}
    for name, (build, steps) in builders.items():
        models = {"float32": build(jnp.float32), "bfloat16": build(jnp.bfloat16)}
        for rows in a.rows:
            fig = dict(model=name, steps=steps, **side_by_side(models, rows, steps, a.rounds, a.context, a.unpacked))
            _say(f"{name} rows={rows}: f32 {fig['f32_ms']:.3f} ms, bf16 {fig['bf16_ms']:.3f} ms, "
                 f"bf16/f32 {fig['bf16_over_f32']:.2f}")
            out.append(fig)
    return out


def run_pools(a) -> list[dict]:
    """The built-in model's decode step at 2 rows with 64 and with 8,192 Main KV pages (the same
    work: each row reads one page), float32 and bf16, 20 steps a round, 8 alternating rounds."""
    out = []
    storage = "pallas" if a.unpacked else "xla"  # "pallas": bf16 stored as bfloat16, unpacked
    for dt in ("float32", "bfloat16"):
        model = load_model("builtin:tiny-hybrid", dt)
        runs = {}
        for pages in (64, 8192):
            steps = CompiledSteps(model, progress=False)
            kv, state = init_pools(model.config, pages, 2, model.dtype, storage)
            args = (jnp.array([5, 7], jnp.int32), jnp.array([9, 9], jnp.int32),
                    jnp.array([[0], [1]], jnp.int32), jnp.array([0, 1], jnp.int32))
            runs[pages] = [steps, kv, state, args]
        times = {p: [] for p in runs}
        for r in range(8):
            for p, run in runs.items():
                steps, kv, state, args = run
                start = time.perf_counter()
                for _ in range(20):
                    logits, _, kv, state = steps.decode(kv, state, *args)
                jax.block_until_ready(logits)
                if r:  # the first round compiles
                    times[p].append((time.perf_counter() - start) / 20)
                run[1], run[2] = kv, state
        ms = {p: 1e3 * statistics.median(t) for p, t in times.items()}
        out.append({"dtype": dt, "ms_64_pages": ms[64], "ms_8192_pages": ms[8192], "ratio": ms[8192] / ms[64]})
        _say(f"built-in {dt}{' unpacked' if a.unpacked else ''}: {ms[64]:.3f} ms on 64 pages, "
             f"{ms[8192]:.3f} ms on 8192 (ratio {ms[8192] / ms[64]:.2f})")
    return out


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def _rss_trimmed() -> tuple[int, int]:
    """RSS bytes, then RSS bytes after glibc returns the free heap it keeps (`malloc_trim(0)`)."""
    import ctypes

    before = _status_kb("VmRSS") * 1024
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return before, _status_kb("VmRSS") * 1024


def rss_config(geometry: str) -> dict:
    """The checkpoint `rss` decodes: DENSE, or a `bench.geometries` geometry (e.g. "0.8b", the
    published Qwen3.5-0.8B's text shapes: a model whose size is a real one's)."""
    if geometry == "dense1024":
        return DENSE
    from ninfer_jax.bench.geometries import GEOMETRIES

    return GEOMETRIES[geometry]


def save_checkpoint(folder: str, geometry: str = "dense1024") -> None:
    """The geometry as a bf16 Hugging Face folder (the values `dense_params` draws, rounded once)."""
    import ml_dtypes
    from safetensors.numpy import save_file

    os.makedirs(folder, exist_ok=True)
    config = rss_config(geometry)
    tensors = {k: v.astype(ml_dtypes.bfloat16)
               for k, v in hf_tensors(dense_params(config=config), None, parse_config(config)).items()}
    save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({**config, "dtype": "bfloat16"}, f)


def run_rss(a) -> dict:
    a.folder = a.folder or f"/tmp/ninfer_bench_{a.geometry}_bf16"
    if not os.path.exists(os.path.join(a.folder, "model.safetensors")):
        _say(f"writing the bf16 {a.geometry} checkpoint to {a.folder} (a child process)")
        subprocess.run([sys.executable, __file__, "save", "--folder", a.folder, "--geometry", a.geometry],
                       check=True)
    if a.cache:
        from ninfer_jax import compile_cache
        compile_cache.enable(a.cache)
    # The runtime, before any weight: the CPU client exists and the model's modules (flax, 34 MiB
    # of code that `Model.functional` would import later) are loaded, as in any NInfer process.
    importlib.import_module("ninfer_jax.model.modules")
    jax.block_until_ready(jnp.zeros(1) + 1)
    rss = {"runtime": _status_kb("VmRSS") * 1024}
    model = load_model(a.folder)  # "auto": the checkpoint's bfloat16
    assert model.dtype_name == "bfloat16"
    rss["loaded"], rss["loaded_trimmed"] = _rss_trimmed()
    d = Decoder(model, max(a.rows), a.context, a.unpacked)
    counter = None
    if a.cache:
        from ninfer_jax.compile_cache import CompileCounter
        counter = CompileCounter().start()
    d.run(2)  # compile (or read back) and warm up
    if counter is not None:
        counter.stop()
    rss["compiled"], rss["compiled_trimmed"] = _rss_trimmed()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := the current RSS
    d.run(a.steps)
    rss["decode_peak"] = _status_kb("VmHWM") * 1024
    budget = d.weight_bytes + d.pool_bytes
    exe = next(e for bucket, e in d.steps._executables.items() if bucket[0] == "decode")
    temp = exe.memory_analysis().temp_size_in_bytes  # XLA's scratch buffer for one step
    fig = {"model": a.geometry, "rows": max(a.rows), "weights_bytes": d.weight_bytes, "pools_bytes": d.pool_bytes,
           "step_temp_bytes": temp, "rss_bytes": rss,
           "peak_over_runtime_weights_pools": rss["decode_peak"] / (rss["runtime"] + budget),
           "peak_less_runtime_over_weights_pools": (rss["decode_peak"] - rss["runtime"]) / budget,
           "executables": None if counter is None else {"compiled": counter.compiled,
                                                        "from_cache": counter.cache_hits},
           "decode_added_bytes": rss["decode_peak"] - rss["compiled_trimmed"]}
    mib = lambda b: f"{b / 2**20:.0f} MiB"  # noqa: E731
    _say(f"bf16 {a.geometry}: runtime {mib(rss['runtime'])}, loaded {mib(rss['loaded'])} (trimmed "
         f"{mib(rss['loaded_trimmed'])}), compiled {mib(rss['compiled'])} (trimmed "
         f"{mib(rss['compiled_trimmed'])}), peak while decoding {mib(rss['decode_peak'])} (the steps added "
         f"{mib(fig['decode_added_bytes'])}, XLA's scratch for one step {mib(temp)}); "
         f"weights {mib(d.weight_bytes)} + pools {mib(d.pool_bytes)}: "
         f"peak / (runtime + weights + pools) = {fig['peak_over_runtime_weights_pools']:.3f}, "
         f"(peak - runtime) / (weights + pools) = {fig['peak_less_runtime_over_weights_pools']:.3f}"
         + ("" if counter is None else f"; executables {counter.compiled} compiled, {counter.cache_hits} from cache"))
    return fig


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("time", "rss", "pools", "save"))
    p.add_argument("--rows", type=int, nargs="+", default=[2, 8], help="decode bucket(s)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--plain", action="store_true", help="bf16 products as before issue 33 (jnp.matmul)")
    p.add_argument("--context", type=int, default=CONTEXT, help="Main KV tokens per row (the pools' size)")
    p.add_argument("--unpacked", action="store_true",
                   help="bf16 pools stored as bfloat16, as before packing (XLA's CPU scatter converts them whole)")
    p.add_argument("--folder", default=None, help="rss: the bf16 checkpoint (default /tmp/ninfer_bench_GEOMETRY_bf16)")
    p.add_argument("--geometry", default="dense1024", choices=("dense1024", "0.8b", "small"),
                   help="rss: DENSE, or a bench.geometries geometry (0.8b: Qwen3.5-0.8B's text shapes)")
    p.add_argument("--cache", default=None, help="rss: JAX's persistent compilation cache folder (run twice)")
    a = p.parse_args(argv)
    if a.what == "save":
        return save_checkpoint(a.folder or f"/tmp/ninfer_bench_{a.geometry}_bf16", a.geometry)
    if a.plain:
        layers._product = _plain_product
    res = {"time": run_time, "rss": run_rss, "pools": run_pools}[a.what](a)
    print(json.dumps({"what": a.what, "plain": a.plain, "context": a.context, "unpacked": a.unpacked, "backend": jax.default_backend(),
                      "jax": jax.__version__, "results": res}))


if __name__ == "__main__":
    main()
