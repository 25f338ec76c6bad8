"""The DFlash drafter (issue 35, first piece): a tiny random drafter in the published layout,
its JAX forward against a float64 numpy reference of the published formulas (z-lab/dflash
`dflash/model.py`), config / checkpoint / fit errors, and context K/V reuse."""
import copy
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import save_file

from ninfer_jax.errors import CheckpointError, ConfigError
from ninfer_jax.model import dflash
from ninfer_jax.model.config import parse_config

H, LAYERS, HQ, HKV, D, INTER, VOCAB = 32, 2, 4, 2, 8, 48, 64
BASE = {
    "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": H,
    "num_hidden_layers": LAYERS, "num_attention_heads": HQ, "num_key_value_heads": HKV, "head_dim": D,
    "intermediate_size": INTER, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "vocab_size": VOCAB,
    "max_position_embeddings": 512, "hidden_act": "silu", "attention_bias": False, "num_target_layers": 4,
    "tie_word_embeddings": False, "use_sliding_window": False, "sliding_window": None,
    "dflash_config": {"mask_token_id": VOCAB - 1, "target_layer_ids": [0, 2], "block_size": 4},
}
TARGET = {
    "model_type": "qwen3_5_text", "vocab_size": VOCAB, "hidden_size": H, "num_hidden_layers": 4,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"], "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 8, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "intermediate_size": 64,
}


def _tensors(raw: dict, seed: int = 0) -> dict:
    """Random weights in the published names; norm weights near 1 but not 1 (so x·w and x·(1+w)
    differ), projections small enough to keep activations O(1)."""
    rng = np.random.default_rng(seed)
    cfg = dflash.parse_dflash_config(raw)
    out = {}
    for name, shape in dflash.hf_shapes(cfg).items():
        if len(shape) == 1:
            out[name] = (1.0 + 0.2 * rng.standard_normal(shape)).astype(np.float32)
        else:
            out[name] = (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
    return out


def _write(folder: str, raw: dict, tensors: dict) -> str:
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(raw, f)
    save_file(tensors, os.path.join(folder, "model.safetensors"))
    return folder


def _raw(**changes) -> dict:
    raw = copy.deepcopy(BASE)
    raw.update(copy.deepcopy(changes))
    return raw


# ---- the float64 reference, from the published formulas --------------------------------------

def _norm(x, w, eps):
    return w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def _rope(x, pos, theta):
    d = x.shape[-1]
    inv = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    f = pos.astype(np.float64)[:, None] * inv
    emb = np.concatenate([f, f], axis=-1)[:, None, :]
    rot = np.concatenate([-x[..., d // 2:], x[..., :d // 2]], axis=-1)
    return x * np.cos(emb) + rot * np.sin(emb)


def reference(t: dict, raw: dict, features, ctx_pos, embeds, block_pos):
    """DFlashDraftModel.forward over [context ; block], no cache: float64 throughout."""
    t = {k: np.asarray(v, np.float64) for k, v in t.items()}
    eps, theta = raw["rms_norm_eps"], raw["rope_theta"]
    cfg = dflash.parse_dflash_config(raw)
    ctx = _norm(np.asarray(features, np.float64) @ t["fc.weight"].T, t["hidden_norm.weight"], eps)
    h = np.asarray(embeds, np.float64) * cfg.input_embedding_scale
    b, s = h.shape[0], ctx.shape[0]
    key_pos = np.concatenate([ctx_pos, block_pos])
    for n in range(LAYERS):
        p = lambda name: t[f"layers.{n}.{name}"]  # noqa: E731
        x = _norm(h, p("input_layernorm.weight"), eps)
        both = np.concatenate([ctx, x])  # the context skips input_layernorm
        q = _norm((x @ p("self_attn.q_proj.weight").T).reshape(b, HQ, D), p("self_attn.q_norm.weight"), eps)
        k = _norm((both @ p("self_attn.k_proj.weight").T).reshape(s + b, HKV, D), p("self_attn.k_norm.weight"), eps)
        v = (both @ p("self_attn.v_proj.weight").T).reshape(s + b, HKV, D)
        q, k = _rope(q, block_pos, theta), _rope(k, key_pos, theta)
        k, v = np.repeat(k, HQ // HKV, axis=1), np.repeat(v, HQ // HKV, axis=1)
        scores = np.einsum("bhd,shd->hbs", q, k) / np.sqrt(D)
        window, causal = cfg.layer_windows[n], cfg.layer_causal[n]
        for i, qp in enumerate(block_pos):
            for j, kp in enumerate(key_pos):
                ok = (not causal or kp <= qp) and (window is None or (qp - kp < window and (causal or kp - qp < window)))
                if not ok:
                    scores[:, i, j] = -np.inf
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        o = np.einsum("hbs,shd->bhd", probs, v).reshape(b, HQ * D)
        h = h + o @ p("self_attn.o_proj.weight").T
        x = _norm(h, p("post_attention_layernorm.weight"), eps)
        gate = x @ p("mlp.gate_proj.weight").T
        h = h + ((gate / (1 + np.exp(-gate))) * (x @ p("mlp.up_proj.weight").T)) @ p("mlp.down_proj.weight").T
    return _norm(h, t["norm.weight"], eps)


def _inputs(cfg, ctx_len: int, last_token: int, seed: int = 1):
    """Target features for positions 0..ctx_len-1, and the block [last, mask × (B-1)] embedded
    with a random 'target' embedding table."""
    rng = np.random.default_rng(seed)
    features = rng.standard_normal((ctx_len, len(cfg.target_layer_ids) * H)).astype(np.float32)
    embed = (0.5 * rng.standard_normal((VOCAB, H))).astype(np.float32)
    tokens = np.array([last_token] + [cfg.mask_token_id] * (cfg.block_size - 1))
    block_pos = np.arange(ctx_len, ctx_len + cfg.block_size, dtype=np.int32)
    return features, np.arange(ctx_len, dtype=np.int32), embed, embed[tokens], block_pos


LAYOUTS = {
    "full": {},
    # Layer 0 slides (window 3, causal in the block, as the reference resolves it), layer 1 is full.
    "sliding": {"layer_types": ["sliding_attention", "full_attention"], "use_sliding_window": True,
                "sliding_window": 3},
    "all_causal": {"dflash_config": dict(BASE["dflash_config"], causal=True)},
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_forward_matches_float64_reference(tmp_path, layout):
    raw = _raw(**copy.deepcopy(LAYOUTS[layout]))
    t = _tensors(raw)
    drafter = dflash.load_drafter(_write(str(tmp_path / "d"), raw, t), jnp.float32)
    cfg = drafter.config
    features, ctx_pos, _, embeds, block_pos = _inputs(cfg, ctx_len=7, last_token=5)
    fwd = jax.jit(dflash.forward, static_argnums=1)
    got = np.asarray(fwd(drafter.params, cfg, features, ctx_pos, embeds, block_pos))
    want = reference(t, raw, features, ctx_pos, embeds, block_pos)
    assert got.shape == (cfg.block_size, H)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def test_layout_and_norm_convention_matter(tmp_path):
    """The reference is sensitive to what the test claims: a sliding layer changes the output,
    and zero-centred norms (x·(1+w)) would not match."""
    raw = _raw()
    t = _tensors(raw)
    features, ctx_pos, _, embeds, block_pos = _inputs(dflash.parse_dflash_config(raw), 7, 5)
    full = reference(t, raw, features, ctx_pos, embeds, block_pos)
    sliding = reference(t, _raw(**LAYOUTS["sliding"]), features, ctx_pos, embeds, block_pos)
    assert np.abs(full - sliding).max() > 1e-3
    shifted = {k: (v - 1.0 if v.ndim == 1 else v) for k, v in t.items()}
    drafter = dflash.load_drafter(_write(str(tmp_path / "d"), raw, shifted), jnp.float32)
    got = np.asarray(dflash.forward(drafter.params, drafter.config, features, ctx_pos, embeds, block_pos))
    assert np.abs(got - full).max() > 1e-3


def test_context_kv_once_serves_several_blocks(tmp_path):
    raw = _raw(**LAYOUTS["sliding"])
    t = _tensors(raw)
    drafter = dflash.load_drafter(_write(str(tmp_path / "d"), raw, t), jnp.float32)
    cfg, params = drafter.config, drafter.params
    features, ctx_pos, embed, _, block_pos = _inputs(cfg, 7, 5)

    # Context computed in two appends equals it computed at once (an engine caches it).
    k, v = jax.jit(dflash.context_kv, static_argnums=1)(params, cfg, features, ctx_pos)
    k1, v1 = dflash.context_kv(params, cfg, features[:4], ctx_pos[:4])
    k2, v2 = dflash.context_kv(params, cfg, features[4:], ctx_pos[4:])
    np.testing.assert_allclose(np.concatenate([k1, k2], axis=1), k, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.concatenate([v1, v2], axis=1), v, rtol=1e-6, atol=1e-6)
    assert k.shape == (LAYERS, 7, HKV, D)

    # A padded cache (rows past ctx_len hold NaN) drafts two different blocks against it.
    pad = jnp.full((LAYERS, 5, HKV, D), jnp.nan, jnp.float32)
    kp, vp = jnp.concatenate([k, pad], axis=1), jnp.concatenate([v, pad], axis=1)
    positions = jnp.concatenate([ctx_pos, jnp.full((5,), 10**6, jnp.int32)])
    step = jax.jit(dflash.draft_block, static_argnums=1)
    outs = []
    for last in (5, 17):
        tokens = np.array([last] + [cfg.mask_token_id] * (cfg.block_size - 1))
        got = np.asarray(step(params, cfg, kp, vp, 7, embed[tokens], block_pos, positions))
        whole = np.asarray(dflash.forward(params, cfg, features, ctx_pos, embed[tokens], block_pos))
        np.testing.assert_allclose(got, whole, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got, reference(t, raw, features, ctx_pos, embed[tokens], block_pos),
                                   rtol=2e-5, atol=2e-5)
        outs.append(got)
    assert np.abs(outs[0] - outs[1]).max() > 1e-3


def test_draft_logits(tmp_path):
    raw = _raw(dflash_config=dict(BASE["dflash_config"], output_multiplier=0.5, final_logit_softcapping=3.0))
    cfg = dflash.parse_dflash_config(raw)
    rng = np.random.default_rng(3)
    hidden = rng.standard_normal((3, H)).astype(np.float32)
    embed = rng.standard_normal((VOCAB, H)).astype(np.float32)
    want = np.tanh((hidden.astype(np.float64) @ embed.T.astype(np.float64)) * 0.5 / 3.0) * 3.0
    np.testing.assert_allclose(dflash.draft_logits(cfg, hidden, embed.T), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dflash.draft_logits(cfg, hidden, embed, tied=True), want, rtol=1e-5, atol=1e-5)
    plain = dflash.parse_dflash_config(_raw())
    np.testing.assert_allclose(dflash.draft_logits(plain, hidden, embed.T), hidden @ embed.T, rtol=1e-5, atol=1e-4)


def test_bfloat16_load_and_forward(tmp_path):
    raw = _raw(dtype="bfloat16")
    t = _tensors(raw)
    stored = {k: v.astype(jnp.bfloat16) for k, v in t.items()}
    drafter = dflash.load_drafter(_write(str(tmp_path / "d"), raw, stored), jnp.bfloat16)
    assert drafter.params["layers"][1]["q_proj"].dtype == jnp.bfloat16
    assert drafter.params["fc"].shape == (2 * H, H)
    features, ctx_pos, _, embeds, block_pos = _inputs(drafter.config, 7, 5)
    got = dflash.forward(drafter.params, drafter.config, features.astype(jnp.bfloat16), ctx_pos,
                         embeds.astype(jnp.bfloat16), block_pos)
    assert got.dtype == jnp.bfloat16
    want = reference({k: np.asarray(v, np.float32) for k, v in stored.items()}, raw, features, ctx_pos, embeds,
                     block_pos)
    np.testing.assert_allclose(np.asarray(got, np.float32), want, atol=0.15)


# ---- config ----------------------------------------------------------------------------------

def test_block_size_at_the_top_level():
    sub = {k: v for k, v in BASE["dflash_config"].items() if k != "block_size"}
    cfg = dflash.parse_dflash_config(_raw(block_size=8, dflash_config=sub))
    assert cfg.block_size == 8 and cfg.target_layer_ids == (0, 2) and cfg.mask_token_id == VOCAB - 1
    assert cfg.layer_windows == (None, None) and cfg.layer_causal == (False, False)
    assert cfg.kv_bytes_per_token(2) == 2 * LAYERS * HKV * D * 2


def test_layer_types_default_like_transformers():
    cfg = dflash.parse_dflash_config(_raw(use_sliding_window=True, sliding_window=16, max_window_layers=1))
    assert cfg.layer_windows == (None, 16) and cfg.layer_causal == (False, True)


@pytest.mark.parametrize("change,field", [
    ({"architectures": ["Qwen3ForCausalLM"]}, "architectures"),
    ({"architectures": ["DFlash2DraftModel"]}, "architectures"),
    ({"model_type": "llama"}, "model_type"),
    ({"hidden_size": None}, "hidden_size"),
    ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ({"rope_theta": None}, "rope_theta"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e7}}, "rope_parameters.rope_type"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"attention_bias": True}, "attention_bias"),
    ({"dflash_config": None}, "dflash_config"),
    ({"dflash_config": {"target_layer_ids": [0, 2], "block_size": 4}}, "dflash_config.mask_token_id"),
    ({"dflash_config": {"mask_token_id": 1, "block_size": 4}}, "dflash_config.target_layer_ids"),
    ({"dflash_config": {"mask_token_id": 1, "target_layer_ids": [0, -1], "block_size": 4}},
     "dflash_config.target_layer_ids"),
    ({"dflash_config": {"mask_token_id": 1, "target_layer_ids": [0]}}, "dflash_config.block_size"),
    ({"dflash_config": {"mask_token_id": 1, "target_layer_ids": [0], "block_size": 1}}, "dflash_config.block_size"),
    ({"block_size": 16}, "dflash_config.block_size"),  # both places, different
    ({"dflash_config": dict(BASE["dflash_config"], conv_kernel_size=2)}, "dflash_config.conv_kernel_size"),
    ({"dflash_config": dict(BASE["dflash_config"], causal="yes")}, "dflash_config.causal"),
    ({"layer_types": ["sliding_attention", "full_attention"]}, "sliding_window"),  # no window in force
    ({"layer_types": ["full_attention"]}, "layer_types"),
])
def test_config_errors_name_the_field(change, field):
    with pytest.raises(ConfigError) as err:
        dflash.parse_dflash_config(_raw(**change))
    assert err.value.field == field


def test_nested_folder_is_found(tmp_path):
    raw = _raw()
    inner = _write(str(tmp_path / "outer" / "drafter"), raw, _tensors(raw))
    os.makedirs(tmp_path / "outer" / "assets")
    drafter = dflash.load_drafter(str(tmp_path / "outer"), jnp.float32)
    assert drafter.folder == inner and drafter.config.block_size == 4
    assert dflash.load_drafter(inner, jnp.float32).folder == inner


def test_folder_errors(tmp_path):
    with pytest.raises(ConfigError) as err:
        dflash.load_drafter(str(tmp_path), jnp.float32)
    assert err.value.field == "config.json"
    raw = _raw()
    _write(str(tmp_path / "a"), raw, _tensors(raw))
    _write(str(tmp_path / "b"), raw, _tensors(raw))
    with pytest.raises(ConfigError) as err:
        dflash.load_drafter(str(tmp_path), jnp.float32)
    assert err.value.field == "draft_model"


# ---- checkpoint ------------------------------------------------------------------------------

def test_checkpoint_errors_list_every_problem(tmp_path):
    raw = _raw()
    t = _tensors(raw)
    t.pop("layers.1.mlp.up_proj.weight")
    t["layers.0.self_attn.q_norm.weight"] = np.ones(D + 1, np.float32)
    t["lm_head.weight"] = np.zeros((VOCAB, H), np.float32)  # a drafter uses the target's head
    with pytest.raises(CheckpointError) as err:
        dflash.load_drafter(_write(str(tmp_path / "d"), raw, t), jnp.float32)
    assert err.value.missing == ("layers.1.mlp.up_proj.weight",)
    assert err.value.unexpected == ("lm_head.weight",)
    assert len(err.value.misshapen) == 1 and err.value.misshapen[0].startswith("layers.0.self_attn.q_norm.weight")


def test_fc_width_follows_target_layer_ids(tmp_path):
    raw = _raw()
    t = _tensors(raw)
    three = _raw(dflash_config=dict(BASE["dflash_config"], target_layer_ids=[0, 1, 2]))
    with pytest.raises(CheckpointError) as err:
        dflash.load_drafter(_write(str(tmp_path / "d"), three, t), jnp.float32)
    assert [m.split()[0] for m in err.value.misshapen] == ["fc.weight"]


# ---- fit against the target --------------------------------------------------------------------

def test_fits_the_target():
    dflash.check_drafter_fits(dflash.parse_dflash_config(_raw()), parse_config(TARGET))


@pytest.mark.parametrize("drafter,target,field", [
    ({}, {"hidden_size": 48}, "hidden_size"),
    ({}, {"vocab_size": 128}, "vocab_size"),
    ({"vocab_size": None, "dflash_config": dict(BASE["dflash_config"], mask_token_id=VOCAB)}, {},
     "dflash_config.mask_token_id"),
    ({"num_target_layers": None, "dflash_config": dict(BASE["dflash_config"], target_layer_ids=[0, 4])}, {},
     "dflash_config.target_layer_ids"),
    ({"num_target_layers": 8}, {}, "num_target_layers"),
])
def test_fit_errors(drafter, target, field):
    cfg = dflash.parse_dflash_config(_raw(**drafter))
    with pytest.raises(ConfigError) as err:
        dflash.check_drafter_fits(cfg, parse_config(dict(TARGET, **target)))
    assert err.value.field == field
