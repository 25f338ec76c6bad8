"""Random-weight benchmark geometries: Qwen3.5 text configs the engine reads (config.json fields).

Used by `ninfer bench vs_hf` and scripts/device_check.py, which build random weights for them in
memory (`modules.init_params`): nothing is downloaded.
"""
from __future__ import annotations


def _hybrid(num_layers: int) -> list[str]:
    """The family's layer pattern: three Gated DeltaNet layers, then one gated full-attention layer."""
    return (["linear_attention"] * 3 + ["full_attention"]) * (num_layers // 4)


_ROPE = {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25}

# Close to the text configs (config.json's `text_config`) of the published Qwen/Qwen3.5-0.8B and
# Qwen/Qwen3.5-9B, the fields the engine reads; the Hub itself could not be reached when this was
# written. 0.8B: as its config.json is quoted in public repositories' tests (tied embeddings;
# 0.75B text parameters, the rest of the 0.8B is the vision tower, which the engine does not load).
# 9B: from a public port's constants read off the checkpoint's GGUF metadata; untied embeddings
# are an assumption (they give 8.95B text parameters; tied would be 7.9B). Both: vocabulary
# 248320, RoPE theta 1e7 on a quarter of head_dim 256, GDN heads of 128, conv kernel 4, and the
# family's layer pattern of 3 linear + 1 full attention (full_attention_interval 4).
GEOMETRIES = {
    "0.8b": {
        "model_type": "qwen3_5_text", "vocab_size": 248320, "hidden_size": 1024,
        "intermediate_size": 3584, "num_hidden_layers": 24, "layer_types": _hybrid(24),
        "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256, "rope_parameters": _ROPE,
        "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
        "linear_num_key_heads": 16, "linear_num_value_heads": 16, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True, "max_position_embeddings": 262144,
    },
    "9b": {
        "model_type": "qwen3_5_text", "vocab_size": 248320, "hidden_size": 4096,
        "intermediate_size": 12288, "num_hidden_layers": 32, "layer_types": _hybrid(32),
        "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 256, "rope_parameters": _ROPE,
        "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
        "linear_num_key_heads": 16, "linear_num_value_heads": 32, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False, "max_position_embeddings": 262144,
    },
}
# `small`: the 0.8B-like widths with 8 layers and a 32k vocabulary, minutes on a 2-core CPU.
GEOMETRIES["small"] = dict(GEOMETRIES["0.8b"], num_hidden_layers=8, layer_types=_hybrid(8), vocab_size=32000)
