"""The model against transformers (float32, eager attention and experts) on tiny random models.

Fixtures come from scripts/make_oracle_fixtures.py; the live tier reruns transformers when it
is importable (CI installs it), so the fixtures cannot silently go stale.
"""
import importlib.util

import numpy as np
import pytest

from ninfer_jax.model import single

from oracle_paths import ORACLE_TYPES, oracle_dir

TOL = 1e-4  # the float32 noise floor (DESIGN.md)


def _fixture(model_type):
    return np.load(f"{oracle_dir(model_type)}/oracle.npz")


@pytest.mark.parametrize("model_type", ORACLE_TYPES)
@pytest.mark.parametrize("which", ["prompt", "long"])
def test_forward_logits_match_transformers(oracle_models, model_type, which):
    model, _ = oracle_models[model_type]
    fx = _fixture(model_type)
    logits = np.asarray(model.forward(fx[which]))
    assert logits.shape == fx[f"{which}_logits"].shape
    np.testing.assert_allclose(logits, fx[f"{which}_logits"], atol=TOL, rtol=0)


@pytest.mark.parametrize("model_type", ORACLE_TYPES)
def test_greedy_tokens_match_transformers_through_paged_steps(oracle_models, model_type):
    """Greedy decoding through the paged KV and state slots gives transformers' tokens."""
    _, steps = oracle_models[model_type]
    fx = _fixture(model_type)
    tokens = single.generate(steps, fx["prompt"], len(fx["greedy"]), max_context=256, chunk=64)
    assert tokens == fx["greedy"].tolist()


HAVE_TRANSFORMERS = all(importlib.util.find_spec(m) for m in ("torch", "transformers"))


@pytest.mark.oracle
@pytest.mark.skipif(not HAVE_TRANSFORMERS, reason="live oracle tier needs torch and transformers")
@pytest.mark.parametrize("model_type", ORACLE_TYPES)
def test_live_transformers_agrees_with_fixture_and_model(oracle_models, model_type):
    import torch
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(
        oracle_dir(model_type), attn_implementation="eager", experts_implementation="eager",
        dtype=torch.float32)
    model, _ = oracle_models[model_type]
    fx = _fixture(model_type)
    for which in ("prompt", "long"):
        with torch.no_grad():
            live = hf(torch.tensor([fx[which].tolist()]), use_cache=False).logits[0].numpy()
        np.testing.assert_allclose(live, fx[f"{which}_logits"], atol=1e-6, rtol=0)
        np.testing.assert_allclose(np.asarray(model.forward(fx[which])), live, atol=TOL, rtol=0)
