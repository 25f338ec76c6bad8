"""dtype "auto" (the default): a model runs in its checkpoint's own dtype; an explicit one wins."""
import json
import logging
import os
import shutil

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import ledger
from ninfer_jax.config import EngineConfig
from ninfer_jax.errors import ConfigError
from ninfer_jax.model.model import checkpoint_dtype, load_model, resolve_dtype
from ninfer_jax.program.program import Program
from oracle_paths import oracle_dir

SRC = "qwen3_5_text"
SMALL = dict(max_concurrency=1, max_context=128, progress=False)


def _checkpoint(tmp_path, name, *, tensor_dtype=None, config_dtype=..., legacy=None, keep_f32=()):
    """A copy of an oracle checkpoint with its tensors cast to `tensor_dtype` (names in
    `keep_f32` stay float32) and config.json's `dtype` set (None: removed; ...: unchanged),
    optionally with a legacy `torch_dtype`."""
    dst = tmp_path / name
    dst.mkdir()
    with open(os.path.join(oracle_dir(SRC), "config.json")) as f:
        cfg = json.load(f)
    if config_dtype is None:
        cfg.pop("dtype", None)
    elif config_dtype is not ...:
        cfg["dtype"] = config_dtype
    if legacy is not None:
        cfg["torch_dtype"] = legacy
    (dst / "config.json").write_text(json.dumps(cfg))
    src = os.path.join(oracle_dir(SRC), "model.safetensors")
    if tensor_dtype is None:
        shutil.copy(src, dst / "model.safetensors")
    else:
        tensors = {k: v if any(s in k for s in keep_f32) else v.astype(tensor_dtype) for k, v in load_file(src).items()}
        save_file(tensors, str(dst / "model.safetensors"))
    return str(dst)


def test_default_is_auto_and_builtin_runs_in_float32():
    assert EngineConfig().dtype == "auto"
    assert EngineConfig().resolved_dtype == "float32"
    assert checkpoint_dtype("builtin:tiny-hybrid") == "float32"
    assert load_model("builtin:tiny-hybrid").dtype_name == "float32"


def test_bfloat16_checkpoint_loads_as_bfloat16_by_default(tmp_path):
    folder = _checkpoint(tmp_path, "bf16", tensor_dtype=ml_dtypes.bfloat16, config_dtype="bfloat16")
    model = load_model(folder)
    assert model.dtype_name == "bfloat16"
    assert model.params["embed"].dtype == ml_dtypes.bfloat16
    program = Program(EngineConfig(model=folder, **SMALL))
    assert program.dtype == "bfloat16" and "|bfloat16|" in program.execution_tag
    # bfloat16 pools, stored packed on the "xla" path (uint16 bits: XLA's CPU scatter of
    # bfloat16 would convert the whole pool at each write)
    from pallas_kernels._common import storage_dtype

    assert program.stores.pools[ledger.MAIN_KV].tree["k"][0].dtype == storage_dtype(ml_dtypes.bfloat16, "xla")
    assert program.stores.pools[ledger.MAIN_KV].tree["k"][0].dtype.itemsize == 2
    assert program.model.params["norm"].dtype == ml_dtypes.bfloat16


def test_float32_checkpoint_loads_as_float32_by_default(tmp_path):
    folder = oracle_dir(SRC)
    assert checkpoint_dtype(folder) == "float32"
    assert load_model(folder).params["embed"].dtype == np.float32
    config = EngineConfig(model=folder, **SMALL)
    assert config.dtype == "auto" and config.resolved_dtype == "float32"
    assert Program(config).dtype == "float32"


def test_explicit_dtype_wins(tmp_path):
    bf16 = _checkpoint(tmp_path, "bf16", tensor_dtype=ml_dtypes.bfloat16, config_dtype="bfloat16")
    assert load_model(bf16, dtype="float32").params["embed"].dtype == np.float32
    assert EngineConfig(model=bf16, dtype="float32").resolved_dtype == "float32"
    assert Program(EngineConfig(model=bf16, dtype="float32", **SMALL)).dtype == "float32"
    f32 = oracle_dir(SRC)
    assert load_model(f32, dtype="bfloat16").params["embed"].dtype == ml_dtypes.bfloat16
    assert resolve_dtype(f32, "bfloat16") == "bfloat16"


def test_without_a_declared_dtype_the_safetensors_decide(tmp_path):
    # Mostly bfloat16 bytes with the GDN decay parameters kept in float32, as real checkpoints do.
    folder = _checkpoint(tmp_path, "mixed", tensor_dtype=ml_dtypes.bfloat16, config_dtype=None,
                         keep_f32=("A_log", "dt_bias"))
    assert checkpoint_dtype(folder) == "bfloat16"
    assert load_model(folder).dtype_name == "bfloat16"
    f32 = _checkpoint(tmp_path, "f32", config_dtype=None)
    assert checkpoint_dtype(f32) == "float32"


def test_legacy_torch_dtype_is_read(tmp_path):
    folder = _checkpoint(tmp_path, "legacy", config_dtype=None, legacy="bfloat16")
    assert checkpoint_dtype(folder) == "bfloat16"
    assert EngineConfig(model=folder).resolved_dtype == "bfloat16"


def test_float16_checkpoint_runs_in_bfloat16_with_a_warning(tmp_path, caplog):
    folder = _checkpoint(tmp_path, "f16", tensor_dtype=np.float16, config_dtype=None)
    assert checkpoint_dtype(folder) == "float16"
    with caplog.at_level(logging.WARNING, logger="ninfer_jax.model"):
        assert resolve_dtype(folder) == "bfloat16"
    assert "float16" in caplog.text and "bfloat16" in caplog.text


def test_unsupported_dtypes_are_config_errors(tmp_path):
    with pytest.raises(ConfigError) as err:
        EngineConfig(dtype="float16")
    assert err.value.field == "dtype"
    folder = _checkpoint(tmp_path, "fp8", config_dtype="float8_e4m3fn")
    with pytest.raises(ConfigError) as err:
        resolve_dtype(folder)
    assert err.value.field == "dtype" and "float8_e4m3fn" in str(err.value)
    with pytest.raises(ConfigError) as err:
        EngineConfig(model=str(tmp_path / "nowhere")).resolved_dtype
    assert err.value.field == "model"
