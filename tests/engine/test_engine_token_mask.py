"""Token bitmasks (model/token_mask.py, issue 36): the compiled mask step holds a batch of rows to
their grammars on the device, exactly as the host's own masking does, and an engine compiles it at
warm-up (nothing compiles when the first constrained request arrives)."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from ninfer_jax import SamplingParams
from ninfer_jax.engine.grammar import StructuredOutput
from ninfer_jax.model import token_mask

from engine_helpers import make_engine, run_until_done


@pytest.mark.parametrize("vocab", [1000, 1024, 31])
def test_mask_step_equals_the_host_mask_bit_for_bit(vocab):
    rng = np.random.default_rng(vocab)
    words = token_mask.words(vocab)
    bits = rng.integers(0, 2**32, size=(4, words), dtype=np.uint64).astype(np.uint32)
    bits[1] = token_mask.ALL  # a free row
    bits[2] = 0
    bits[2, 0] = 1 << 5  # one id allowed
    logits = rng.standard_normal((4, vocab)).astype(np.float32)
    got = np.asarray(jax.jit(token_mask.mask_logits)(logits, bits))
    brute = np.array([[(int(bits[r, t // 32]) >> (t % 32)) & 1 for t in range(vocab)] for r in range(4)], bool)
    assert (token_mask.allowed(bits, vocab) == brute).all()
    want = np.where(brute, logits, -np.inf)
    assert np.array_equal(got, want)  # allowed logits untouched, to the bit
    assert np.array_equal(got[1], logits[1]) and np.flatnonzero(np.isfinite(got[2])).tolist() == [5]
    # greedy through the mask step = the host's float64 masking then argmax
    assert np.argmax(got, 1).tolist() == [int(np.argmax(np.where(brute[r], logits[r].astype(np.float64), -np.inf)))
                                          for r in range(4)]


def test_a_mask_narrower_than_the_vocabulary_allows_nothing_past_it():
    bits = np.array([token_mask.ALL], np.uint32)  # a 32-id tokenizer under a 70-id model
    fitted = token_mask.fit(bits, 70)
    assert fitted.shape == (3,) and fitted.tolist() == [0xFFFFFFFF, 0, 0]
    assert token_mask.allowed(fitted, 70).tolist() == [True] * 32 + [False] * 38


def test_an_engine_compiles_the_mask_step_at_warm_up(tiny_model):
    engine = make_engine(tiny_model, max_concurrency=4)
    try:
        built = engine.program.compilations
        kinds = [c.bucket[0] for c in engine.program.steps.compilations]
        assert kinds.count("mask_logits") == len(engine.program.decode_buckets)
        so = StructuredOutput("regex", r"[a-z]{4} [0-9]{2}")
        handles = [engine.submit([1, 2, 3 + i], SamplingParams(temperature=0 if i % 2 else 1.0, seed=i, max_tokens=16,
                                                               structured_output=so if i < 3 else None))
                   for i in range(4)]
        run_until_done(engine, handles)
        texts = [h.result().text for h in handles]
        assert all(len(t) == 7 and t[:4].isalpha() and t[4] == " " and t[5:].isdigit() for t in texts[:3]), texts
        assert engine.program.compilations == built, "the mask step compiled mid-run"
    finally:
        engine.close()
