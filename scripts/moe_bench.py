#!/usr/bin/env python
"""MoE decode speed (issue 33): `layers.moe` (expert tiles, `routed_experts`) against the
`ragged_dot` MoE it replaced and against transformers, on one random MoE built in memory.

The model: a Qwen3-Next-shaped MoE of `GEOMETRY` (hidden 1024, 8 layers of 3 Gated DeltaNet + 1
gated attention, every layer MoE: 64 experts of intermediate 256, top-8, a shared expert of 512),
as a `qwen3_5_moe_text` config (the same MoE block as Qwen3-Next, plain GDN projections, so
transformers reads our tensors as they are written), float32 weights normal * 0.02
(`device_check.random_params`), or those weights rounded to bfloat16 with --dtype=bfloat16 (both
sides round the same float32 values to nearest even, so they hold the same bf16 weights). Nothing
is downloaded.

Measured in one process, after a warm-up that compiles every bucket: decode tokens/s at C = 1
(the engine's 2-row bucket, the second a padding row of slot -1) and C = 8, each row at a context
of --prompt_len tokens, and the prefill of the prompt (chunks of 64 tokens, one row). "before"
runs `RAGGED_MOE` (the code before the rewrite, kept here only for this comparison), "after"
`layers.moe`; the two are timed in turn, --rounds pairs, so a drifting machine moves both;
medians. With torch and transformers
importable, `Qwen3_5MoeForCausalLM` (the same dtype, eager attention, its default experts
implementation unless --hf_experts) runs the same weights in the same process, one prefill of the
prompt into its cache, then single-token steps, after all of ours (see `main`: interleaving the
two frameworks slows whichever runs second).

    python scripts/moe_bench.py                     # about 10 minutes on 2 CPU cores
    python scripts/moe_bench.py --no_before --rounds 5
    python scripts/moe_bench.py --no_before --dtype bfloat16

The last stdout line is the JSON record; progress goes to stderr.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from ninfer_jax.model import layers  # noqa: E402

GEOMETRY = {
    "model_type": "qwen3_5_moe_text", "vocab_size": 32000, "hidden_size": 1024, "num_hidden_layers": 8,
    "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 2,
    "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                        "mrope_interleaved": True, "mrope_section": [11, 11, 10]},
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_num_key_heads": 8, "linear_num_value_heads": 16,
    "num_experts": 64, "num_experts_per_tok": 8, "moe_intermediate_size": 256,
    "shared_expert_intermediate_size": 512, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    "max_position_embeddings": 4096,
}
CHUNK = 64


def _say(msg: str) -> None:
    print(f"[moe_bench] {msg}", file=sys.stderr, flush=True)


def RAGGED_MOE(p, x, cfg, rows=None):  # rows: every token runs, as before
    """`layers.moe` before issue 33's rewrite: grouped matmuls with `jax.lax.ragged_dot`, whose
    CPU lowering densifies every expert tensor; the k outputs scatter-added by sorted position."""
    lead, hidden = x.shape[:-1], x.shape[-1]
    flat = x.reshape(-1, hidden)
    top_k, num_experts = cfg.num_experts_per_tok, cfg.num_experts
    probs = layers.softmax(layers.matmul(flat, p["router"]).astype(jnp.float32))
    weights, experts = jax.lax.top_k(probs, top_k)
    if cfg.norm_topk_prob:
        weights = weights / layers.tree_sum(weights)[..., None]
    weights = weights.astype(x.dtype)
    expert_of = experts.reshape(-1)
    order = jnp.argsort(expert_of, stable=True)
    token_of = order // top_k
    rows = flat[token_of]
    sizes = jnp.bincount(expert_of, length=num_experts).astype(jnp.int32)
    precision = jax.lax.Precision.HIGHEST if x.dtype == jnp.float32 else None
    gate = jax.lax.ragged_dot(rows, p["experts_gate"], sizes, precision=precision)
    up = jax.lax.ragged_dot(rows, p["experts_up"], sizes, precision=precision)
    out = jax.lax.ragged_dot(jax.nn.silu(gate) * up, p["experts_down"], sizes, precision=precision)
    out = out * weights.reshape(-1)[order][:, None]
    routed = jnp.zeros_like(flat).at[token_of].add(out)
    if "shared_gate_proj" in p:
        shared = layers.dense_mlp({"gate_proj": p["shared_gate_proj"], "up_proj": p["shared_up_proj"],
                                   "down_proj": p["shared_down_proj"]}, flat)
        shared = jax.nn.sigmoid(layers.matmul(flat, p["shared_expert_gate"]).astype(jnp.float32)) * shared
        routed = routed + shared.astype(flat.dtype)
    return routed.reshape(*lead, hidden)


class Ours:
    """One CompiledSteps over the model with its own pools, `moe` the MoE its steps trace with."""

    def __init__(self, model, moe, rows: int, prompt: np.ndarray, steps_n: int):
        from ninfer_jax.model.compiled import CompiledSteps
        from ninfer_jax.model.pools import PAGE_SIZE, init_pools

        self.moe, self.prompt, self.steps_n = moe, prompt, steps_n
        self.steps = CompiledSteps(model, progress=False)
        self.per_row = -(-(len(prompt) + steps_n + 1) // PAGE_SIZE)
        self.kv, self.state = init_pools(model.config, rows * self.per_row, rows, model.dtype, self.steps.backend)
        self.table = np.arange(rows * self.per_row, dtype=np.int32).reshape(rows, self.per_row)

    def _traced(self, fn, *args):
        saved, layers.moe = layers.moe, self.moe  # the steps trace (compile) on their first call
        try:
            return fn(*args)
        finally:
            layers.moe = saved

    def prefill(self, row: int) -> float:
        start = time.perf_counter()
        logits = None
        for s in range(0, len(self.prompt), CHUNK):
            tokens = jnp.asarray(self.prompt[None, s:s + CHUNK])
            logits, _, self.kv, self.state = self._traced(
                self.steps.prefill, self.kv, self.state, tokens, jnp.asarray([s], jnp.int32),
                jnp.asarray([tokens.shape[1]], jnp.int32), jnp.asarray(self.table[row:row + 1]),
                jnp.asarray([row], jnp.int32))
        jax.block_until_ready(logits)
        return time.perf_counter() - start

    def decode(self, c: int) -> float:
        """Seconds for steps_n decode steps of rows 0..c-1 (bucket 2 for c = 1: one padding row)."""
        bucket = max(2, c)
        pad = bucket - c
        tokens = jnp.asarray(np.concatenate([self.prompt[-c:], np.zeros(pad, np.int32)]).astype(np.int32))
        table = jnp.asarray(np.concatenate([self.table[:c], np.zeros((pad, self.per_row), np.int32)]))
        slots = jnp.asarray(list(range(c)) + [-1] * pad, jnp.int32)
        positions = [jnp.asarray([len(self.prompt) + i] * c + [0] * pad, jnp.int32) for i in range(self.steps_n)]
        logits = None
        start = time.perf_counter()
        for pos in positions:
            logits, _, self.kv, self.state = self._traced(self.steps.decode, self.kv, self.state, tokens, pos,
                                                          table, slots)
        jax.block_until_ready(logits)
        return time.perf_counter() - start


class Transformers:
    def __init__(self, model, prompt: np.ndarray, steps_n: int, experts: str | None, host: dict):
        import torch
        import transformers
        from safetensors.numpy import save_file

        from ninfer_jax.model.weights import hf_tensors

        self.torch, self.prompt, self.steps_n = torch, prompt, steps_n
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "config.json"), "w") as f:
                json.dump(dict(GEOMETRY, architectures=["Qwen3_5MoeForCausalLM"], dtype="float32"), f)
            # the float32 weights; loading them as `dtype` rounds them as ours were rounded
            save_file(hf_tensors(host, None, model.config), os.path.join(folder, "model.safetensors"))
            kwargs = {} if experts is None else {"experts_implementation": experts}
            dtype = torch.bfloat16 if model.dtype == jnp.bfloat16 else torch.float32
            self.hf = transformers.AutoModelForCausalLM.from_pretrained(
                folder, attn_implementation="eager", dtype=dtype, **kwargs).eval()
        self.experts = self.hf.config._experts_implementation
        self.caches = {}

    def logits(self, tokens: np.ndarray) -> np.ndarray:
        with self.torch.no_grad():
            out = self.hf(self.torch.tensor(tokens[None].astype(np.int64)), use_cache=False).logits[0]
            return out.float().numpy()

    def decode(self, c: int) -> float:
        torch = self.torch
        with torch.no_grad():
            if c not in self.caches:  # one prefill of the prompt per batch size, then its cache grows
                batch = torch.tensor(np.tile(self.prompt[None].astype(np.int64), (c, 1)))
                self.caches[c] = self.hf(batch, use_cache=True).past_key_values
            token = torch.tensor(self.prompt[-c:].astype(np.int64)[:, None])
            start = time.perf_counter()
            for _ in range(self.steps_n):
                res = self.hf(token, cache=self.caches[c], use_cache=True)
                self.caches[c] = getattr(res, "cache", None) or res.past_key_values
            return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompt_len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=8, help="decode steps per timed run")
    ap.add_argument("--rounds", type=int, default=3, help="timed runs of each side, in turn")
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--no_before", action="store_true", help="skip the ragged_dot MoE")
    ap.add_argument("--no_transformers", action="store_true")
    ap.add_argument("--hf_experts", default=None, help="transformers' experts_implementation (default: its own)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                    help="the weights' (and pools') dtype on both sides")
    a = ap.parse_args()
    from device_check import random_params

    from ninfer_jax.model.config import parse_config
    from ninfer_jax.model.model import Model

    cfg = parse_config(GEOMETRY)
    concurrency = [int(c) for c in a.concurrency.split(",")]
    rows = max(concurrency)
    _say(f"building random weights ({cfg.param_count() / 1e6:.0f}M parameters, {a.dtype})")
    f32 = random_params(cfg, jnp.float32)
    prompt = np.random.default_rng(1).integers(0, cfg.vocab_size, a.prompt_len).astype(np.int32)
    host = jax.tree.map(np.asarray, f32) if not a.no_transformers else None
    params = f32 if a.dtype == "float32" else jax.tree.map(lambda w: w.astype(jnp.bfloat16), f32)
    reference = None  # bf16: both sides' logits against the float32 model's, the fair yardstick
    if a.dtype != "float32" and not a.no_transformers:
        reference = np.asarray(Model(config=cfg, params=f32, dtype=jnp.dtype(jnp.float32),
                                     name="random:f32").forward(prompt[:32]))
    del f32
    model = Model(config=cfg, params=params, dtype=jnp.dtype(a.dtype), name="random:qwen3-next-shaped-moe")
    sides = {"after": Ours(model, layers.moe, rows, prompt, a.steps)}
    if not a.no_before:
        sides["before"] = Ours(model, RAGGED_MOE, rows, prompt, a.steps)
    have_hf = all(importlib.util.find_spec(m) for m in ("torch", "transformers"))
    hf = None
    if have_hf and not a.no_transformers:
        _say("transformers: writing the weights and loading them")
        hf = Transformers(model, prompt, a.steps, a.hf_experts, host)
    host = None
    record = {"geometry": GEOMETRY, "params": cfg.param_count(), "dtype": a.dtype,
              "device": jax.devices()[0].platform,
              "prompt_len": a.prompt_len, "decode_steps": a.steps, "rounds": a.rounds,
              "jax": jax.__version__, "transformers_experts": hf.experts if hf else None}
    if hf is not None:  # the two models hold the same weights: their logits agree
        ours, theirs = np.asarray(model.forward(prompt[:32]), np.float32), hf.logits(prompt[:32])
        record["logits_max_abs"] = float(np.abs(ours).max())
        record["logits_max_abs_diff_vs_transformers"] = float(np.abs(ours - theirs).max())
        _say(f"logits vs transformers: max abs diff {record['logits_max_abs_diff_vs_transformers']:.2e} "
             f"(largest logit {record['logits_max_abs']:.2f})")
        if reference is not None:
            for name, got in (("ours", ours), ("transformers", theirs)):
                record[f"{name}_max_abs_diff_vs_float32"] = float(np.abs(got - reference).max())
            _say(f"against the float32 model: ours {record['ours_max_abs_diff_vs_float32']:.2e}, "
                 f"transformers {record['transformers_max_abs_diff_vs_float32']:.2e}")

    prefill = {name: [] for name in sides}
    for name, side in sides.items():
        # Row 0 is prefilled; the other rows decode from zeroed state at the same positions, which
        # costs the same work (a step reads every page up to its position, whatever they hold).
        _say(f"{name}: warm-up (compiles the prefill chunk and the decode buckets)")
        side.prefill(0)
        for c in concurrency:
            side.decode(c)
    for _ in range(a.rounds):
        for name, side in sides.items():
            prefill[name].append(side.prefill(0))
    for name in sides:
        record[f"{name}_prefill_tokens_per_s"] = a.prompt_len / statistics.median(prefill[name])
        _say(f"{name}: prefill {record[f'{name}_prefill_tokens_per_s']:.1f} tokens/s")
    times = {(name, c): [] for name in sides for c in concurrency}
    for _ in range(a.rounds):
        for c in concurrency:
            for name, side in sides.items():
                times[(name, c)].append(side.decode(c))
    if hf is not None:
        # After every JAX run, not between them: each framework's idle worker threads spin for a
        # while after its last op, and a step of the other one started then runs several times
        # slower (transformers measured 8x slower interleaved with our steps on 2 cores).
        time.sleep(2.0)
        for c in concurrency:
            hf.decode(c)  # warm-up: the prompt's prefill into its cache, then steps
            for _ in range(a.rounds):
                times[("transformers", c)] = times.get(("transformers", c), []) + [hf.decode(c)]
    for (name, c), t in times.items():
        record[f"{name}_decode_tokens_per_s_c{c}"] = c * a.steps / statistics.median(t)
        record[f"{name}_decode_step_ms_c{c}"] = 1e3 * statistics.median(t) / a.steps
    for c in concurrency:
        names = [name for (name, cc) in times if cc == c]
        if "before" in sides:
            record[f"after_vs_before_c{c}"] = (record[f"after_decode_tokens_per_s_c{c}"]
                                               / record[f"before_decode_tokens_per_s_c{c}"])
        if hf is not None:
            for name in sides:
                record[f"{name}_vs_transformers_c{c}"] = (record[f"{name}_decode_tokens_per_s_c{c}"]
                                                          / record[f"transformers_decode_tokens_per_s_c{c}"])
        line = ", ".join(f"{name} {record[f'{name}_decode_tokens_per_s_c{c}']:.2f}" for name in names)
        _say(f"decode C={c} tokens/s: {line}")
    print(json.dumps(record))


if __name__ == "__main__":
    main()
