"""A tiny random Qwen3.5 vision-language checkpoint for the tests (issue 34): the oracle fixtures'
text geometry with interleaved M-RoPE and a depth-2 tower whose out_hidden_size is the text
hidden size, every norm randomised; `build(kind)` gives transformers'
Qwen3_5ForConditionalGeneration / Qwen3_5MoeForConditionalGeneration (float32, eager), `media_case(name)`
a prompt holding the placeholder runs as the reference processor expands them, with its media as
(pixel_values, grid) pairs. Needs torch and transformers (callers skip without them).
"""
from __future__ import annotations

import io

import numpy as np

IMG, VID, VS, VE = 90, 91, 92, 93  # inside the tiny vocabulary (96); text ids are drawn below 90
COMMON = dict(vocab_size=96, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=8,
              linear_num_key_heads=2, linear_num_value_heads=4, rms_norm_eps=1e-6, tie_word_embeddings=False,
              max_position_embeddings=512,
              layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                               "mrope_section": [2, 1, 1], "mrope_interleaved": True})
TEXT = {"qwen3_5": dict(COMMON, intermediate_size=48),
        "qwen3_5_moe": dict(COMMON, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                            shared_expert_intermediate_size=24)}
VISION = {"depth": 2, "hidden_size": 32, "num_heads": 4, "intermediate_size": 64, "patch_size": 4,
          "temporal_patch_size": 2, "spatial_merge_size": 2, "out_hidden_size": 32,
          "num_position_embeddings": 16, "in_channels": 3}
PATCH_DIM = 3 * 2 * 4 * 4


def png_bytes(seed: int, size=(28, 20)) -> bytes:
    """A random RGB PNG of `size` (width, height)."""
    import io

    from PIL import Image

    rgb = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    return buf.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    import base64

    return f"data:{mime};base64," + base64.b64encode(data).decode()


def text_ids(rng, n):
    return rng.integers(0, IMG, n).tolist()


def image_run(grid):
    t, h, w = grid
    return [VS] + [IMG] * (t * h * w // 4) + [VE]


def video_run(grid, rng):
    """As Qwen3-VL's processor expands a video inside the chat template's vision_start / end:
    per frame (temporal patch) `<t seconds>` text, vision_start, the pads, vision_end."""
    t, h, w = grid
    out = [VS]
    for _ in range(t):
        out += text_ids(rng, 3) + [VS] + [VID] * (h * w // 4) + [VE]
    return out + [VE]


def pixels(grid, seed):
    n = int(np.prod(grid))
    return np.random.default_rng(seed).standard_normal((n, PATCH_DIM)).astype(np.float32)


def media_case(name):
    """(token ids, images, videos): images / videos as (pixel_values, grid) pairs."""
    rng = np.random.default_rng(len(name))
    if name == "image":
        g = (1, 4, 6)
        return text_ids(rng, 5) + image_run(g) + text_ids(rng, 4), [(pixels(g, 1), g)], []
    if name == "two_images":
        a, b = (1, 4, 4), (1, 6, 2)
        ids = text_ids(rng, 3) + image_run(a) + text_ids(rng, 2) + image_run(b) + text_ids(rng, 3)
        return ids, [(pixels(a, 2), a), (pixels(b, 3), b)], []
    if name == "video":
        g = (2, 4, 4)
        return text_ids(rng, 4) + video_run(g, rng) + text_ids(rng, 3), [], [(pixels(g, 4), g)]
    if name == "image_and_video":
        a, v = (1, 6, 4), (2, 4, 6)
        ids = text_ids(rng, 2) + image_run(a) + text_ids(rng, 2) + video_run(v, rng) + text_ids(rng, 2)
        return ids, [(pixels(a, 5), a)], [(pixels(v, 6), v)]
    raise KeyError(name)


CASES = ("image", "two_images", "video", "image_and_video")


def build(kind, vocab_size: int | None = None, token_ids: tuple | None = None):
    """The transformers model; `vocab_size` and `token_ids` (image, video, vision start, vision
    end) override the defaults (a folder with a real tokenizer: `save_vl_folder`)."""
    import torch
    from transformers import (Qwen3_5Config, Qwen3_5ForConditionalGeneration, Qwen3_5MoeConfig,
                              Qwen3_5MoeForConditionalGeneration)

    config_cls, model_cls = {"qwen3_5": (Qwen3_5Config, Qwen3_5ForConditionalGeneration),
                             "qwen3_5_moe": (Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration)}[kind]
    torch.manual_seed(4321)
    img, vid, vs, ve = token_ids or (IMG, VID, VS, VE)
    text = dict(TEXT[kind], vocab_size=vocab_size or TEXT[kind]["vocab_size"])
    config = config_cls(text_config=text, vision_config=VISION, image_token_id=img, video_token_id=vid,
                        vision_start_token_id=vs, vision_end_token_id=ve, tie_word_embeddings=False)
    model = model_cls._from_config(config, attn_implementation="eager", experts_implementation="eager")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".visual." in f".{name}":  # as tests/model/test_vision_tower.py
                if "norm" in name and name.endswith("weight"):
                    p.copy_(1.0 + 0.2 * torch.randn_like(p))
                elif "pos_embed" in name:
                    p.copy_(0.5 * torch.randn_like(p))
                else:
                    p.copy_((0.2 if name.endswith("bias") else 0.15) * torch.randn_like(p))
            elif name.endswith("norm.weight") or "layernorm" in name:  # as make_oracle_fixtures
                p.add_(torch.randn_like(p) * 0.3)
            elif name.endswith("A_log"):
                p.copy_(torch.log(torch.empty_like(p).uniform_(0.5, 8.0)))
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn_like(p))
            else:
                p.normal_(0.0, 0.1)
    return model.float().eval()


# ---- a whole checkpoint folder: tokenizer, chat template, processor configs -----------------
SPECIALS = ("<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
QWEN_LIKE_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.content is string %}{{ m.content }}{% else %}{% for item in m.content %}"
    "{% if 'image' in item or 'image_url' in item or item.type == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif 'video' in item or item.type == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in item %}{{ item.text }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Small images: 4-pixel patches, 2x2 merge, between 8x8 and 32x32 pixels (4 to 16 merged tokens).
PREPROCESSOR = {"patch_size": 4, "temporal_patch_size": 2, "merge_size": 2, "min_pixels": 64, "max_pixels": 1024,
                "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
VIDEO_PREPROCESSOR = dict(PREPROCESSOR, fps=2.0, min_frames=2, max_frames=8, max_pixels=4096)


def save_vl_tokenizer(folder) -> str:
    """A tiny byte-level BPE with the Qwen chat and vision tokens added: its tokenizer.json path."""
    from pathlib import Path

    from tokenizers import AddedToken, Tokenizer as HFTokenizer, decoders, models, pre_tokenizers, trainers

    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = ["hello world, describe this picture and that video", "at 0.5 seconds and 1.5 seconds"] * 20
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                      show_progress=False))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    path = Path(folder) / "tokenizer.json"
    tok.save(str(path))
    return str(path)


def save_vl_folder(folder, kind: str = "qwen3_5"):
    """A whole tiny VL checkpoint in `folder` as the hub ships one (weights, config.json,
    tokenizer, chat template, image and video preprocessor configs); returns the transformers
    model. Its vocabulary is the tokenizer's, the vision ids its added tokens'."""
    import json
    from pathlib import Path

    from tokenizers import Tokenizer as HFTokenizer

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = HFTokenizer.from_file(save_vl_tokenizer(folder))
    ids = tuple(tok.token_to_id(t) for t in ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"))
    vocab = -(-tok.get_vocab_size() // 16) * 16
    model = build(kind, vocab_size=vocab, token_ids=ids)
    model.save_pretrained(str(folder), safe_serialization=True)
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "chat_template": QWEN_LIKE_TEMPLATE}))
    (folder / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
    (folder / "video_preprocessor_config.json").write_text(json.dumps(VIDEO_PREPROCESSOR))
    return model


def add_random_mtp(folder, seed: int = 5) -> None:
    """Give a saved VL checkpoint a complete random MTP head (one layer, the hub's `mtp.*` names)
    and declare it in config.json (`text_config.mtp_num_hidden_layers`)."""
    import json
    from pathlib import Path

    import jax
    from safetensors.numpy import load_file, save_file

    from ninfer_jax.model.config import load_config
    from ninfer_jax.model.modules import init_params
    from ninfer_jax.model.weights import hf_tensors

    folder = Path(folder)
    raw = json.loads((folder / "config.json").read_text())
    raw["text_config"]["mtp_num_hidden_layers"] = 1
    (folder / "config.json").write_text(json.dumps(raw))
    cfg = load_config(str(folder))
    params, mtp = init_params(cfg, seed=seed)
    to_np = lambda tree: jax.tree.map(lambda a: np.asarray(a, np.float32), tree)  # noqa: E731
    head = {k: v for k, v in hf_tensors(to_np(params), to_np(mtp), cfg).items() if k.startswith("mtp.")}
    tensors = load_file(str(folder / "model.safetensors"))
    save_file(dict(tensors, **head), str(folder / "model.safetensors"))


def encode_video(fmt: str, codec: str, frames: int = 12, fps: int = 6, size=(48, 64)) -> bytes:
    """`frames` moving gradients of `size` (h, w) as one video file, encoded in memory by PyAV."""
    import av

    buf = io.BytesIO()
    with av.open(buf, mode="w", format=fmt) as out:
        stream = out.add_stream(codec, rate=fps)
        stream.height, stream.width = size
        stream.pix_fmt = "yuv420p"
        h, w = size
        yy, xx = np.mgrid[0:h, 0:w]
        for i in range(frames):
            rgb = np.stack([(xx * 4 + i * 20) % 256, (yy * 5) % 256, np.full_like(xx, 40 * (i % 6))], -1)
            for packet in stream.encode(av.VideoFrame.from_ndarray(rgb.astype(np.uint8), format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()
