"""The paged MTP steps (issue 17) against the whole-sequence MTP forward: `mtp_prefill` over
ragged chunks and the recursive `mtp_draft` (k = 1..4, the CKP-3 frontier−1 bridge first) give
the logits of `HybridLM.mtp_logits_from_final` over the same inputs, for rows of different
lengths whose MTP pages are scattered and whose drafts cross page boundaries."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ninfer_jax.model import builtin, load_model
from ninfer_jax.model.config import load_config
from ninfer_jax.model.modules import HybridLM, init_params
from ninfer_jax.model.mtp_steps import MTPSteps, init_mtp_pool, mtp_pool_geometry
from ninfer_jax.model.pools import StepArgumentError
from ninfer_jax.model.weights import mtp_params
from oracle_paths import oracle_dir

TOL = 1e-4  # float32, paged vs whole sequence: measured worst 2.4e-6 (random), 7.6e-6 (trained)
PAGE = 8  # small MTP pages: every row and every k=4 draft crosses page boundaries
PAGES_PER_ROW = 6
NUM_PAGES = 32
CHUNK = 16
LENGTHS = (5, 17, 30)  # main execution frontiers n of the rows (MTP prefill covers [0, n-1))
REF_LEN = max(LENGTHS) + 4  # the whole-sequence reference runs padded to one length (k <= 4 drafts)


def _models():
    cfg = dataclasses.replace(builtin.config(), mtp_num_hidden_layers=1)
    yield "builtin-random", (cfg, *init_params(cfg, seed=23))
    cfg = dataclasses.replace(load_config(oracle_dir("qwen3_next")), mtp_num_hidden_layers=1)
    yield "qwen3_next-random", (cfg, *init_params(cfg, seed=29))
    model = load_model(builtin.trained_folder())
    yield "trained", (model.config, model.params, mtp_params(model.mtp, model.config))


MODELS = dict(_models())


@pytest.fixture(scope="module", params=list(MODELS))
def case(request):
    cfg, params, mtp = MODELS[request.param]
    lm = HybridLM(cfg, params, mtp)
    rng = np.random.default_rng(5)
    seqs = [rng.integers(0, cfg.vocab_size, n + 1).astype(np.int32) for n in LENGTHS]  # tokens 0..n
    main_final = jax.jit(lambda t: lm.final_norm(lm(t)[1]))  # one compile per length, not eager ops
    finals = [np.asarray(main_final(jnp.asarray(s[:-1]))) for s in seqs]  # main hidden 0..n-1
    pages = rng.permutation(NUM_PAGES)[:len(seqs) * PAGES_PER_ROW].reshape(len(seqs), PAGES_PER_ROW)
    return cfg, _Reference(lm), MTPSteps(cfg, params, mtp), seqs, finals, pages.astype(np.int32)


class _Reference:
    """The whole-sequence MTP forward, compiled once: inputs padded to REF_LEN rows (the MTP
    layer is causal, so rows past a sequence's end change none of its rows). Eager ops compiled
    per shape took most of this module's time."""

    def __init__(self, lm: HybridLM):
        self._hidden = jax.jit(lambda final, nxt: lm.mtp(final, lm.embed_tokens(nxt), jnp.arange(REF_LEN)))
        self._logits = jax.jit(lm.logits)

    def _padded(self, final, nxt) -> jax.Array:
        n = nxt.shape[0]
        final = jnp.zeros((REF_LEN, final.shape[1]), final.dtype).at[:n].set(final)
        return self._hidden(final, jnp.zeros(REF_LEN, jnp.int32).at[:n].set(nxt))

    def hidden(self, final, nxt) -> jax.Array:
        """MTP hidden of every row of `final` [n, H] with next tokens `nxt` [n]."""
        return self._padded(final, nxt)[:nxt.shape[0]]

    def logits(self, hidden) -> jax.Array:
        return self._logits(hidden)

    def mtp_logits_from_final(self, final, nxt) -> jax.Array:
        return self._logits(self._padded(final, nxt))[:nxt.shape[0]]


def _prefill(steps, cfg, seqs, finals, pages, pool):
    """MTP indices [0, n-1) of every row in CHUNK-sized ragged chunks; returns all logits per row."""
    r = len(seqs)
    out = [[] for _ in seqs]
    for c in range(0, max(LENGTHS) - 1, CHUNK):
        final = np.zeros((r, CHUNK, cfg.hidden_size), np.float32)
        nxt = np.zeros((r, CHUNK), np.int32)
        lengths = np.zeros(r, np.int32)
        for i, (s, f) in enumerate(zip(seqs, finals)):
            m = max(0, min(CHUNK, len(s) - 2 - c))
            final[i, :m], nxt[i, :m], lengths[i] = f[c:c + m], s[c + 1:c + 1 + m], m
        logits, _, pool = steps.prefill(pool, jnp.asarray(final), jnp.asarray(nxt), jnp.full(r, c, jnp.int32),
                                        jnp.asarray(lengths), jnp.asarray(pages), all_logits=True)
        for i in range(r):
            out[i].append(np.asarray(logits[i, :lengths[i]]))
    return [np.concatenate(o) for o in out], pool


def test_mtp_prefill_equals_whole_sequence(case):
    cfg, lm, steps, seqs, finals, pages = case
    pool = init_mtp_pool(cfg, NUM_PAGES, jnp.float32, page_size=PAGE)
    got, _ = _prefill(steps, cfg, seqs, finals, pages, pool)
    for s, f, g in zip(seqs, finals, got):
        want = lm.mtp_logits_from_final(jnp.asarray(f[:-1]), jnp.asarray(s[1:-1]))
        np.testing.assert_allclose(g, np.asarray(want), atol=TOL, rtol=0)


# k = 4 checks drafts 1..4 of the recursion (k = 2, the engine's default, is its first two steps;
# the engine's own k = 2 steps are checked against plain decoding in tests/engine/test_engine_spec.py).
DRAFT_CASES = [("builtin-random", 4), ("qwen3_next-random", 4), ("trained", 4)]


@pytest.mark.parametrize("case, k", DRAFT_CASES, indirect=["case"])
def test_recursive_draft_equals_whole_sequence(case, k):
    """Rows at frontiers 5, 17, 30 plus a padding row; draft i+1 is the whole-sequence MTP over
    the real inputs extended by the earlier drafts' (MTP hidden, token) pairs."""
    cfg, lm, steps, seqs, finals, pages = case
    pool = init_mtp_pool(cfg, NUM_PAGES, jnp.float32, page_size=PAGE)
    _, pool = _prefill(steps, cfg, seqs, finals, pages, pool)
    before = [np.asarray(a) for a in pool["k"]]
    owned = set(pages.reshape(-1).tolist())
    free = [p for p in range(NUM_PAGES) if p not in owned]
    pad_table = np.full((1, PAGES_PER_ROW), free[0], np.int32)
    drafts, logits, pool = steps.draft(
        pool, jnp.asarray(np.stack([f[-1] for f in finals] + [np.zeros_like(finals[0][-1])])),
        jnp.asarray([s[-1] for s in seqs] + [0], jnp.int32), jnp.asarray([n - 1 for n in LENGTHS] + [-1], jnp.int32),
        jnp.asarray(np.concatenate([pages, pad_table])), k=k)
    assert drafts.shape == (len(seqs) + 1, k) and logits.shape == (len(seqs) + 1, k, cfg.vocab_size)
    for i, (s, f) in enumerate(zip(seqs, finals)):
        hid, nxt = jnp.asarray(f), jnp.asarray(s[1:])
        for j in range(k):
            out = lm.hidden(hid, nxt)
            want = lm.logits(out[-1:])[0]
            if j == 0:  # the bridge is the plain MTP forward at index n-1
                np.testing.assert_allclose(want, lm.mtp_logits_from_final(hid, nxt)[-1], atol=TOL, rtol=0)
            np.testing.assert_allclose(np.asarray(logits[i, j]), np.asarray(want), atol=TOL, rtol=0)
            assert int(drafts[i, j]) == int(jnp.argmax(want))
            hid = jnp.concatenate([hid, out[-1:]])
            nxt = jnp.concatenate([nxt, drafts[i, j:j + 1]])
    # The padding row wrote nothing (its table points at an unowned page), nor did any row
    # outside its own pages.
    after = [np.asarray(a) for a in pool["k"]]
    for b, a in zip(before, after):
        np.testing.assert_array_equal(a[free], b[free])


def test_geometry_and_argument_checks(case):
    cfg, _, steps, seqs, finals, pages = case
    g = mtp_pool_geometry(cfg, jnp.bfloat16, page_size=PAGE)
    assert g.bytes_per_token == 2 * cfg.num_key_value_heads * cfg.head_dim * 2 and g.page_bytes == PAGE * g.bytes_per_token
    pool = init_mtp_pool(cfg, NUM_PAGES, jnp.float32, page_size=PAGE)
    with pytest.raises(StepArgumentError, match="argument 'final' of mtp_draft"):
        steps.draft(pool, jnp.zeros((2, cfg.hidden_size + 1)), jnp.zeros(2, jnp.int32), jnp.zeros(2, jnp.int32),
                    jnp.asarray(pages[:2]), k=2)
    with pytest.raises(StepArgumentError, match="argument 'k' of mtp_draft"):
        steps.draft(pool, jnp.zeros((2, cfg.hidden_size)), jnp.zeros(2, jnp.int32), jnp.zeros(2, jnp.int32),
                    jnp.asarray(pages[:2]), k=5)
