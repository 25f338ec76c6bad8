"""`builtin:tiny-hybrid`: a small Qwen3.5-style hybrid trained on the English text that ships
with Python, with one MTP layer.

It lets everything (CLI, tests, benchmarks) run with nothing downloaded. Its weights, tokenizer
(1024 ids) and chat template are an ordinary Hugging Face folder in the package
(`ninfer_jax/builtin_model/`, written by `scripts/train_builtin.py`); `HF_CONFIG` is the
architecture that script trains (the shipped config.json adds the MTP layer count and dtype).
The layer pattern is the family's: three GDN layers, then one gated full-attention layer.
"""
from __future__ import annotations

import functools

from ninfer_jax.model.config import ModelConfig

NAME = "builtin:tiny-hybrid"

HF_CONFIG = {
    "model_type": "qwen3_5_text",
    "vocab_size": 1024,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "max_position_embeddings": 32768,
    "eos_token_id": [1010, 1008],  # <|im_end|>, <|endoftext|> of the built-in tokenizer
}


TRAINED_PACKAGE = "ninfer_jax.builtin_model"  # the trained model's shipped folder
# The shipped DFlash drafter of the trained model (scripts/train_builtin_dflash.py, issue 35):
# `--speculative_method=dflash` alone on the built-in model, or `--draft_model=` this name.
DRAFTER_NAME = "builtin:tiny-hybrid-dflash"


def trained_folder() -> str:
    """The shipped Hugging Face folder of the trained built-in model (scripts/train_builtin.py)."""
    from importlib import resources

    return str(resources.files(TRAINED_PACKAGE))


def drafter_folder() -> str:
    """The shipped folder of the built-in model's DFlash drafter (`DRAFTER_NAME`)."""
    import os

    return os.path.join(trained_folder(), "dflash")


def trained_metrics() -> dict:
    """The training figures recorded with the trained weights (metrics.json)."""
    import json
    import os

    with open(os.path.join(trained_folder(), "metrics.json"), encoding="utf-8") as f:
        return json.load(f)


@functools.lru_cache(maxsize=1)
def config() -> ModelConfig:
    """The shipped model's config (read once: preflight, plans and the sim ask for it often)."""
    from ninfer_jax.model.config import load_config

    return load_config(trained_folder())

