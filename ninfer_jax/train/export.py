"""Write a trained model as an ordinary Hugging Face folder that `load_model` reads:
config.json (the built-in geometry plus `mtp_num_hidden_layers` and `dtype`), model.safetensors
(`weights.hf_tensors`: plain Qwen3.5 names, `mtp.*` included), the tokenizer files and chat
template, and metrics.json (held-out figures and how the run went)."""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
from safetensors.numpy import save_file

from ninfer_jax.model.config import ModelConfig
from ninfer_jax.model.weights import hf_tensors

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja")


def hf_config(base: dict, mtp_layers: int = 1, dtype: str = "float32") -> dict:
    """`base` (an HF config dict such as builtin.HF_CONFIG) with the MTP layer count and dtype."""
    return {**base, "mtp_num_hidden_layers": mtp_layers, "dtype": dtype}


def export(folder: str, weights: dict, cfg: ModelConfig, config_json: dict, tokenizer_dir: str,
           metrics: dict | None = None) -> list[str]:
    """Write the folder (created if needed; files there are replaced). `weights` is the
    trainer's {"params", "mtp"} pytree. Returns the file names written."""
    os.makedirs(folder, exist_ok=True)
    params = _numpy(weights["params"])
    mtp = _numpy(weights["mtp"]) if weights.get("mtp") is not None else None
    tensors = hf_tensors(params, mtp, cfg)
    dtype = config_json.get("dtype", "float32")
    tensors = {k: v.astype(dtype) for k, v in tensors.items()}
    save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    os.chmod(os.path.join(folder, "model.safetensors"), 0o644)  # safetensors writes 0600
    _write_json(os.path.join(folder, "config.json"), config_json)
    written = ["config.json", "model.safetensors"]
    for name in TOKENIZER_FILES:
        src = os.path.join(tokenizer_dir, name)
        if not os.path.exists(src):
            raise FileNotFoundError(f"{src} is missing: the export needs the tokenizer's {name}")
        shutil.copyfile(src, os.path.join(folder, name))
        written.append(name)
    if metrics is not None:
        _write_json(os.path.join(folder, "metrics.json"), metrics)
        written.append("metrics.json")
    return written


def folder_bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder)
               if os.path.isfile(os.path.join(folder, n)))


def _numpy(tree):
    import jax

    return jax.tree.map(lambda x: np.asarray(x), tree)


def _write_json(path: str, obj: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
