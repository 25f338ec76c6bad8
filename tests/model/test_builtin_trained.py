"""The trained built-in model shipped in `ninfer_jax/builtin_model/` (issue 16): it loads through
the ordinary Hugging Face path; its held-out perplexity and MTP accuracy, computed here from the
shipped files on the held-out split of the corpus it was trained on; what it writes (greedy and
sampled, through the paged steps) is mostly words of that corpus."""
from __future__ import annotations

import re

import pytest

from ninfer_jax.frontend import Tokenizer
from ninfer_jax.model import builtin, load_model
from ninfer_jax.model.single import generate
from ninfer_jax.model.compiled import CompiledSteps
from ninfer_jax.train import corpus
from ninfer_jax.train.evaluate import heldout_figures, heldout_windows

PERPLEXITY_BOUND = 50.0  # the shipped model: 41.0 (metrics.json); a random one: ~1,000
MTP_TOP1_BOUND = 0.2  # the shipped head: 0.241; chance: ~0.001
WORD = re.compile(r"[a-z]{2,}")


@pytest.fixture(scope="module")
def text():
    return corpus.load()


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.from_folder(builtin.trained_folder())


@pytest.fixture(scope="module")
def trained():
    return load_model(builtin.trained_folder())


@pytest.fixture(scope="module")
def trained_steps(trained):
    return CompiledSteps(trained, progress=False)


def test_the_shipped_folder_loads_through_the_ordinary_path(trained):
    assert trained.config.mtp_num_hidden_layers == 1 and trained.mtp is not None
    assert trained.dtype_name == "float32"
    assert builtin.trained_metrics()["complete"], "the shipped weights come from a finished training run"


def test_builtin_tiny_hybrid_is_the_shipped_folder(trained, tokenizer):
    """The default model name reads the trained folder: same config, weights, MTP head, tokenizer."""
    import chex

    named = load_model(builtin.NAME)
    assert named.name == builtin.NAME and named.config == trained.config == builtin.config()
    chex.assert_trees_all_equal(named.params, trained.params)
    chex.assert_trees_all_equal(named.mtp, trained.mtp)
    assert Tokenizer.builtin().fingerprint == tokenizer.fingerprint


def test_heldout_perplexity_and_mtp_accuracy_of_the_shipped_model(trained, text, tokenizer):
    windows = heldout_windows(tokenizer, text.heldout)
    assert len(windows) >= 100, "the held-out split is large enough to judge"
    got = heldout_figures(trained, windows)
    assert got["heldout_perplexity"] < PERPLEXITY_BOUND, got
    assert got["mtp_top1"] > MTP_TOP1_BOUND, got


@pytest.mark.parametrize("temperature,bound", [(0.0, 0.8), (0.8, 0.65)])
def test_most_generated_words_are_words_of_the_corpus(trained_steps, text, tokenizer, temperature, bound):
    """Greedy: 0.9+ of the words are corpus words; sampled at 0.8: ~0.78 (measured); a random
    model's byte soup: well under half."""
    vocabulary = {w for d in text.train for w in WORD.findall(d.text.lower())}
    words = []
    for seed, prompt in enumerate(["The function returns", "If the argument is", "This module provides"]):
        out = generate(trained_steps, tokenizer.encode(prompt), 40, temperature=temperature, seed=seed)
        words += WORD.findall(tokenizer.decode(out, skip_special_tokens=True).lower())
    assert len(words) >= 30, words
    known = sum(w in vocabulary for w in words) / len(words)
    assert known > bound, (known, words)
