"""`ninfer bench model [--json]`: the model's step functions on the built-in model.

Measures, after warm-up, prefill tokens/s (one row, 64-token chunks), decode steps/s at
1/2/4/8 rows (the engine runs 2/4/8: program.DECODE_BUCKETS), the decode step's time on an 8x
larger Main KV pool ÷ the small one at 1 and 4 requests (in place: near 1), and reports every
compilation with its seconds. When torch and transformers are
importable, the same work runs in transformers (CPU, float32, eager) on the same weights in the
same process, and the ratios NInfer ÷ transformers are reported side by side.

Flags after `model`: --prompt_len N (default 256), --decode_steps N (default 32),
--no_transformers.
"""
from __future__ import annotations

import importlib.util
import math
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from ninfer_jax.model import builtin
from ninfer_jax.model.model import load_model
from ninfer_jax.model.compiled import CompiledSteps
from ninfer_jax.model.pools import PAGE_SIZE, init_pools
from ninfer_jax.bench import int_arg
from ninfer_jax.bench.stats import median

ROWS = (1, 2, 4, 8)
CHUNK = 64


def _say(msg: str) -> None:
    print(f"[bench model] {msg}", file=sys.stderr, flush=True)


def _ours(prompt: np.ndarray, decode_steps: int) -> dict:
    model = load_model(builtin.NAME)
    steps = CompiledSteps(model)
    cfg = model.config
    pages = math.ceil((len(prompt) + decode_steps + 1) / PAGE_SIZE)
    table = jnp.arange(max(ROWS) * pages, dtype=jnp.int32).reshape(max(ROWS), pages)
    kv, state = init_pools(cfg, max(ROWS) * pages, max(ROWS), model.dtype, steps.backend)

    def prefill_all(kv, state, rows: int):
        logits = None
        for start in range(0, len(prompt), CHUNK):
            piece = prompt[start:start + CHUNK]
            tokens = np.zeros((rows, CHUNK), np.int32)
            tokens[:, :len(piece)] = piece
            logits, _, kv, state = steps.prefill(
                kv, state, jnp.asarray(tokens), jnp.full((rows,), start, jnp.int32),
                jnp.full((rows,), len(piece), jnp.int32), table[:rows], jnp.arange(rows, dtype=jnp.int32))
        jax.block_until_ready(logits)
        return kv, state

    _say("warming up prefill")
    kv, state = prefill_all(kv, state, 1)
    start = time.perf_counter()
    kv, state = prefill_all(kv, state, 1)
    prefill_s = time.perf_counter() - start
    out = {"prefill_tokens_per_s": len(prompt) / prefill_s}
    _say(f"prefill {out['prefill_tokens_per_s']:.0f} tokens/s")

    for rows in ROWS:
        kv, state = prefill_all(kv, state, rows)
        tok = jnp.asarray(prompt[-rows:].reshape(rows) if rows <= len(prompt) else np.zeros(rows), jnp.int32)

        def run(n, kv, state):
            logits = None
            for i in range(n):
                pos = jnp.full((rows,), len(prompt) + i, jnp.int32)
                logits, _, kv, state = steps.decode(kv, state, tok, pos, table[:rows],
                                                    jnp.arange(rows, dtype=jnp.int32))
            jax.block_until_ready(logits)
            return kv, state

        kv, state = run(2, kv, state)  # warm-up (compiles this bucket)
        start = time.perf_counter()
        kv, state = run(decode_steps, kv, state)
        out[f"decode_steps_per_s_b{rows}"] = decode_steps / (time.perf_counter() - start)
        _say(f"decode b={rows}: {out[f'decode_steps_per_s_b{rows}']:.1f} steps/s")

    out["compilations"] = len(steps.compilations)
    out["compile_seconds_total"] = sum(c.seconds for c in steps.compilations)
    for c in steps.compilations:
        rows = c.bucket[1][0]
        width = c.bucket[1][1] if c.bucket[0] == "prefill" else 1
        out[f"compile_s_{c.bucket[0]}_b{rows}_t{width}"] = c.seconds
    return out


def _capacity(decode_steps: int, rounds: int = 5) -> dict:
    """In place (issue 33): a decode step's time on a Main KV pool 8x larger ÷ the same step on
    the small pool, same max_context, at 1 request (the 2-row bucket, one padding row) and at 4,
    the two pools' steps timed in turn (`rounds` pairs) so a drifting machine moves both. A step
    that copied a pool inside would scale with its size (4.98 at 1 request before)."""
    model = load_model(builtin.NAME)
    cfg = model.config
    per_request = 8  # max_context 512
    out = {}
    for requests, bucket in ((1, 2), (4, 4)):
        times = {}
        runs = {}
        for scale in (1, 8):
            steps = CompiledSteps(model, progress=False)
            kv, state = init_pools(cfg, scale * 8 * per_request, 8, model.dtype, steps.backend)
            table = np.arange(bucket * per_request, dtype=np.int32).reshape(bucket, per_request)
            slots = np.where(np.arange(bucket) < requests, np.arange(bucket), -1).astype(np.int32)
            tokens = np.full(bucket, 7, np.int32)
            positions = np.where(slots >= 0, 300, 0).astype(np.int32)
            runs[scale] = [steps, kv, state, tokens, positions, table, slots]
            times[scale] = []
        for r in range(rounds + 1):  # round 0 warms up (compiles)
            for scale in (1, 8):
                steps, kv, state, *rest = runs[scale]
                start = time.perf_counter()
                for _ in range(decode_steps):
                    logits, _, kv, state = steps.decode(kv, state, *rest)
                jax.block_until_ready(logits)
                if r:
                    times[scale].append((time.perf_counter() - start) / decode_steps)
                runs[scale][1:3] = [kv, state]
        small, big = (float(median(times[s])) for s in (1, 8))
        out[f"decode_step_s_kv1x_r{requests}"] = small
        out[f"decode_step_s_kv8x_r{requests}"] = big
        out[f"capacity_ratio_r{requests}"] = big / small
        _say(f"decode step with 8x Main KV / 1x at {requests} request(s): {big / small:.3f} "
             f"({big * 1e3:.2f} / {small * 1e3:.2f} ms)")
    return out


def hf_state_dict(p: dict) -> dict:
    """transformers' Qwen3.5 (dense) state dict of a params pytree whose leaves are torch tensors."""
    sd = {"model.embed_tokens.weight": p["embed"], "model.norm.weight": p["norm"]}
    if "lm_head" in p:
        sd["lm_head.weight"] = p["lm_head"].T
    for i, layer in enumerate(p["layers"]):
        pre = f"model.layers.{i}."
        sd[pre + "input_layernorm.weight"] = layer["input_norm"]
        sd[pre + "post_attention_layernorm.weight"] = layer["post_norm"]
        for n in ("gate_proj", "up_proj", "down_proj"):
            sd[pre + f"mlp.{n}.weight"] = layer[n].T
        if "conv" in layer:
            la = pre + "linear_attn."
            for n in ("qkv", "z", "b", "a"):
                sd[la + f"in_proj_{n}.weight"] = layer[f"in_proj_{n}"].T
            sd[la + "conv1d.weight"] = layer["conv"][:, None, :]
            sd[la + "out_proj.weight"] = layer["out_proj"].T
            sd[la + "norm.weight"] = layer["norm"]
            sd[la + "A_log"], sd[la + "dt_bias"] = layer["A_log"], layer["dt_bias"]
        else:
            sa = pre + "self_attn."
            for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
                sd[sa + f"{n}.weight"] = layer[n].T
            sd[sa + "q_norm.weight"], sd[sa + "k_norm.weight"] = layer["q_norm"], layer["k_norm"]
    return sd


def _hf_model(model):
    """transformers' Qwen3.5 model holding the built-in weights (the same numbers)."""
    import torch
    import transformers as tf

    cfg = tf.Qwen3_5TextConfig(**{k: v for k, v in builtin.HF_CONFIG.items() if k != "model_type"})
    hf = tf.Qwen3_5ForCausalLM._from_config(cfg, attn_implementation="eager", dtype=torch.float32).eval()
    p = jax.tree.map(lambda x: torch.from_numpy(np.array(x, dtype=np.float32)), model.params)
    missing, unexpected = hf.load_state_dict(hf_state_dict(p), strict=False)
    if unexpected or [m for m in missing if m != "lm_head.weight"]:
        raise RuntimeError(f"weight transfer to transformers failed: {missing} {unexpected}")
    hf.tie_weights()
    return hf


def hf_decode_seconds(hf, batch, token, steps: int) -> float:
    """The same work as ours: one prefill of `batch` into transformers' cache (not timed), then
    `steps` single-token steps of `token` through its recurrent/KV cache path (timed)."""
    import torch

    with torch.no_grad():
        res = hf(batch, use_cache=True)
        cache = getattr(res, "cache", None) or res.past_key_values
        start = time.perf_counter()
        for _ in range(steps):
            res = hf(token, cache=cache, use_cache=True)
            cache = getattr(res, "cache", None) or res.past_key_values
        return time.perf_counter() - start


def _transformers(prompt: np.ndarray, decode_steps: int) -> dict:
    import torch

    torch.set_num_threads(max(1, torch.get_num_threads()))
    hf = _hf_model(load_model(builtin.NAME))
    ids = torch.tensor(prompt[None].astype(np.int64))
    out = {}
    with torch.no_grad():
        hf(ids, use_cache=False)  # warm-up
        start = time.perf_counter()
        hf(ids, use_cache=True)
        out["hf_prefill_tokens_per_s"] = len(prompt) / (time.perf_counter() - start)
        _say(f"transformers prefill {out['hf_prefill_tokens_per_s']:.0f} tokens/s")
        for rows in ROWS:
            batch = ids.repeat(rows, 1)
            token = batch[:, -1:]

            hf_decode_seconds(hf, batch, token, 2)
            out[f"hf_decode_steps_per_s_b{rows}"] = decode_steps / hf_decode_seconds(hf, batch, token, decode_steps)
            _say(f"transformers decode b={rows}: {out[f'hf_decode_steps_per_s_b{rows}']:.1f} steps/s")
    return out


def _trained() -> dict:
    """The trained built-in model's held-out perplexity and MTP top-1, measured here from its
    shipped files, and the wall time of the training run that made it (its metrics.json)."""
    from ninfer_jax.frontend import Tokenizer
    from ninfer_jax.model.model import load_model
    from ninfer_jax.train import corpus
    from ninfer_jax.train.evaluate import heldout_figures, heldout_windows

    _say("held-out perplexity and MTP accuracy of the trained built-in model")
    folder = builtin.trained_folder()
    got = heldout_figures(load_model(folder, dtype="float32"),
                          heldout_windows(Tokenizer.from_folder(folder), corpus.load().heldout))
    recorded = builtin.trained_metrics()
    return {"builtin_heldout_perplexity": round(got["heldout_perplexity"], 3),
            "builtin_mtp_top1": round(got["mtp_top1"], 4),
            "builtin_train_seconds": recorded["train_seconds"],
            "builtin_train_wall_seconds": recorded["wall_seconds_this_run"]}


def run(argv: list[str]) -> dict:
    prompt_len = int_arg(argv, "prompt_len", 256)
    decode_steps = int_arg(argv, "decode_steps", 32)
    prompt = np.random.default_rng(0).integers(0, 1000, prompt_len).astype(np.int32)
    figures = {"model": builtin.NAME, "backend": "xla", "device": jax.devices()[0].platform,
               "prompt_len": prompt_len, "decode_steps": decode_steps}
    figures.update(_ours(prompt, decode_steps))
    figures.update(_capacity(decode_steps))
    figures.update(_trained())
    have_hf = all(importlib.util.find_spec(m) for m in ("torch", "transformers"))
    if have_hf and "--no_transformers" not in argv:
        hf = _transformers(prompt, decode_steps)
        figures.update(hf)
        figures["ratio_prefill_vs_hf"] = figures["prefill_tokens_per_s"] / hf["hf_prefill_tokens_per_s"]
        for rows in ROWS:
            figures[f"ratio_decode_b{rows}_vs_hf"] = (
                figures[f"decode_steps_per_s_b{rows}"] / hf[f"hf_decode_steps_per_s_b{rows}"])
    else:
        figures["transformers"] = "not installed" if not have_hf else "skipped"
    return figures
