"""HF config.json in both published styles, and clear errors naming the field."""
import copy
import json

import pytest

from ninfer_jax.errors import ConfigError
from ninfer_jax.model.config import FULL, LINEAR, load_config, parse_config
from oracle_paths import oracle_dir


def _raw(model_type):
    with open(f"{oracle_dir(model_type)}/config.json") as f:
        return json.load(f)


def test_current_fields_qwen3_next():
    cfg = parse_config(_raw("qwen3_next"))
    assert cfg.layer_types == (LINEAR, LINEAR, LINEAR, FULL)
    assert cfg.mlp_types == ("moe", "dense", "moe", "moe")  # mlp_only_layers=[1]
    assert cfg.rotary_dim == 8 and cfg.grouped_projections


def test_legacy_fields_give_the_same_config():
    raw = _raw("qwen3_5_text")
    legacy = {k: v for k, v in raw.items() if k not in ("layer_types", "rope_parameters")}
    legacy.update(full_attention_interval=4, rope_theta=10000.0, partial_rotary_factor=0.5)
    assert parse_config(legacy) == parse_config(raw)


def test_legacy_default_rotary_factor_is_quarter():
    raw = _raw("qwen3_5_text")
    raw.pop("rope_parameters")
    assert parse_config(raw).partial_rotary_factor == 0.25


@pytest.mark.parametrize("wrapper,inner", [("qwen3_5", "qwen3_5_text"), ("qwen3_5_moe", "qwen3_5_moe_text")])
def test_nested_text_config(wrapper, inner):
    text = _raw(inner)
    text.pop("model_type")
    text.pop("tie_word_embeddings")
    nested = {"model_type": wrapper, "text_config": text, "vision_config": {"depth": 2},
              "tie_word_embeddings": False, "eos_token_id": 7}
    cfg = parse_config(nested)
    assert cfg.model_type == inner
    assert cfg.eos_token_id == (7,)
    assert cfg == parse_config(dict(_raw(inner), eos_token_id=7))


def test_mtp_fields_both_names():
    raw = _raw("qwen3_next")
    assert parse_config(dict(raw, mtp_num_hidden_layers=1)).mtp_num_hidden_layers == 1
    assert parse_config(dict(raw, num_nextn_predict_layers=2)).mtp_num_hidden_layers == 2


@pytest.mark.parametrize("change,field", [
    ({"model_type": "llama"}, "model_type"),
    ({"layer_types": ["linear_attention"] * 3}, "layer_types"),
    ({"layer_types": ["linear_attention"] * 3 + ["sliding"]}, "layer_types"),
    ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ({"linear_num_value_heads": 3}, "linear_num_value_heads"),
    ({"hidden_size": -1}, "hidden_size"),
    ({"hidden_size": "64"}, "hidden_size"),
    ({"vocab_size": None}, "vocab_size"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}}, "rope_parameters.rope_type"),
    ({"num_experts_per_tok": 9}, "num_experts_per_tok"),
    ({"mlp_only_layers": [7]}, "mlp_only_layers"),
])
def test_bad_config_names_the_field(change, field):
    raw = copy.deepcopy(_raw("qwen3_next"))
    raw.update(change)
    with pytest.raises(ConfigError) as err:
        parse_config(raw)
    assert err.value.field == field
    assert field in str(err.value)


def test_missing_and_invalid_config_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(str(tmp_path))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_config(str(tmp_path))
