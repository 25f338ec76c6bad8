"""Interleaved (and contiguous) M-RoPE in `rope_cos_sin`: the 1-D path unchanged, equal triples
bit-identical to it, distinct triples against transformers' rotary embedding, and
`mrope_section` / `mrope_interleaved` validation in the config."""
from __future__ import annotations

import copy
import dataclasses
import json
import types

import jax.numpy as jnp
import numpy as np
import pytest

from ninfer_jax.errors import ConfigError
from ninfer_jax.model.config import parse_config
from ninfer_jax.model.layers import rope_cos_sin
from oracle_paths import ORACLE_TYPES, oracle_dir


def _raw(model_type):
    with open(f"{oracle_dir(model_type)}/config.json") as f:
        return json.load(f)


def _released(interleaved=True):
    """The oracle MoE config with the released rotary geometry: head_dim 256, factor 0.25,
    section [11, 11, 10] (rotary_dim 64)."""
    raw = _raw("qwen3_5_moe_text")
    raw.update(head_dim=256, rope_parameters=dict(
        rope_type="default", rope_theta=10_000_000.0, partial_rotary_factor=0.25,
        mrope_section=[11, 11, 10], mrope_interleaved=interleaved))
    return raw


def _positions(shape, seed=0, high=5000):
    return np.random.default_rng(seed).integers(0, high, size=shape).astype(np.int32)


def test_oracle_configs_parse_mrope():
    assert parse_config(_raw("qwen3_5_moe_text")).mrope_section == (2, 1, 1)
    assert parse_config(_raw("qwen3_5_moe_text")).mrope_interleaved is True
    for t in ("qwen3_next", "qwen3_5_text"):
        cfg = parse_config(_raw(t))
        assert cfg.mrope_section is None and cfg.mrope_interleaved is False
    cfg = parse_config(_released())
    assert cfg.rotary_dim == 64 and cfg.mrope_section == (11, 11, 10)


@pytest.mark.parametrize("model_type", ORACLE_TYPES)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_one_d_path_matches_numpy_and_equal_triples(model_type, dtype):
    cfg = parse_config(_raw(model_type))
    pos = _positions((2, 33))
    cos, sin = rope_cos_sin(jnp.asarray(pos), cfg, dtype)
    # An independent numpy formula (float64), to float32 rounding.
    dim = cfg.rotary_dim
    inv = 1.0 / cfg.rope_theta ** (np.arange(0, dim, 2) / dim)
    emb = np.concatenate([pos[..., None] * inv] * 2, axis=-1)
    tol = 1e-3 if dtype == jnp.float32 else 1e-2  # float32 argument rounding at |x| ~ 5000
    np.testing.assert_allclose(np.asarray(cos, np.float32), np.cos(emb), atol=tol)
    np.testing.assert_allclose(np.asarray(sin, np.float32), np.sin(emb), atol=tol)
    if cfg.mrope_section is None:
        return
    for flag in (True, False):
        c = dataclasses.replace(cfg, mrope_interleaved=flag)
        cos3, sin3 = rope_cos_sin(jnp.asarray(np.stack([pos] * 3)), c, dtype, triples=True)
        # Bit-identical: the same float32 products, only gathered.
        assert np.array_equal(np.asarray(cos3), np.asarray(cos))
        assert np.array_equal(np.asarray(sin3), np.asarray(sin))


def _hf_rotary(raw, interleaved):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding
    from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeTextRotaryEmbedding

    fields = {k: v for k, v in raw.items() if k not in ("model_type", "architectures", "transformers_version")}
    rotary = Qwen3_5MoeTextRotaryEmbedding(Qwen3_5MoeTextConfig(**fields))
    if not interleaved:
        # Qwen3.5's class always interleaves (it ignores the flag); the contiguous layout is
        # Qwen2-VL's recomposition, on the same partial-rotary frequencies.
        rotary.recomposition_frequencies = types.MethodType(
            Qwen2VLRotaryEmbedding.recomposition_frequencies, rotary)
    return rotary


@pytest.mark.parametrize("which,interleaved", [
    ("oracle", True), ("oracle", False), ("released", True), ("released", False)])
def test_distinct_triples_match_transformers(which, interleaved):
    import torch

    raw = _raw("qwen3_5_moe_text") if which == "oracle" else _released(interleaved)
    raw["rope_parameters"]["mrope_interleaved"] = interleaved
    rotary = _hf_rotary(raw, interleaved)
    cfg = parse_config(raw)
    pos = _positions((3, 2, 41), seed=1)
    want_cos, want_sin = rotary(torch.zeros(1, dtype=torch.float32), torch.from_numpy(pos).long())
    cos, sin = rope_cos_sin(jnp.asarray(pos), cfg, jnp.float32, triples=True)
    np.testing.assert_allclose(np.asarray(cos), want_cos.numpy(), rtol=0, atol=1e-6)
    np.testing.assert_allclose(np.asarray(sin), want_sin.numpy(), rtol=0, atol=1e-6)
    # The triples matter: t alone (the 1-D path) differs wherever h, w differ from t.
    assert not np.allclose(np.asarray(rope_cos_sin(jnp.asarray(pos[0]), cfg, jnp.float32)[0]), want_cos.numpy())


def test_triples_need_a_section_and_a_leading_three():
    cfg = parse_config(_raw("qwen3_5_text"))
    with pytest.raises(ValueError, match="mrope_section"):
        rope_cos_sin(jnp.zeros((3, 4), jnp.int32), cfg, jnp.float32, triples=True)
    cfg = parse_config(_raw("qwen3_5_moe_text"))
    with pytest.raises(ValueError, match="positions"):
        rope_cos_sin(jnp.zeros((2, 4), jnp.int32), cfg, jnp.float32, triples=True)


@pytest.mark.parametrize("section,interleaved,match", [
    ([2, 1], True, "3 non-negative ints"),
    ([2, 1, 1, 0], True, "3 non-negative ints"),
    ([2, 1, 2], True, "sum to rotary_dim/2 = 4"),
    ([11, 11, 10], True, "sum to rotary_dim/2 = 4"),
    ([2, True, 1], True, "3 non-negative ints"),
    ([2.0, 1, 1], True, "3 non-negative ints"),
    ([3, 2, -1], True, "3 non-negative ints"),
    ("2,1,1", True, "3 non-negative ints"),
    ([2, 1, 1], 1, "expected a bool"),
    ([2, 1, 1], "true", "expected a bool"),
])
def test_bad_mrope_is_a_config_error(section, interleaved, match):
    raw = copy.deepcopy(_raw("qwen3_5_moe_text"))
    raw["rope_parameters"].update(mrope_section=section, mrope_interleaved=interleaved)
    with pytest.raises(ConfigError, match=match) as err:
        parse_config(raw)
    assert "rope_parameters.mrope_" in str(err.value)
