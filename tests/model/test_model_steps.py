"""Incremental equals whole: paged prefill chunks and decode steps against `Model.forward`."""
import jax.numpy as jnp
import numpy as np
import pytest

from ninfer_jax.model.pools import init_pools

TOL = 1e-4
T_BUCKET = 64
PAGES_PER_ROW = 4


def _prefill(steps, kv, state, rows):
    """rows: list of (tokens, start, page_table, slot) or None for a padding row."""
    r = len(rows)
    tokens = np.zeros((r, T_BUCKET), np.int32)
    start = np.zeros(r, np.int32)
    lengths = np.zeros(r, np.int32)
    table = np.zeros((r, PAGES_PER_ROW), np.int32)
    slots = np.full(r, -1, np.int32)
    for i, row in enumerate(rows):
        if row is None:
            continue
        toks, s, pt, slot = row
        tokens[i, :len(toks)] = toks
        start[i], lengths[i], table[i], slots[i] = s, len(toks), pt, slot
    return steps.prefill(kv, state, jnp.asarray(tokens), jnp.asarray(start), jnp.asarray(lengths),
                         jnp.asarray(table), jnp.asarray(slots), all_logits=True)


def _decode(steps, kv, state, rows):
    b = len(rows)
    tokens = np.zeros(b, np.int32)
    pos = np.zeros(b, np.int32)
    table = np.zeros((b, PAGES_PER_ROW), np.int32)
    slots = np.full(b, -1, np.int32)
    for i, row in enumerate(rows):
        if row is None:
            continue
        tokens[i], pos[i], table[i], slots[i] = row
    return steps.decode(kv, state, jnp.asarray(tokens), jnp.asarray(pos), jnp.asarray(table), jnp.asarray(slots))


def _run_rows(steps, model, seqs, chunks, tables, slots, decode_steps=3, pad_rows=0):
    """Run several sequences together: per cycle one prefill call with every row's next chunk,
    then batched decode; returns per-sequence logits for every position."""
    kv, state = init_pools(model.config, 12, 6, model.dtype)
    out = [[] for _ in seqs]
    pos = [0] * len(seqs)
    for c in range(max(len(ch) for ch in chunks)):
        rows = []
        for i, seq in enumerate(seqs):
            if c < len(chunks[i]):
                n = chunks[i][c]
                rows.append((seq[pos[i]:pos[i] + n], pos[i], tables[i], slots[i]))
            else:
                rows.append(None)
        rows += [None] * pad_rows
        logits, _, kv, state = _prefill(steps, kv, state, rows)
        for i, row in enumerate(rows[:len(seqs)]):
            if row is not None:
                out[i].append(np.asarray(logits[i, :len(row[0])]))
                pos[i] += len(row[0])
    for _ in range(decode_steps):
        rows = [(seq[pos[i]], pos[i], tables[i], slots[i]) for i, seq in enumerate(seqs)] + [None] * pad_rows
        logits, _, kv, state = _decode(steps, kv, state, rows)
        for i in range(len(seqs)):
            out[i].append(np.asarray(logits[i:i + 1]))
            pos[i] += 1
    return [np.concatenate(o) for o in out], kv, state


def test_uneven_chunks_then_decode_equal_forward(builtin_model, builtin_steps):
    """7 + 64 + 13 tokens cross the page (64) and GDN chunk (64) boundaries."""
    rng = np.random.default_rng(1)
    seq = rng.integers(0, builtin_model.config.vocab_size, 7 + 64 + 13 + 3).astype(np.int32)
    (got,), _, _ = _run_rows(builtin_steps, builtin_model, [seq], [[7, 64, 13]], [[5, 2, 9, 0]], [3])
    np.testing.assert_allclose(got, np.asarray(builtin_model.forward(seq)), atol=TOL, rtol=0)


def test_batched_rows_equal_each_alone(builtin_model, builtin_steps):
    """Two requests with different chunkings, frontiers and pages in one ragged call each cycle
    (plus a padding row) give what each gives alone, and what the whole pass gives."""
    rng = np.random.default_rng(2)
    a = rng.integers(0, 1024, 50 + 3).astype(np.int32)
    b = rng.integers(0, 1024, 20 + 30 + 40 + 3).astype(np.int32)
    together, _, _ = _run_rows(builtin_steps, builtin_model, [a, b], [[50], [20, 30, 40]],
                               [[1, 4, 0, 0], [2, 3, 6, 7]], [0, 5], pad_rows=1)
    alone_a, _, _ = _run_rows(builtin_steps, builtin_model, [a], [[50]], [[1, 4, 0, 0]], [0], pad_rows=2)
    alone_b, _, _ = _run_rows(builtin_steps, builtin_model, [b], [[20, 30, 40]], [[2, 3, 6, 7]], [5], pad_rows=2)
    np.testing.assert_allclose(together[0], alone_a[0], atol=1e-6, rtol=0)
    np.testing.assert_allclose(together[1], alone_b[0], atol=1e-6, rtol=0)
    np.testing.assert_allclose(together[0], np.asarray(builtin_model.forward(a)), atol=TOL, rtol=0)
    np.testing.assert_allclose(together[1], np.asarray(builtin_model.forward(b)), atol=TOL, rtol=0)


def test_padding_rows_write_nothing(builtin_model, builtin_steps):
    """A padding row (length 0, slot -1) leaves every page and slot exactly as it was."""
    kv, state = init_pools(builtin_model.config, 12, 6, builtin_model.dtype)
    kv = {k: tuple(x + 1.0 for x in v) for k, v in kv.items()}
    state = {k: (tuple(x + 1.0 for x in v) if isinstance(v, tuple) else v + 1.0) for k, v in state.items()}
    before_kv = [np.asarray(x).copy() for x in kv["k"] + kv["v"]]
    before_state = [np.asarray(x).copy() for x in state["conv"] + state["recurrent"] + (state["hidden"],)]
    _, _, kv, state = _prefill(builtin_steps, kv, state, [None, None, None])
    after_kv = [np.asarray(x) for x in kv["k"] + kv["v"]]
    after_state = [np.asarray(x) for x in state["conv"] + state["recurrent"] + (state["hidden"],)]
    for x, y in zip(before_kv + before_state, after_kv + after_state):
        np.testing.assert_array_equal(x, y)


def test_fresh_row_ignores_stale_slot_contents(builtin_model, builtin_steps):
    """A request starting at frontier 0 must not read what a previous owner left in its slot."""
    rng = np.random.default_rng(3)
    seq = rng.integers(0, 1024, 30).astype(np.int32)
    kv, state = init_pools(builtin_model.config, 12, 6, builtin_model.dtype)
    state = {k: (tuple(x + 0.5 for x in v) if isinstance(v, tuple) else v + 0.5) for k, v in state.items()}
    logits, _, _, _ = _prefill(builtin_steps, kv, state, [(seq, 0, [0, 1, 2, 3], 2), None, None])
    np.testing.assert_allclose(np.asarray(logits[0, :30]), np.asarray(builtin_model.forward(seq)), atol=TOL, rtol=0)


@pytest.mark.parametrize("model_type", ["qwen3_next", "qwen3_5_moe_text"])
def test_moe_models_incremental_equal_forward(oracle_models, model_type):
    """MoE routing per chunk gives the whole pass's logits (routing is per token)."""
    model, steps = oracle_models[model_type]
    rng = np.random.default_rng(4)
    seq = rng.integers(0, model.config.vocab_size, 7 + 64 + 13 + 2).astype(np.int32)
    (got,), _, _ = _run_rows(steps, model, [seq], [[7, 64, 13]], [[3, 0, 1, 0]], [1], decode_steps=2, pad_rows=2)
    np.testing.assert_allclose(got, np.asarray(model.forward(seq)), atol=TOL, rtol=0)


def test_no_compilation_after_warmup(builtin_model, builtin_steps):
    """Same buckets, different contents: nothing compiles again."""
    rng = np.random.default_rng(5)
    seq = rng.integers(0, 1024, 80).astype(np.int32)
    _run_rows(builtin_steps, builtin_model, [seq], [[40, 37]], [[0, 1, 2, 3]], [0], pad_rows=2)
    seen = len(builtin_steps.compilations)
    for n in (3, 61):
        other = rng.integers(0, 1024, n + 3).astype(np.int32)
        _run_rows(builtin_steps, builtin_model, [other], [[n]], [[4, 5, 6, 7]], [1], pad_rows=2)
    assert len(builtin_steps.compilations) == seen


def test_chunk_boundaries_do_not_change_a_bit(builtin_model, builtin_steps):
    """Where prefill chunks start is invisible: a resumed prefill reproduces a cold one exactly
    (the ground for reuse never changing tokens, doctrine 1, docs/rules.md)."""
    rng = np.random.default_rng(6)
    seq = rng.integers(0, 1024, 84 + 2).astype(np.int32)
    tables, slots = [[5, 2, 9, 0]], [3]
    results = [_run_rows(builtin_steps, builtin_model, [seq], [chunks], tables, slots, decode_steps=2)[0][0]
               for chunks in ([7, 64, 13], [64, 20], [1, 1, 1, 40, 41])]
    for other in results[1:]:
        np.testing.assert_array_equal(results[0], other)
