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
from tiny_vl import CASES, IMG, TEXT, VID, VS, build, media_case, image_run, pixels, text_ids

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

TOL = 1e-4


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
    model = build(kind)
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
    ids, images, videos = media_case(case)
    ref = _reference(model, ids, images, videos)
    got = np.asarray(ours.forward(ids, images=images, videos=videos))
    assert got.shape == ref.shape == (len(ids), 96)
    diff = float(np.abs(got - ref).max())
    print(f"{kind} {case}: {len(ids)} tokens, max abs diff {diff:.3g} (|ref| max {np.abs(ref).max():.3g})")
    assert diff <= TOL


def test_prepared_images_and_jax_pixels_are_accepted(vl):
    _, _, _, ours = vl
    ids, images, _ = media_case("two_images")
    pairs = np.asarray(ours.forward(ids, images=images))
    prepared = [PreparedImage(p, g, "digest") for p, g in images[:1]] + [(jnp.asarray(p), g) for p, g in images[1:]]
    np.testing.assert_array_equal(np.asarray(ours.forward(ids, images=prepared)), pairs)


def test_text_only_prompt_on_the_vl_checkpoint(vl):
    """Text on the VL model: the text-only pass, equal to transformers; the threaded path
    (embeddings and M-RoPE triples through HybridLM) gives the same bits with no media."""
    kind, model, _, ours = vl
    ids = text_ids(np.random.default_rng(9), 20)
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
    ids = text_ids(np.random.default_rng(3), 12)
    np.testing.assert_array_equal(np.asarray(text_only.forward(ids)), np.asarray(ours.forward(ids)))
    with pytest.raises(RequestError, match="text-only"):
        text_only.forward(*media_case("image")[:2])


def test_media_on_the_text_only_oracle_model():
    model = load_model(oracle_dir("qwen3_5_text"))
    assert model.vision is None
    with open(os.path.join(oracle_dir("qwen3_5_text"), "config.json")) as f:
        assert "vision_config" not in json.load(f)
    g = (1, 4, 4)
    with pytest.raises(RequestError, match="text-only"):
        model.forward([1, 2, 3, 4, 5, 6], images=[(pixels(g, 0), g)])
    with pytest.raises(RequestError, match="text-only"):
        model.forward([1, 2, 3], videos=[(pixels((2, 4, 4), 0), (2, 4, 4))])


def test_wrong_placeholders_are_request_errors(vl):
    _, _, _, ours = vl
    ids, images, videos = media_case("image")
    cut = list(ids)
    cut.remove(IMG)
    with pytest.raises(RequestError, match="placeholder"):
        ours.forward(cut, images=images)
    with pytest.raises(RequestError, match="placeholder"):  # two runs, one image
        ours.forward(ids + image_run((1, 2, 2)), images=images)
    with pytest.raises(RequestError, match="placeholder"):  # the pads, no image
        ours.forward(ids)
    with pytest.raises(RequestError, match="placeholder"):  # an image, no pads
        ours.forward(text_ids(np.random.default_rng(1), 8), images=images)
    no_start = [t if t != VS else 5 for t in ids]
    with pytest.raises(RequestError, match="vision_start"):
        ours.forward(no_start, images=images)
    pixels, grid = images[0]
    with pytest.raises(RequestError, match="pixel_values"):
        ours.forward(ids, images=[(pixels[:-1], grid)])
    with pytest.raises(RequestError, match="grid_thw"):
        ours.forward(ids, images=[(pixels, (1, 3, 8))])
