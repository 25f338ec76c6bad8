"""The whole-sequence reference pass with images and videos (ninfer_jax/model/multimodal.py)
against transformers' Qwen3_5ForConditionalGeneration and Qwen3_5MoeForConditionalGeneration.

Tiny random models (the oracle fixtures' text geometry with interleaved M-RoPE, a depth-2 tower
whose out_hidden_size is the text hidden size, every norm randomised), saved with
save_pretrained (float32 safetensors) and loaded by `load_model`; the prompts hold the
placeholder runs as the reference processor expands them. float32, eager attention: max abs
diff of the logits <= 1e-4. Also: a text-only prompt on the VL checkpoint, the VL checkpoint
without its tower, and the typed errors (media on a text-only model, wrong placeholders).
"""
from __future__ import annotations

import dataclasses
import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

from ninfer_jax.errors import RequestError
from ninfer_jax.frontend.media import PreparedImage
from ninfer_jax.model.model import load_model
from ninfer_jax.model.multimodal import forward_embedded
from ninfer_jax.model.rope_index import text_positions
from oracle_paths import oracle_dir

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

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
TOL = 1e-4
PATCH_DIM = 3 * 2 * 4 * 4


def _text(rng, n):
    return rng.integers(0, IMG, n).tolist()


def _image(grid):
    t, h, w = grid
    return [VS] + [IMG] * (t * h * w // 4) + [VE]


def _video(grid, rng):
    """As Qwen3-VL's processor expands a video inside the chat template's vision_start / end:
    per frame (temporal patch) `<t seconds>` text, vision_start, the pads, vision_end."""
    t, h, w = grid
    out = [VS]
    for _ in range(t):
        out += _text(rng, 3) + [VS] + [VID] * (h * w // 4) + [VE]
    return out + [VE]


def _pixels(grid, seed):
    n = int(np.prod(grid))
    return np.random.default_rng(seed).standard_normal((n, PATCH_DIM)).astype(np.float32)


def _case(name):
    """(token ids, images, videos): images / videos as (pixel_values, grid) pairs."""
    rng = np.random.default_rng(len(name))
    if name == "image":
        g = (1, 4, 6)
        return _text(rng, 5) + _image(g) + _text(rng, 4), [(_pixels(g, 1), g)], []
    if name == "two_images":
        a, b = (1, 4, 4), (1, 6, 2)
        ids = _text(rng, 3) + _image(a) + _text(rng, 2) + _image(b) + _text(rng, 3)
        return ids, [(_pixels(a, 2), a), (_pixels(b, 3), b)], []
    if name == "video":
        g = (2, 4, 4)
        return _text(rng, 4) + _video(g, rng) + _text(rng, 3), [], [(_pixels(g, 4), g)]
    if name == "image_and_video":
        a, v = (1, 6, 4), (2, 4, 6)
        ids = _text(rng, 2) + _image(a) + _text(rng, 2) + _video(v, rng) + _text(rng, 2)
        return ids, [(_pixels(a, 5), a)], [(_pixels(v, 6), v)]
    raise KeyError(name)


CASES = ("image", "two_images", "video", "image_and_video")


def _build(kind):
    from transformers import (Qwen3_5Config, Qwen3_5ForConditionalGeneration, Qwen3_5MoeConfig,
                              Qwen3_5MoeForConditionalGeneration)

    config_cls, model_cls = {"qwen3_5": (Qwen3_5Config, Qwen3_5ForConditionalGeneration),
                             "qwen3_5_moe": (Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration)}[kind]
    torch.manual_seed(4321)
    config = config_cls(text_config=TEXT[kind], vision_config=VISION, image_token_id=IMG, video_token_id=VID,
                        vision_start_token_id=VS, vision_end_token_id=VE, tie_word_embeddings=False)
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


def _reference(model, ids, images, videos) -> np.ndarray:
    kw = {}
    if images:
        kw.update(pixel_values=torch.from_numpy(np.concatenate([p for p, _ in images])),
                  image_grid_thw=torch.tensor([g for _, g in images]))
    if videos:
        kw.update(pixel_values_videos=torch.from_numpy(np.concatenate([p for p, _ in videos])),
                  video_grid_thw=torch.tensor([g for _, g in videos]))
    if kw:
        kw["mm_token_type_ids"] = torch.tensor([[1 if t == IMG else 2 if t == VID else 0 for t in ids]])
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids]), use_cache=False, **kw).logits[0].float().numpy()


@pytest.fixture(scope="module", params=sorted(TEXT))
def vl(request, tmp_path_factory):
    """(kind, transformers model, folder, our Model) for each wrapper type."""
    kind = request.param
    model = _build(kind)
    folder = str(tmp_path_factory.mktemp(kind))
    model.save_pretrained(folder, safe_serialization=True)
    return kind, model, folder, load_model(folder, dtype="float32")


def test_tower_loaded(vl):
    kind, _, _, ours = vl
    assert ours.vision is not None
    assert (ours.vision.config.depth, ours.vision.config.out_hidden_size) == (2, 32)
    t = ours.vision.tokens
    assert (t.image_token_id, t.video_token_id, t.vision_start_token_id, t.spatial_merge_size) == (IMG, VID, VS, 2)
    assert ours.config.mrope_section == (2, 1, 1) and ours.config.mrope_interleaved
    assert ours.config.mlp_types[0] == ("moe" if kind == "qwen3_5_moe" else "dense")


@pytest.mark.parametrize("case", CASES)
def test_matches_transformers(vl, case):
    kind, model, _, ours = vl
    ids, images, videos = _case(case)
    ref = _reference(model, ids, images, videos)
    got = np.asarray(ours.forward(ids, images=images, videos=videos))
    assert got.shape == ref.shape == (len(ids), 96)
    diff = float(np.abs(got - ref).max())
    print(f"{kind} {case}: {len(ids)} tokens, max abs diff {diff:.3g} (|ref| max {np.abs(ref).max():.3g})")
    assert diff <= TOL


def test_prepared_images_and_jax_pixels_are_accepted(vl):
    _, _, _, ours = vl
    ids, images, _ = _case("two_images")
    pairs = np.asarray(ours.forward(ids, images=images))
    prepared = [PreparedImage(p, g, "digest") for p, g in images[:1]] + [(jnp.asarray(p), g) for p, g in images[1:]]
    np.testing.assert_array_equal(np.asarray(ours.forward(ids, images=prepared)), pairs)


def test_text_only_prompt_on_the_vl_checkpoint(vl):
    """Text on the VL model: the text-only pass, equal to transformers; the threaded path
    (embeddings and M-RoPE triples through HybridLM) gives the same bits with no media."""
    kind, model, _, ours = vl
    ids = _text(np.random.default_rng(9), 20)
    plain = np.asarray(ours.forward(ids))
    diff = float(np.abs(plain - _reference(model, ids, [], [])).max())
    print(f"{kind} text only: max abs diff {diff:.3g}")
    assert diff <= TOL
    merger, leaves = ours.functional
    threaded = forward_embedded(merger, leaves, jnp.asarray(ids, jnp.int32), jnp.zeros(0, jnp.int32),
                                jnp.zeros((0, 32), jnp.float32), jnp.asarray(text_positions(0, len(ids))))
    np.testing.assert_array_equal(np.asarray(threaded), plain)
    assert np.array_equal(np.asarray(dataclasses.replace(ours, vision=None).forward(ids)), plain)


def test_vl_checkpoint_without_its_tower_loads_text_only(vl, tmp_path):
    from safetensors.numpy import load_file, save_file

    _, _, folder, ours = vl
    tensors = load_file(os.path.join(folder, "model.safetensors"))
    save_file({k: v for k, v in tensors.items() if ".visual." not in f".{k}"}, str(tmp_path / "model.safetensors"))
    with open(os.path.join(folder, "config.json")) as f:
        (tmp_path / "config.json").write_text(f.read())
    text_only = load_model(str(tmp_path), dtype="float32")
    assert text_only.vision is None
    ids = _text(np.random.default_rng(3), 12)
    np.testing.assert_array_equal(np.asarray(text_only.forward(ids)), np.asarray(ours.forward(ids)))
    with pytest.raises(RequestError, match="text-only"):
        text_only.forward(*_case("image")[:2])


def test_media_on_the_text_only_oracle_model():
    model = load_model(oracle_dir("qwen3_5_text"))
    assert model.vision is None
    with open(os.path.join(oracle_dir("qwen3_5_text"), "config.json")) as f:
        assert "vision_config" not in json.load(f)
    g = (1, 4, 4)
    with pytest.raises(RequestError, match="text-only"):
        model.forward([1, 2, 3, 4, 5, 6], images=[(_pixels(g, 0), g)])
    with pytest.raises(RequestError, match="text-only"):
        model.forward([1, 2, 3], videos=[(_pixels((2, 4, 4), 0), (2, 4, 4))])


def test_wrong_placeholders_are_request_errors(vl):
    _, _, _, ours = vl
    ids, images, videos = _case("image")
    cut = list(ids)
    cut.remove(IMG)
    with pytest.raises(RequestError, match="placeholder"):
        ours.forward(cut, images=images)
    with pytest.raises(RequestError, match="placeholder"):  # two runs, one image
        ours.forward(ids + _image((1, 2, 2)), images=images)
    with pytest.raises(RequestError, match="placeholder"):  # the pads, no image
        ours.forward(ids)
    with pytest.raises(RequestError, match="placeholder"):  # an image, no pads
        ours.forward(_text(np.random.default_rng(1), 8), images=images)
    no_start = [t if t != VS else 5 for t in ids]
    with pytest.raises(RequestError, match="vision_start"):
        ours.forward(no_start, images=images)
    pixels, grid = images[0]
    with pytest.raises(RequestError, match="pixel_values"):
        ours.forward(ids, images=[(pixels[:-1], grid)])
    with pytest.raises(RequestError, match="grid_thw"):
        ours.forward(ids, images=[(pixels, (1, 3, 8))])
