"""`ninfer bench structured [--json]`: what structured output costs (engine/grammar.py).

On the built-in model, C = 8, greedy, every request 64 tokens long (a schema whose one field is
a string of exactly 240 characters keeps a constrained row going that long; the free rows ignore
EOS): the decode tokens/s of a batch where half the rows hold a json_schema ÷ the same batch with
no grammar, the two timed in turn for `--rounds` rounds (medians). The built-in model's step is
about a millisecond, so the host's mask work weighs far more here than beside a real model's step:
a bound from below. Then the time to compile (check and build the matcher of) a 50-field schema,
and to reuse it (a copy of the compiled grammar, as a second request with the same schema gets),
medians of 5.

With `--geometry NAME` (bench/geometries.py, e.g. `small`: Qwen3.5-0.8B's widths, 8 layers, random
float32 weights, the built-in tokenizer's vocabulary) the same batch runs on a model whose step, like a real
one's, outweighs the host's mask work.

Flags after `structured`: --rounds N (default 5), --geometry NAME (default: the built-in model).
"""
from __future__ import annotations

import sys
import time

from ninfer_jax.bench import int_arg, str_arg
from ninfer_jax.bench.stats import median

TOKENS = 64
LONG = {"type": "object", "additionalProperties": False, "required": ["text"],
        "properties": {"text": {"type": "string", "minLength": 240, "maxLength": 240}}}


def _say(msg: str) -> None:
    print(f"[bench structured] {msg}", file=sys.stderr, flush=True)


def fifty_fields() -> dict:
    """A 50-field object of mixed types, ranges, enums, patterns and nesting."""
    props = {}
    for i in range(50):
        kind = i % 5
        props[f"field_{i}"] = (
            {"type": "string", "maxLength": 20} if kind == 0 else
            {"type": "integer", "minimum": -i, "maximum": 100 + i} if kind == 1 else
            {"enum": [f"a{i}", f"b{i}", f"c{i}"]} if kind == 2 else
            {"type": "array", "items": {"type": "number"}, "maxItems": 4} if kind == 3 else
            {"type": "object", "properties": {"x": {"type": "boolean"}, "y": {"type": "string",
                                                                             "pattern": "[a-z]{2,5}"}},
             "required": ["x"]})
    return {"type": "object", "properties": props, "required": sorted(props), "additionalProperties": False}


def run(argv: list[str]) -> dict:
    from ninfer_jax import Engine, EngineConfig, SamplingParams
    from ninfer_jax.engine.grammar import StructuredOutput

    rounds = int_arg(argv, "rounds", 5)
    geometry = str_arg(argv, "geometry", "")
    if geometry:
        from ninfer_jax.bench.geometries import GEOMETRIES
        from ninfer_jax.bench.prefill_bench import _program

        if geometry not in GEOMETRIES:
            raise SystemExit(f"ninfer bench structured: unknown --geometry {geometry!r}; choose one of {sorted(GEOMETRIES)}")
        _say(f"building the {geometry} geometry (random float32 weights)")
        from ninfer_jax.model import builtin

        # The built-in tokenizer reads this model's output: its vocabulary and EOS ids.
        own = builtin.config()
        shape = dict(GEOMETRIES[geometry], vocab_size=own.vocab_size, eos_token_id=list(own.eos_token_id))
        program = _program(shape, 512, 64, concurrency=8)
        engine = Engine(program.config, program=program, start=False)
    else:
        engine = Engine(EngineConfig(max_concurrency=8, max_context=512, chunk_size=64, progress=False), start=False)
    tok = engine.tokenizer
    prompts = [tok.encode(f"Describe the weather in city number {i}.") for i in range(8)]
    free = SamplingParams(temperature=0, max_tokens=TOKENS, ignore_eos=True)
    held = SamplingParams(temperature=0, max_tokens=TOKENS, structured_output=StructuredOutput("json_schema", LONG))

    def batch(half_constrained: bool) -> float:
        """Decode tokens/s of one C = 8 batch: all prefilled first, then timed to the end."""
        handles = [engine.submit(p, held if half_constrained and i % 2 == 0 else free) for i, p in enumerate(prompts)]
        while any(r.phase != "decode" for r in engine.core.residents) or engine.core.fresh:
            engine.step()
        start, out0 = time.perf_counter(), sum(len(r.output) for r in engine.core.residents)
        while not all(h.done() for h in handles):
            engine.step()
        seconds = time.perf_counter() - start
        tokens = sum(len(h.result().token_ids) for h in handles) - out0
        if half_constrained and any(len(h.result().token_ids) != TOKENS for h in handles):
            raise RuntimeError("a row ended early: the comparison would not be of equal work")
        return tokens / seconds

    _say("warming up")
    batch(True)
    batch(False)
    rates: dict[bool, list[float]] = {True: [], False: []}
    for r in range(rounds):
        for constrained in (True, False):
            rates[constrained].append(batch(constrained))
        _say(f"round {r + 1}: half json_schema {rates[True][-1]:.0f}, none {rates[False][-1]:.0f} tokens/s")
    with_grammar, without = median(rates[True]), median(rates[False])
    schema = StructuredOutput("json_schema", fifty_fields())
    compile_s, copy_s = [], []
    grammars = engine.core.grammars
    for _ in range(5):
        grammars.clear()
        start = time.perf_counter()
        grammars.matcher(schema)  # compiled
        compile_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        grammars.matcher(schema)  # the compiled grammar copied (n choices, later turns)
        copy_s.append(time.perf_counter() - start)
    engine.close()
    out = {"model": geometry or "builtin", "rounds": rounds, "batch": 8, "tokens_per_request": TOKENS,
           "decode_tokens_per_s_half_constrained": with_grammar, "decode_tokens_per_s_unconstrained": without,
           "ratio_half_constrained_over_unconstrained": with_grammar / without,
           "compile_50_field_schema_s": median(compile_s), "reuse_50_field_schema_s": median(copy_s)}
    _say(f"C=8, half the rows json_schema ÷ none: {with_grammar / without:.3f} "
         f"({with_grammar:.0f} vs {without:.0f} tokens/s); 50-field schema compiled in "
         f"{median(compile_s) * 1e3:.1f} ms, reused in {median(copy_s) * 1e6:.0f} µs")
    return out
