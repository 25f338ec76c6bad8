"""Build the transformers oracle fixtures: tiny random models of each supported type.

For `qwen3_next`, `qwen3_5_text` and `qwen3_5_moe_text` this writes, under
tests/fixtures/oracle/<type>/:
  config.json, model.safetensors   (save_pretrained of a tiny random model, float32)
  oracle.npz                        prompt / long token ids, their logits, greedy tokens
Every norm weight, A_log and dt_bias gets a random offset so a wrong norm variant (1+w vs w)
or a wrong decay formula shows in the logits. Runs on CPU in float32 with eager attention and
eager experts. Needs torch and transformers (see BUILD.md); the test suite only reads the
files, and reruns transformers live when it is importable.

    python scripts/make_oracle_fixtures.py [--out tests/fixtures/oracle]
"""
from __future__ import annotations

import argparse
import os

import numpy as np

COMMON = dict(
    vocab_size=96, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=8,
    linear_num_key_heads=2, linear_num_value_heads=4, rms_norm_eps=1e-6, tie_word_embeddings=False,
    max_position_embeddings=512,
)
ROPE = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
LAYERS = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]

CONFIGS = {
    "qwen3_next": dict(COMMON, intermediate_size=48, num_experts=4, num_experts_per_tok=2,
                       moe_intermediate_size=16, shared_expert_intermediate_size=24,
                       norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1],
                       layer_types=LAYERS, rope_parameters=ROPE),
    "qwen3_5_text": dict(COMMON, intermediate_size=48, layer_types=LAYERS, rope_parameters=ROPE),
    "qwen3_5_moe_text": dict(COMMON, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                             shared_expert_intermediate_size=24, layer_types=LAYERS,
                             rope_parameters=dict(ROPE, mrope_section=[2, 1, 1], mrope_interleaved=True)),
}
PROMPT_LEN, LONG_LEN, GREEDY_STEPS = 12, 150, 8


def build(model_type: str):
    import torch
    import transformers as tf

    classes = {
        "qwen3_next": (tf.Qwen3NextConfig, tf.Qwen3NextForCausalLM),
        "qwen3_5_text": (tf.Qwen3_5TextConfig, tf.Qwen3_5ForCausalLM),
        "qwen3_5_moe_text": (tf.Qwen3_5MoeTextConfig, tf.Qwen3_5MoeForCausalLM),
    }
    config_cls, model_cls = classes[model_type]
    torch.manual_seed(1234)
    config = config_cls(**CONFIGS[model_type])
    model = model_cls._from_config(config, attn_implementation="eager", experts_implementation="eager")
    assert model.config._experts_implementation == "eager", model.config._experts_implementation
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                param.add_(torch.randn_like(param) * 0.3)
            elif name.endswith("A_log"):
                param.copy_(torch.log(torch.empty_like(param).uniform_(0.5, 8.0)))
            elif name.endswith("dt_bias"):
                param.copy_(torch.randn_like(param))
            else:
                param.normal_(0.0, 0.1)
    return model.float().eval()


def logits_of(model, ids) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids]), use_cache=False).logits[0].float().numpy()


def greedy(model, ids, steps: int) -> list[int]:
    """Greedy continuation through transformers' own cache (its recurrent decode path)."""
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=steps, do_sample=False,
                             use_cache=True, pad_token_id=0)
    return out[0, len(ids):].tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join("tests", "fixtures", "oracle"))
    args = parser.parse_args()
    rng = np.random.default_rng(7)
    for model_type in CONFIGS:
        model = build(model_type)
        folder = os.path.join(args.out, model_type)
        model.save_pretrained(folder, safe_serialization=True)
        vocab = CONFIGS[model_type]["vocab_size"]
        prompt = rng.integers(0, vocab, PROMPT_LEN).tolist()
        long = rng.integers(0, vocab, LONG_LEN).tolist()
        np.savez_compressed(
            os.path.join(folder, "oracle.npz"),
            prompt=np.array(prompt, np.int32), prompt_logits=logits_of(model, prompt),
            long=np.array(long, np.int32), long_logits=logits_of(model, long),
            greedy=np.array(greedy(model, prompt, GREEDY_STEPS), np.int32))
        for extra in ("generation_config.json",):
            path = os.path.join(folder, extra)
            if os.path.exists(path):
                os.remove(path)
        print(f"{model_type}: wrote {folder}")


if __name__ == "__main__":
    main()
