"""bfloat16 weights stay bfloat16 inside the compiled steps (issue 33, "Dtypes").

XLA's CPU backend has no dot with a bf16 result: a bf16 product asked for one is rewritten into
float32 with the whole weight converted inside every step. `layers.matmul` asks for a float32
result of the bf16 operands instead, which XLA runs natively (its YNNPACK fusion reads the bf16
weight). The optimized HLO of every bf16 step of the built-in model is read for a convert of a
whole 2-D weight (`hlo_audit.whole_weight_converts`); the results stay close to float32 and
batch-invariant (bit-identical per row at every bucket and row count).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ninfer_jax.model import layers
from ninfer_jax.model.hlo_audit import whole_weight_converts
from ninfer_jax.model.model import load_model
from ninfer_jax.model.compiled import CompiledSteps
from ninfer_jax.model.pools import init_pools
from ninfer_jax.program.program import DECODE_BUCKETS

PROMPT = np.array([(7 * i + 3) % 1000 for i in range(40)], np.int32)
CHUNK = 64
PAGES = 4  # per row: the prompt and the decoded tokens fit in one page of 64


@pytest.fixture(scope="module")
def models():
    return {dt: load_model("builtin:tiny-hybrid", dt) for dt in ("float32", "bfloat16")}


@pytest.fixture(scope="module")
def bf16(models):
    """The bf16 model's steps, compiled once, and `_run`'s logits at every decode bucket."""
    model = models["bfloat16"]
    steps = CompiledSteps(model, progress=False)
    return model, steps, {rows: _run(model, steps, rows) for rows in DECODE_BUCKETS}


def _weight_shapes(model) -> list[tuple]:
    return [tuple(leaf.shape) for leaf in jax.tree.leaves(model.params) if leaf.ndim == 2]


def _run(model, steps: CompiledSteps, rows: int) -> np.ndarray:
    """Prefill PROMPT into row 0, then 4 greedy decode steps at `rows` rows (the others padding);
    row 0's logits at every step `[5, V]`."""
    most = max(DECODE_BUCKETS)  # one pool size for every bucket (CompiledSteps binds it)
    kv, state = init_pools(model.config, most * PAGES, most, model.dtype)
    table = jnp.arange(rows * PAGES, dtype=jnp.int32).reshape(rows, PAGES)
    tokens = np.zeros((1, CHUNK), np.int32)
    tokens[0, :len(PROMPT)] = PROMPT
    logits, _, kv, state = steps.prefill(kv, state, jnp.asarray(tokens), jnp.zeros(1, jnp.int32),
                                         jnp.full(1, len(PROMPT), jnp.int32), table[:1], jnp.zeros(1, jnp.int32))
    out = [np.asarray(logits[0])]
    slots = jnp.asarray([0] + [-1] * (rows - 1), jnp.int32)
    for i in range(4):
        token = jnp.asarray([17 + i] + [0] * (rows - 1), jnp.int32)
        position = jnp.asarray([len(PROMPT) + i] + [0] * (rows - 1), jnp.int32)
        logits, _, kv, state = steps.decode(kv, state, token, position, table, slots)
        out.append(np.asarray(logits[0]))
    return np.stack(out)


def test_bf16_steps_convert_no_whole_weight(bf16):
    model, steps, _ = bf16
    kinds = [bucket[0] for bucket in steps._executables]
    assert kinds.count("prefill") == 1 and kinds.count("decode") == len(DECODE_BUCKETS), kinds
    shapes = _weight_shapes(model)
    found = {bucket: whole_weight_converts(exe.as_text(), shapes) for bucket, exe in steps._executables.items()}
    assert not any(found.values()), f"steps converting a whole bf16 weight to float32: {found}"


def test_the_audit_sees_a_whole_weight_convert():
    """The detector itself: a bf16 product asked for a bf16 result (what every product was
    before issue 33) converts its weight whole; the tied head's embedding, gathered a few rows at
    a time for the input, does not count."""
    x = jnp.ones((8, 64), jnp.bfloat16)
    w = jnp.ones((64, 128), jnp.bfloat16)
    plain = jax.jit(lambda x, w: jnp.matmul(x, w)).lower(x, w).compile().as_text()
    assert whole_weight_converts(plain, [(64, 128)]), plain
    ours = jax.jit(layers.matmul).lower(x, w).compile().as_text()
    assert not whole_weight_converts(ours, [(64, 128)]), ours
    embed = jnp.ones((1024, 64), jnp.bfloat16)
    gathered = jax.jit(lambda e, t: e[t].astype(jnp.float32) * 2).lower(embed, jnp.arange(2)).compile().as_text()
    assert not whole_weight_converts(gathered, [(1024, 64)]), gathered


def test_bf16_logits_stay_close_to_float32(models, bf16):
    f32 = _run(models["float32"], CompiledSteps(models["float32"], progress=False), DECODE_BUCKETS[0])
    got = bf16[2][DECODE_BUCKETS[0]]
    assert np.abs(f32).max() > 5.0  # real logits, not zeros
    # bf16 keeps 8 significant bits: one unit in the last place of a logit near 16 is 0.0625.
    assert np.abs(got - f32).max() < 0.3, np.abs(got - f32).max()
    probs = lambda z: np.asarray(jax.nn.softmax(jnp.asarray(z)))  # noqa: E731
    assert np.abs(probs(got) - probs(f32)).max() < 0.02


def test_bf16_steps_are_batch_invariant(bf16):
    """Row 0's bf16 logits at every step are the same floats at every decode bucket."""
    runs = bf16[2]
    first = DECODE_BUCKETS[0]
    for rows in DECODE_BUCKETS[1:]:
        assert np.array_equal(runs[rows], runs[first]), f"bucket {rows} differs from bucket {first}"


@pytest.mark.parametrize("w_nk", [False, True])
def test_bf16_matmul_rows_alone_equal_rows_in_a_batch(w_nk):
    """Every row count below NATIVE_ROWS (decode buckets, verify steps of B*(k+1) rows), every
    offset: a row's bf16 product is the same floats; and `w_nk` is the product with w.T."""
    rng = np.random.default_rng(0)
    k, n = 64, 96
    w = jnp.asarray(rng.standard_normal((n, k) if w_nk else (k, n)) * 0.1, jnp.bfloat16)
    x = jnp.asarray(rng.standard_normal((40, k)), jnp.bfloat16)
    f = jax.jit(lambda x, w: layers.matmul(x, w, w_nk=w_nk))
    full = np.asarray(f(x, w).astype(jnp.float32))
    for m in (1, 2, 3, 5, 8, 9, 15, 16, 17, 24, 39):
        for offset in (0, 40 - m):
            got = np.asarray(f(x[offset:offset + m], w).astype(jnp.float32))
            assert np.array_equal(got, full[offset:offset + m]), (m, offset)
    wk = np.asarray(w.astype(jnp.float32))
    want = np.asarray(x.astype(jnp.float32)) @ (wk.T if w_nk else wk)
    assert np.abs(full - want).max() < 0.05 * np.abs(want).max()


def test_float32_w_nk_is_the_transposed_product():
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((5, 64)), jnp.float32)
    e = jnp.asarray(rng.standard_normal((96, 64)), jnp.float32)
    f = jax.jit(lambda x, e, nk: layers.matmul(x, e, w_nk=True) if nk else layers.matmul(x, e.T), static_argnums=2)
    assert np.array_equal(np.asarray(f(x, e, True)), np.asarray(f(x, e, False)))
