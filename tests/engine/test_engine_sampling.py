"""Sampling: greedy, temperature, top-k, top-p, min-p, penalties, logprobs, and draws that are a
pure function of (seed, position, purpose) (PAUSE-5)."""
import numpy as np
import pytest

from ninfer_jax.engine.detok import Detokenizer
from ninfer_jax.engine.sampling import sample, uniform
from ninfer_jax.engine.types import SamplingParams

LOGITS = np.log(np.array([0.5, 0.2, 0.15, 0.1, 0.05], np.float32))


def _draws(sp, n=400):
    return [sample(LOGITS, sp, seed, 7, [], [])[0] for seed in range(n)]


def test_greedy_is_argmax():
    assert sample(LOGITS, SamplingParams(temperature=0), 1, 0, [], [])[0] == 0


def test_pause5_draw_depends_only_on_seed_position_purpose():
    assert uniform(3, 10) == uniform(3, 10)
    assert uniform(3, 10) != uniform(3, 11) and uniform(3, 10) != uniform(4, 10)
    assert uniform(3, 10, 1) != uniform(3, 10, 2)
    sp = SamplingParams(temperature=1.0)
    assert [sample(LOGITS, sp, 9, p, [], [])[0] for p in range(20)] == \
           [sample(LOGITS, sp, 9, p, [], [])[0] for p in range(20)]


def test_temperature_sampling_follows_the_distribution():
    counts = np.bincount(_draws(SamplingParams(temperature=1.0), 2000), minlength=5) / 2000
    np.testing.assert_allclose(counts, [0.5, 0.2, 0.15, 0.1, 0.05], atol=0.04)


@pytest.mark.parametrize("sp,allowed", [
    (SamplingParams(temperature=1.0, top_k=2), {0, 1}),
    (SamplingParams(temperature=1.0, top_p=0.7), {0, 1}),
    (SamplingParams(temperature=1.0, top_p=0.71), {0, 1, 2}),
    (SamplingParams(temperature=1.0, min_p=0.25), {0, 1, 2}),
    (SamplingParams(temperature=1.0, min_p=0.35), {0, 1}),
])
def test_truncation(sp, allowed):
    got = set(_draws(sp))
    assert got == allowed


def test_penalties_change_the_choice():
    logits = np.array([2.0, 1.9, 0.0], np.float32)
    assert sample(logits, SamplingParams(temperature=0), 0, 0, [], [0])[0] == 0
    assert sample(logits, SamplingParams(temperature=0, repetition_penalty=1.2), 0, 0, [0], [])[0] == 1
    assert sample(logits, SamplingParams(temperature=0, presence_penalty=0.5), 0, 0, [], [0])[0] == 1
    assert sample(logits, SamplingParams(temperature=0, frequency_penalty=0.06), 0, 0, [], [0, 0])[0] == 1
    assert sample(logits, SamplingParams(temperature=0, frequency_penalty=0.06), 0, 0, [], [0])[0] == 0


def test_logprobs():
    token, lp = sample(LOGITS, SamplingParams(temperature=0, logprobs=3), 0, 0, [], [])
    assert lp.token_id == token == 0
    assert lp.logprob == pytest.approx(np.log(0.5), abs=1e-5)
    assert [t for t, _ in lp.top] == [0, 1, 2]


def test_detokenizer_holds_back_a_possible_stop_string():
    vocab = {1: "ab", 2: "c", 3: "X", 4: "Y", 5: "d"}
    d = Detokenizer(lambda ids: "".join(vocab[i] for i in ids), stop=("XY",))
    assert d.push(1) == "ab"
    assert d.push(3) == ""  # "X" could start "XY"
    assert d.push(2) == "Xc"  # it did not
    assert d.push(3) == ""
    assert d.push(4) == "" and d.stopped  # "XY": stop, nothing of it released
    assert d.sent == "abXc"


def test_detokenizer_flush_releases_a_held_prefix():
    d = Detokenizer(lambda ids: "".join({1: "a", 2: "X"}[i] for i in ids), stop=("XY",))
    d.push(1)
    d.push(2)
    assert d.flush() == "X"
