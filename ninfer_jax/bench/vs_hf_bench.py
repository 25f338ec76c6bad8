"""`ninfer bench vs_hf [--json]`: decode tokens/s of NInfer ÷ transformers on one random checkpoint.

The same random weights (`modules.init_params`) go into the engine's compiled steps and into
transformers' Qwen3.5 model (CPU, eager attention), in float32 and bfloat16, at batch 1 and 8.
Each side prefills the same prompt into every row, then times `--decode_steps` single-token
steps through its own cache; the two run in turn for `--rounds` rounds and the medians are
compared, so a machine that drifts moves both. NInfer runs the engine's decode buckets (batch 1
is the 2-row bucket with a padding row, program.DECODE_BUCKETS).

Flags after `vs_hf`: --geometry=0.8b|small (default small: a 0.8B-shaped model cut to 8 layers
and a 32k vocabulary, minutes on 2 cores; 0.8b: the Qwen3.5-0.8B-like text geometry),
--dtypes=float32,bfloat16, --rows=1,8, --prompt_len=64, --decode_steps=8, --rounds=3.
"""
from __future__ import annotations

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from ninfer_jax.bench import int_arg
from ninfer_jax.bench.geometries import GEOMETRIES
from ninfer_jax.bench.model_bench import hf_decode_seconds
from ninfer_jax.bench.stats import median


def _say(msg: str) -> None:
    print(f"[bench vs_hf] {msg}", file=sys.stderr, flush=True)


def _list_arg(argv: list[str], name: str, default: str) -> list[str]:
    for i, a in enumerate(argv):
        if a.startswith(f"--{name}="):
            return [x for x in a.split("=", 1)[1].split(",") if x]
        if a == f"--{name}" and i + 1 < len(argv):
            return [x for x in argv[i + 1].split(",") if x]
    return default.split(",")


def _models(geometry: dict, dtype: str):
    """(our Model, transformers model) over the same random weights."""
    import torch
    import transformers as tf

    from ninfer_jax.model.config import parse_config
    from ninfer_jax.model.model import DTYPES, Model
    from ninfer_jax.model.modules import init_params
    from ninfer_jax.bench.model_bench import hf_state_dict

    cfg = parse_config(dict(geometry))
    params, _ = init_params(cfg, seed=0, dtype=np.float32)
    ours = Model(cfg, jax.tree.map(lambda a: jnp.asarray(a, DTYPES[dtype]), params), DTYPES[dtype], "random")
    hf_cfg = tf.Qwen3_5TextConfig(**{k: v for k, v in geometry.items() if k != "model_type"})
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    hf = tf.Qwen3_5ForCausalLM._from_config(hf_cfg, attn_implementation="eager", dtype=torch_dtype).eval()
    sd = hf_state_dict(jax.tree.map(lambda a: torch.from_numpy(np.asarray(a, np.float32)).to(torch_dtype), params))
    missing, unexpected = hf.load_state_dict(sd, strict=False)
    if unexpected or [m for m in missing if m != "lm_head.weight"]:
        raise RuntimeError(f"weight transfer to transformers failed: {missing} {unexpected}")
    hf.tie_weights()
    _same_numbers(ours, hf, dtype)
    return ours, hf


def _same_numbers(ours, hf, dtype: str) -> None:
    """Both models give the same logits on a few tokens (else the comparison would be of two
    different models): float32 to 1e-3, bfloat16 loosely."""
    import torch

    tokens = np.arange(1, 9, dtype=np.int32)
    a = np.asarray(ours.forward(tokens), np.float32)
    with torch.no_grad():
        b = hf(torch.tensor(tokens[None].astype(np.int64))).logits[0].float().numpy()
    err = float(np.abs(a - b).max() / max(1.0, np.abs(b).max()))
    if err > (1e-3 if dtype == "float32" else 0.1):
        raise RuntimeError(f"NInfer and transformers disagree on the same weights ({dtype}): relative error {err:.3g}")


def _ours(model, prompt: np.ndarray, rows: int, steps: int):
    """A function timing `steps` decode steps of `rows` rows (prefilled once, on first call)."""
    from ninfer_jax.model.compiled import CompiledSteps
    from ninfer_jax.model.pools import PAGE_SIZE, init_pools
    from ninfer_jax.program.program import decode_buckets

    bucket = next(b for b in decode_buckets(8) if b >= rows)
    per_row = -(-(len(prompt) + 1024) // PAGE_SIZE)
    compiled = CompiledSteps(model, progress=False)
    kv, state = init_pools(model.config, bucket * per_row, bucket, model.dtype, compiled.backend)
    table = np.arange(bucket * per_row, dtype=np.int32).reshape(bucket, per_row)
    chunk = np.zeros((1, 64), np.int32)
    for r in range(rows):
        for at in range(0, len(prompt), 64):
            piece = prompt[at:at + 64]
            chunk[:] = 0
            chunk[0, :len(piece)] = piece
            _, _, kv, state = compiled.prefill(kv, state, chunk, np.array([at], np.int32),
                                               np.array([len(piece)], np.int32), table[r:r + 1], np.array([r], np.int32))
    slots = np.where(np.arange(bucket) < rows, np.arange(bucket), -1).astype(np.int32)
    tokens = np.full(bucket, int(prompt[-1]), np.int32)
    pools = [kv, state]

    def run() -> float:
        kv, state = pools
        start = time.perf_counter()
        for i in range(steps):
            positions = np.where(slots >= 0, len(prompt) + i, 0).astype(np.int32)
            logits, _, kv, state = compiled.decode(kv, state, tokens, positions, table, slots)
        jax.block_until_ready(logits)
        pools[:] = [kv, state]
        return time.perf_counter() - start

    return run


def _theirs(hf, prompt: np.ndarray, rows: int, steps: int):
    import torch

    ids = torch.tensor(np.repeat(prompt[None].astype(np.int64), rows, axis=0))
    token = ids[:, -1:]

    return lambda: hf_decode_seconds(hf, ids, token, steps)


def run(argv: list[str]) -> dict:
    import importlib.util

    if not all(importlib.util.find_spec(m) for m in ("torch", "transformers")):
        return {"transformers": "not installed"}
    name = _list_arg(argv, "geometry", "small")[0]
    if name not in GEOMETRIES:
        raise SystemExit(f"ninfer bench vs_hf: unknown --geometry {name!r}; choose one of {sorted(GEOMETRIES)}")
    dtypes = _list_arg(argv, "dtypes", "float32,bfloat16")
    rows_list = [int(r) for r in _list_arg(argv, "rows", "1,8")]
    steps = int_arg(argv, "decode_steps", 8)
    rounds = int_arg(argv, "rounds", 3)
    prompt = np.random.default_rng(0).integers(0, GEOMETRIES[name]["vocab_size"],
                                               int_arg(argv, "prompt_len", 64)).astype(np.int32)
    figures = {"geometry": name, "decode_steps": steps, "rounds": rounds, "prompt_len": len(prompt)}
    for dtype in dtypes:
        _say(f"{name} {dtype}: building both models over the same random weights")
        ours_model, hf = _models(GEOMETRIES[name], dtype)
        for rows in rows_list:
            a, b = _ours(ours_model, prompt, rows, steps), _theirs(hf, prompt, rows, steps)
            a(), b()  # warm-up: compiles our bucket, warms torch
            ta, tb = [], []
            for _ in range(rounds):
                ta.append(a())
                tb.append(b())
            ours_tps = rows * steps / median(ta)
            hf_tps = rows * steps / median(tb)
            figures[f"{dtype}_b{rows}_tokens_per_s"] = ours_tps
            figures[f"{dtype}_b{rows}_hf_tokens_per_s"] = hf_tps
            figures[f"{dtype}_b{rows}_ratio_vs_hf"] = ours_tps / hf_tps
            _say(f"{name} {dtype} batch {rows}: {ours_tps:.1f} vs transformers {hf_tps:.1f} tokens/s "
                 f"(ratio {ours_tps / hf_tps:.2f})")
        del ours_model, hf
    return figures
