"""The MTP forward (`HybridLM.mtp_logits`, float32) against the float64 numpy reference of the
same formulas (mtp_reference.py), for the three architectures (tiny oracle geometries with a
complete random MTP set) and the trained built-in model's MTP head (issue 17)."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mtp_reference
from ninfer_jax.model import builtin, load_model
from ninfer_jax.model.config import load_config
from ninfer_jax.model.modules import HybridLM, init_params
from ninfer_jax.model.weights import mtp_params
from oracle_paths import ORACLE_TYPES, oracle_dir

# float32 against float64: measured worst |Δlogit| 1.6e-6 (random sets, logits up to ~4) and
# 7.5e-6 (the trained head, logits up to ~19); 1e-4 is the project's float32 noise floor.
TOL = 1e-4
T = 24


def random_mtp_model(model_type: str, seed: int = 17):
    """(cfg, params, mtp): an oracle geometry with one MTP layer, every weight random."""
    cfg = dataclasses.replace(load_config(oracle_dir(model_type)), mtp_num_hidden_layers=1)
    params, mtp = init_params(cfg, seed)
    return cfg, params, mtp


def trained_mtp_model():
    model = load_model(builtin.trained_folder())
    return model.config, model.params, mtp_params(model.mtp, model.config)


def _check(cfg, params, mtp, offset: int):
    lm = HybridLM(cfg, params, mtp)
    tokens = np.random.default_rng(3).integers(0, cfg.vocab_size, T).astype(np.int32)
    _, hidden = jax.jit(lm)(jnp.asarray(tokens))  # compiled whole: eager ops compile one by one
    positions = np.arange(T - 1) + offset
    got = np.asarray(jax.jit(lm.mtp_logits)(hidden[:-1], jnp.asarray(tokens[1:]), jnp.asarray(positions)))
    want = mtp_reference.mtp_logits(cfg, params, mtp, np.asarray(hidden[:-1]), tokens[1:], positions)
    err = np.max(np.abs(got - want))
    assert err < TOL, f"max |Δlogit| {err:.2e} (logits up to {np.max(np.abs(want)):.1f})"
    assert np.array_equal(np.argmax(got, -1), np.argmax(want, -1))


@pytest.mark.parametrize("offset", [0, 61])
@pytest.mark.parametrize("model_type", ORACLE_TYPES)
def test_mtp_logits_equal_float64_reference(model_type, offset):
    """offset 61: positions that are not arange (RoPE of a later chunk, the draft's frontier−1)."""
    _check(*random_mtp_model(model_type), offset)


@pytest.mark.parametrize("offset", [0, 61])
def test_trained_mtp_head_equals_float64_reference(offset):
    cfg, params, mtp = trained_mtp_model()
    assert cfg.tie_word_embeddings and len(mtp["layers"]) == 1
    _check(cfg, params, mtp, offset)
