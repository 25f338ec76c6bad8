"""`ninfer bench prefill [--json]`: prefill with page tables cut to each chunk ÷ the whole table.

The XLA attention reads every page of the table a step is given, so a chunk's cost followed
`max_context` rather than its own position. The Program now runs each chunk at the narrowest
compiled width that holds its keys (plan/workspace.prefill_table_widths). Side by side in one
process, on one Program of the `small` geometry (Qwen3.5-0.8B widths, 8 layers, 32k vocabulary,
random float32 weights): the same prompt prefilled chunk by chunk with the Program's widths, then
with its widths forced to the whole table, in turn for `--rounds` rounds; medians.

Flags after `prefill`: --max_context N (default 4096), --prompt_len N (default 2048),
--chunk_size N (default 256), --rounds N (default 3), --geometry NAME (default small).
"""
from __future__ import annotations

import sys
import time

import numpy as np

from ninfer_jax.bench import int_arg, str_arg
from ninfer_jax.bench.stats import median


def _say(msg: str) -> None:
    print(f"[bench prefill] {msg}", file=sys.stderr, flush=True)


def _program(geometry: dict, max_context: int, chunk: int, concurrency: int = 1):
    """A Program of `geometry` with random float32 weights (nothing read from disk), uncalibrated."""
    import jax
    import jax.numpy as jnp

    from ninfer_jax.config import ContextCacheConfig, EngineConfig
    from ninfer_jax.model.config import parse_config
    from ninfer_jax.model.model import Model
    from ninfer_jax.model.modules import init_params
    from ninfer_jax.program.calibrate import CostRates
    from ninfer_jax.program.program import Program

    cfg = parse_config(dict(geometry))
    params, _ = init_params(cfg, seed=0, dtype=np.float32)
    model = Model(cfg, jax.tree.map(jnp.asarray, params), jnp.float32, "random")
    config = EngineConfig(max_concurrency=concurrency, max_context=max_context, chunk_size=chunk, dtype="float32",
                          progress=False, context_cache=ContextCacheConfig(host_capacity_bytes=0))
    program = Program(config, model=model)
    program.cost_model = CostRates(1e-4, 1e9, 1e9, 1e10)  # no calibration run: not measured here
    return program


def run(argv: list[str]) -> dict:
    from ninfer_jax.bench.geometries import GEOMETRIES
    from ninfer_jax.model.pools import PAGE_SIZE

    name = str_arg(argv, "geometry", "small")
    if name not in GEOMETRIES:
        raise SystemExit(f"ninfer bench prefill: unknown --geometry {name!r}; choose one of {sorted(GEOMETRIES)}")
    max_context, prompt_len = int_arg(argv, "max_context", 4096), int_arg(argv, "prompt_len", 2048)
    chunk, rounds = int_arg(argv, "chunk_size", 256), int_arg(argv, "rounds", 3)
    if not 0 < prompt_len <= max_context:
        raise SystemExit(f"ninfer bench prefill: --prompt_len must be in 1..--max_context ({max_context})")
    _say(f"building the {name} geometry (random float32 weights), max_context {max_context}, chunk {chunk}")
    program = _program(GEOMETRIES[name], max_context, chunk)
    widths = program.prefill_widths
    whole = (program.capacity.pages_per_request,)
    prompt = np.random.default_rng(0).integers(1, program.vocab_size, prompt_len).tolist()
    pages = list(range(-(-prompt_len // PAGE_SIZE)))

    def prefill() -> float:
        start = time.perf_counter()
        for at in range(0, prompt_len, chunk):
            program.prefill(prompt[at:at + chunk], at, pages, slot=0)
        return time.perf_counter() - start

    used = [program.prefill_width(min(at + chunk, prompt_len)) for at in range(0, prompt_len, chunk)]
    _say(f"compiling (widths {', '.join(map(str, widths))} pages); chunks run at {used}")
    program.warmup()
    times: dict[str, list[float]] = {"cut": [], "whole": []}
    for r in range(rounds + 1):  # round 0 runs each once untimed
        for how in ("cut", "whole"):
            program.prefill_widths = widths if how == "cut" else whole
            seconds = prefill()
            if r:
                times[how].append(seconds)
                _say(f"round {r}: {how} table {prompt_len / seconds:.0f} tokens/s")
    program.prefill_widths = widths
    cut, full = (float(median(times[h])) for h in ("cut", "whole"))
    out = {"geometry": name, "max_context": max_context, "prompt_len": prompt_len, "chunk_size": chunk,
           "rounds": rounds, "widths": list(widths), "chunk_widths": used,
           "prefill_tokens_per_s_cut": prompt_len / cut, "prefill_tokens_per_s_whole": prompt_len / full,
           "time_ratio_cut_over_whole": cut / full}
    _say(f"prefill with tables cut to each chunk ÷ the whole table: {cut / full:.3f} "
         f"({prompt_len / cut:.0f} vs {prompt_len / full:.0f} tokens/s)")
    return out
