"""Safetensors loading: layouts, prefixes, shards, dtypes, MTP, and one clear error for bad files."""
import json
import logging
import os
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from ninfer_jax.errors import CheckpointError, ConfigError
from ninfer_jax.model.model import load_model
from oracle_paths import oracle_dir


def _copy(model_type, tmp_path, tensors=None, config_change=None):
    """A writable copy of an oracle checkpoint, optionally with other tensors or config fields."""
    src = oracle_dir(model_type)
    dst = tmp_path / model_type
    dst.mkdir()
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    cfg.update(config_change or {})
    (dst / "config.json").write_text(json.dumps(cfg))
    if tensors is None:
        shutil.copy(os.path.join(src, "model.safetensors"), dst / "model.safetensors")
    else:
        save_file(tensors, str(dst / "model.safetensors"))
    return str(dst)


def _tensors(model_type):
    return load_file(os.path.join(oracle_dir(model_type), "model.safetensors"))


@pytest.fixture(scope="module")
def reference_logits():
    out = {}
    for t in ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"):
        fx = np.load(os.path.join(oracle_dir(t), "oracle.npz"))
        out[t] = (fx["prompt"], fx["prompt_logits"])
    return out


def _logits_match(folder, model_type, reference_logits, atol=1e-4, dtype="float32"):
    prompt, want = reference_logits[model_type]
    got = np.asarray(load_model(folder, dtype=dtype).forward(prompt))
    np.testing.assert_allclose(got, want, atol=atol, rtol=0)


def test_language_model_prefix(tmp_path, reference_logits):
    tensors = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v
               for k, v in _tensors("qwen3_5_text").items()}
    _logits_match(_copy("qwen3_5_text", tmp_path, tensors), "qwen3_5_text", reference_logits)


def test_sharded_with_index(tmp_path, reference_logits):
    tensors = _tensors("qwen3_next")
    folder = tmp_path / "sharded"
    folder.mkdir()
    shutil.copy(os.path.join(oracle_dir("qwen3_next"), "config.json"), folder / "config.json")
    names = sorted(tensors)
    weight_map = {}
    for i, part in enumerate((names[::2], names[1::2])):
        fname = f"model-0000{i + 1}-of-00002.safetensors"
        save_file({n: tensors[n] for n in part}, str(folder / fname))
        weight_map.update({n: fname for n in part})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    _logits_match(str(folder), "qwen3_next", reference_logits)


def test_fused_expert_tensors(tmp_path, reference_logits):
    """Experts stored as fused 3-D gate_up / down tensors load like per-expert keys."""
    tensors = _tensors("qwen3_5_moe_text")
    for layer in range(4):
        pre = f"model.layers.{layer}.mlp.experts."
        gates = [tensors.pop(f"{pre}{e}.gate_proj.weight") for e in range(4)]
        ups = [tensors.pop(f"{pre}{e}.up_proj.weight") for e in range(4)]
        downs = [tensors.pop(f"{pre}{e}.down_proj.weight") for e in range(4)]
        tensors[pre + "gate_up_proj"] = np.stack([np.concatenate([g, u]) for g, u in zip(gates, ups)])
        tensors[pre + "down_proj"] = np.stack(downs)
    _logits_match(_copy("qwen3_5_moe_text", tmp_path, tensors), "qwen3_5_moe_text", reference_logits)


def test_bfloat16_tensors_and_dtype(tmp_path, reference_logits):
    import ml_dtypes

    tensors = {k: v.astype(ml_dtypes.bfloat16) for k, v in _tensors("qwen3_5_text").items()}
    folder = _copy("qwen3_5_text", tmp_path, tensors)
    model = load_model(folder, dtype="bfloat16")
    assert model.params["embed"].dtype == ml_dtypes.bfloat16
    # bf16 is for speed, not exactness: the same argmax on most positions is what it promises.
    prompt, want = reference_logits["qwen3_5_text"]
    got = np.asarray(model.forward(prompt))
    assert np.isfinite(got).all()
    assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.75


def test_missing_unexpected_and_misshapen_listed_together(tmp_path):
    tensors = _tensors("qwen3_5_text")
    del tensors["model.layers.0.linear_attn.A_log"]
    tensors["model.layers.3.self_attn.bogus.weight"] = np.zeros(3, np.float32)
    tensors["model.layers.1.mlp.up_proj.weight"] = np.zeros((5, 32), np.float32)
    with pytest.raises(CheckpointError) as err:
        load_model(_copy("qwen3_5_text", tmp_path, tensors))
    e = err.value
    assert e.missing == ("model.layers.0.linear_attn.A_log",)
    assert e.unexpected == ("model.layers.3.self_attn.bogus.weight",)
    assert len(e.misshapen) == 1 and "model.layers.1.mlp.up_proj.weight" in e.misshapen[0]
    for name in ("A_log", "bogus", "up_proj"):
        assert name in str(e)


def test_truncated_file(tmp_path):
    folder = _copy("qwen3_5_text", tmp_path)
    path = os.path.join(folder, "model.safetensors")
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 1000)
    with pytest.raises(CheckpointError, match="truncated"):
        load_model(folder)


def test_no_weights_and_unknown_model_type(tmp_path):
    folder = _copy("qwen3_5_text", tmp_path)
    os.remove(os.path.join(folder, "model.safetensors"))
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        load_model(folder)
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    with pytest.raises(ConfigError, match="model_type"):
        load_model(str(other))
    with pytest.raises(ConfigError, match="model"):
        load_model(str(tmp_path / "does-not-exist"))
    with pytest.raises(ConfigError, match="built-in"):
        load_model("builtin:huge")


def _mtp_tensors(n_layers=1):
    h, d = 32, 16
    t = {"mtp.fc.weight": np.zeros((h, 2 * h), np.float32), "mtp.norm.weight": np.zeros(h, np.float32),
         "mtp.pre_fc_norm_embedding.weight": np.zeros(h, np.float32),
         "mtp.pre_fc_norm_hidden.weight": np.zeros(h, np.float32)}
    for i in range(n_layers):
        p = f"mtp.layers.{i}."
        t.update({p + "input_layernorm.weight": np.zeros(h, np.float32),
                  p + "post_attention_layernorm.weight": np.zeros(h, np.float32),
                  p + "self_attn.q_proj.weight": np.zeros((2 * 4 * d, h), np.float32),
                  p + "self_attn.k_proj.weight": np.zeros((2 * d, h), np.float32),
                  p + "self_attn.v_proj.weight": np.zeros((2 * d, h), np.float32),
                  p + "self_attn.o_proj.weight": np.zeros((h, 4 * d), np.float32),
                  p + "self_attn.q_norm.weight": np.zeros(d, np.float32),
                  p + "self_attn.k_norm.weight": np.zeros(d, np.float32),
                  p + "mlp.gate_proj.weight": np.zeros((48, h), np.float32)})
    return t


def test_mtp_complete_set_is_kept(tmp_path, reference_logits):
    tensors = dict(_tensors("qwen3_5_text"), **_mtp_tensors())
    folder = _copy("qwen3_5_text", tmp_path, tensors, {"mtp_num_hidden_layers": 1})
    model = load_model(folder)
    assert model.mtp is not None and "mtp.fc.weight" in model.mtp
    _logits_match(folder, "qwen3_5_text", reference_logits)


def test_incomplete_mtp_disables_mtp_and_still_loads(tmp_path, caplog, reference_logits):
    mtp = _mtp_tensors()
    del mtp["mtp.fc.weight"]
    folder = _copy("qwen3_5_text", tmp_path, dict(_tensors("qwen3_5_text"), **mtp), {"mtp_num_hidden_layers": 1})
    with caplog.at_level(logging.WARNING, logger="ninfer_jax.model"):
        model = load_model(folder)
    assert model.mtp is None
    assert any("MTP disabled" in r.message and "mtp.fc.weight" in r.message for r in caplog.records)
    _logits_match(folder, "qwen3_5_text", reference_logits)


def test_vision_tensors_ignored_with_warning(tmp_path, caplog, reference_logits):
    tensors = dict(_tensors("qwen3_5_text"), **{"model.visual.blocks.0.attn.qkv.weight": np.zeros((3, 3), np.float32)})
    folder = _copy("qwen3_5_text", tmp_path, tensors)
    with caplog.at_level(logging.WARNING, logger="ninfer_jax.model"):
        _logits_match(folder, "qwen3_5_text", reference_logits)
    assert any("vision" in r.message for r in caplog.records)
