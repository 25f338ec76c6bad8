"""A prefill chunk runs the narrowest compiled page table that holds its keys
(plan/workspace.prefill_table_widths, Program.prefill_width): the XLA attention reads every page
of its table, so a chunk near the start of a long `max_context` no longer reads the whole
context's pages. The narrower tables change which pages are read, not what is attended to.
Likewise a chunk runs the shortest compiled chunk length that holds its tokens
(plan/workspace.prefill_chunk_lengths, Program.prefill_length): a short tail is not padded."""
import numpy as np
import pytest

from ninfer_jax import ContextCacheConfig, EngineConfig, SamplingParams
from ninfer_jax.model.pools import PAGE_SIZE
from ninfer_jax.program.program import Program

from engine_helpers import make_engine, run_until_done

MAX_CONTEXT, CHUNK = 2048, 64  # 32 pages a request: tables of 2, 8 and 32 pages


def _program(model, widths=None):
    cfg = EngineConfig(max_concurrency=2, max_context=MAX_CONTEXT, chunk_size=CHUNK, progress=False,
                       context_cache=ContextCacheConfig(host_capacity_bytes=0))
    program = Program(cfg, model=model)
    if widths is not None:
        program.prefill_widths = widths
    program.cost_model = None
    return program


def test_the_plan_compiles_a_prefill_per_width_and_a_chunk_takes_the_narrowest_that_holds_it(tiny_model):
    program = _program(tiny_model)
    assert program.prefill_widths == (2, 8, 32)
    assert [program.prefill_width(end) for end in (1, 64, 128, 129, 512, 513, 2048)] == [2, 2, 2, 8, 8, 32, 32]
    program.speculative_tokens = 2  # the MTP layers store index i at slot i + 1: one slot more
    assert [program.prefill_width(end) for end in (1, 64, 127, 128, 511, 512, 2047)] == [2, 2, 2, 8, 8, 32, 32]


def test_chunk_logits_at_narrow_tables_equal_the_whole_table(tiny_model):
    """A 1,100-token prompt prefilled chunk by chunk: at tables of 2, 8 and 32 pages against one
    Program that always passes all 32, on pools of their own. Masked keys past the row's end
    weigh exactly 0, so the logits agree to float32 rounding of the softmax's sum (the sums run
    over other lengths)."""
    narrow, whole = _program(tiny_model), _program(tiny_model, widths=(32,))
    rng = np.random.default_rng(7)
    prompt = rng.integers(5, tiny_model.config.vocab_size, 1100).tolist()
    pages = list(range(-(-len(prompt) // PAGE_SIZE) + 1))
    used = set()
    worst = 0.0
    for start in range(0, len(prompt), CHUNK):
        chunk = prompt[start:start + CHUNK]
        used.add(narrow.prefill_width(start + len(chunk)))
        a = narrow.prefill(chunk, start, pages, slot=0)
        b = whole.prefill(chunk, start, pages, slot=0)
        assert np.argmax(a) == np.argmax(b)
        worst = max(worst, float(np.max(np.abs(a - b))))
    assert used == {2, 8, 32}
    assert worst < 1e-5, worst


def test_an_engine_at_a_long_max_context_compiles_every_width_at_warm_up_and_none_mid_run(tiny_model):
    engine = make_engine(tiny_model, max_context=MAX_CONTEXT, chunk_size=CHUNK, kv_capacity=2 * MAX_CONTEXT)
    engine.program.warmup()
    built = engine.program.compilations
    widths = {b[4] for b in engine.program.steps._executables if b[0] == "prefill"}  # the table's shape
    assert widths == {(1, 2), (1, 8), (1, 32)}
    rng = np.random.default_rng(3)
    handles = [engine.submit(rng.integers(5, 500, n).tolist(), SamplingParams(temperature=0, max_tokens=6))
               for n in (40, 300, 1500)]
    run_until_done(engine, handles)
    assert all(len(h.result().token_ids) == 6 for h in handles)
    assert engine.program.compilations == built


@pytest.mark.parametrize("backend", ["pallas"])
def test_the_pallas_kernels_take_one_width(tiny_model, backend):
    from ninfer_jax.plan.workspace import prefill_table_widths

    assert prefill_table_widths(32, CHUNK, backend) == (32,)


def test_chunk_lengths_are_the_chunk_size_and_its_quarters_down_to_64():
    from ninfer_jax.plan.workspace import prefill_chunk_lengths

    assert [prefill_chunk_lengths(c) for c in (32, 64, 100, 256, 512, 1024, 4096)] == [
        (32,), (64,), (100,), (64, 256), (128, 512), (64, 256, 1024), (64, 256, 1024, 4096)]


def test_a_short_chunk_runs_a_short_program_with_the_same_logits(tiny_model):
    """Chunk 256 compiles lengths 64 and 256: a 40-token tail runs the 64-token program, and its
    logits (and the state it leaves: the next chunk's logits) equal the 256-token program's to
    float32 rounding."""
    def program(lengths):
        cfg = EngineConfig(max_concurrency=2, max_context=1024, chunk_size=256, progress=False,
                           context_cache=ContextCacheConfig(host_capacity_bytes=0))
        p = Program(cfg, model=tiny_model)
        p.cost_model = None
        if lengths is not None:
            p.prefill_lengths = lengths
        return p

    short, long = program(None), program((256,))
    assert short.prefill_lengths == (64, 256)
    assert [short.prefill_length(n) for n in (1, 64, 65, 256)] == [64, 64, 256, 256]
    rng = np.random.default_rng(11)
    prompt = rng.integers(5, tiny_model.config.vocab_size, 256 + 40 + 30).tolist()
    pages = list(range(8))
    worst = 0.0
    for start, end in ((0, 256), (256, 296), (296, 326)):  # a whole chunk, then two short ones
        a = short.prefill(prompt[start:end], start, pages, slot=0)
        b = long.prefill(prompt[start:end], start, pages, slot=0)
        assert np.argmax(a) == np.argmax(b)
        worst = max(worst, float(np.max(np.abs(a - b))))
    assert worst < 1e-5, worst
    lengths = {b[1] for b in short.steps._executables if b[0] == "prefill"}  # the tokens' shape
    assert lengths == {(1, 64), (1, 256)}


def test_an_engine_compiles_every_length_at_warm_up_and_none_mid_run(tiny_model):
    engine = make_engine(tiny_model, max_context=1024, chunk_size=256, kv_capacity=2048)
    engine.program.warmup()
    built = engine.program.compilations
    shapes = {(b[1], b[4]) for b in engine.program.steps._executables if b[0] == "prefill"}
    assert shapes == {((1, t), (1, w)) for t in (64, 256) for w in engine.program.prefill_widths}
    rng = np.random.default_rng(5)
    prompt = rng.integers(5, 500, 300).tolist()
    first = engine.submit(prompt, SamplingParams(temperature=0, max_tokens=6))
    run_until_done(engine, [first])
    # the next turn: a hit on the first, then a 40-token tail (the short program)
    again = engine.submit(prompt + list(first.result().token_ids) + [7] * 40,
                          SamplingParams(temperature=0, max_tokens=6))
    run_until_done(engine, [again])
    assert again.result().usage.cached_tokens > 0 and len(again.result().token_ids) == 6
    assert engine.program.compilations == built
