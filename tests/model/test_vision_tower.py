"""The JAX vision tower (ninfer_jax/model/vision.py) against transformers' Qwen3_5VisionModel.

A tiny random tower (depth 2, hidden 32, 4 heads, patch 4, a 4x4 position table so that the
resampling is exercised, every norm randomised) run on the same random pixel_values: one image,
two images of different grids in one call, a video, a larger image; float32, max abs diff
<= 1e-4 on the merged tokens (`pooler_output`, what `Qwen3_5Model.get_image_features` returns).
Also: images encoded alone equal the joint call, a bucket's padding changes nothing and one
bucket compiles once, bf16 weights, the weights' round trip, bad configs and inputs.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from ninfer_jax.errors import CheckpointError, ConfigError, RequestError
from ninfer_jax.model import vision as V
from ninfer_jax.model.vision_weights import vision_hf_tensors, vision_param_shapes, vision_params

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

TINY = {"depth": 2, "hidden_size": 32, "num_heads": 4, "intermediate_size": 64, "patch_size": 4,
        "temporal_patch_size": 2, "spatial_merge_size": 2, "out_hidden_size": 48,
        "num_position_embeddings": 16, "in_channels": 3}
GRIDS = {"image": [[1, 4, 6]], "two_images": [[1, 4, 4], [1, 6, 2]], "video": [[2, 4, 4]],
         "large_image": [[1, 16, 18]]}  # 288 patches: above the 256 `encode` pads to
# Three calls of 288, 336 and 288 patches (384, 384 and 512 laid-out rows): one bucket of 512.
BUCKET_GRIDS = {"image": [[1, 16, 18]], "two_images": [[1, 16, 16], [1, 8, 10]], "video": [[2, 12, 12]]}
TOL = 1e-4


@pytest.fixture(scope="module")
def tower():
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5VisionConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5VisionModel

    torch.manual_seed(0)
    config = Qwen3_5VisionConfig(**TINY)
    config._attn_implementation = "eager"
    model = Qwen3_5VisionModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.startswith("pos_embed"):
                p.copy_(0.5 * torch.randn_like(p))
            else:
                p.copy_((0.2 if name.endswith("bias") else 0.15) * torch.randn_like(p))
    state = {"model.visual." + k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    vcfg = V.parse_vision_config({"model_type": "qwen3_5", "vision_config": config.to_dict()})
    return model, vcfg, vision_params(state, vcfg, np.float32), state


def _pixels(vcfg, grid, seed=0):
    n = int(np.prod(np.asarray(grid), axis=1).sum())
    return np.random.default_rng(seed).standard_normal((n, vcfg.patch_dim)).astype(np.float32)


def _reference(model, pixels, grid) -> np.ndarray:
    with torch.no_grad():
        out = model(torch.from_numpy(pixels), grid_thw=torch.tensor(grid))
    return out.pooler_output.numpy()


def test_config_parsed(tower):
    _, vcfg, params, _ = tower
    assert (vcfg.depth, vcfg.hidden_size, vcfg.head_dim, vcfg.patch_dim, vcfg.grid_side) == (2, 32, 8, 96, 4)
    assert vcfg.hidden_act == "gelu_pytorch_tanh" and vcfg.rope_theta == 10000.0
    shapes = vision_param_shapes(vcfg)
    got = {"patch_embed": params["patch_embed"].shape, "qkv": params["blocks"][1]["qkv"].shape,
           "merger.fc1": params["merger"]["fc1"].shape}
    assert got == {"patch_embed": shapes["patch_embed"], "qkv": shapes["blocks"][1]["qkv"],
                   "merger.fc1": shapes["merger"]["fc1"]}
    # The released sizes are the defaults.
    released = V.parse_vision_config({})
    assert (released.depth, released.hidden_size, released.patch_size, released.temporal_patch_size,
            released.spatial_merge_size) == (27, 1152, 16, 2, 2)


@pytest.mark.parametrize("case", sorted(GRIDS))
def test_matches_transformers(tower, case):
    model, vcfg, params, _ = tower
    grid = GRIDS[case]
    pixels = _pixels(vcfg, grid)
    ref = _reference(model, pixels, grid)
    ours = np.asarray(V.encode(params, vcfg, pixels, np.array(grid)))
    assert ours.shape == ref.shape == (pixels.shape[0] // 4, 48)
    diff = float(np.abs(ours - ref).max())
    print(f"{case}: max abs diff {diff:.3g} (|ref| max {np.abs(ref).max():.3g})")
    assert diff <= TOL


def test_images_never_attend_to_each_other(tower):
    """Each image (and each temporal patch of a video) encoded alone gives its tokens of the
    joint call: 256 + 80 patches together (336) against 256 and 80 alone, a 2-frame video (288)
    against its frames (144 each)."""
    _, vcfg, params, _ = tower
    grid = BUCKET_GRIDS["two_images"]
    pixels = _pixels(vcfg, grid, seed=1)
    together = np.asarray(V.encode(params, vcfg, pixels, np.array(grid)))
    first = np.asarray(V.encode(params, vcfg, pixels[:256], np.array(grid[:1])))
    second = np.asarray(V.encode(params, vcfg, pixels[256:], np.array(grid[1:])))
    diff = float(np.abs(together - np.concatenate([first, second])).max())
    video = _pixels(vcfg, BUCKET_GRIDS["video"], seed=2)
    whole = np.asarray(V.encode(params, vcfg, video, np.array(BUCKET_GRIDS["video"])))
    frames = [np.asarray(V.encode(params, vcfg, video[i * 144:(i + 1) * 144], np.array([[1, 12, 12]])))
              for i in range(2)]
    video_diff = float(np.abs(whole - np.concatenate(frames)).max())
    print(f"alone vs together: images {diff:.3g}, video frames {video_diff:.3g}")
    assert diff <= 1e-6 and video_diff <= 1e-6  # 0 on CPU: see vision.py


def test_bucket_padding_changes_nothing_and_compiles_once_per_bucket(tower):
    _, vcfg, params, _ = tower
    assert V.bucket_patches(vcfg, 24) == V.bucket_patches(vcfg, 256) == 256
    assert V.bucket_patches(vcfg, 257) == V.bucket_patches(vcfg, 512) == 512
    traces = 0
    for case, grid in BUCKET_GRIDS.items():
        grid = np.array(grid)
        pixels = _pixels(vcfg, grid, seed=3)
        exact = np.asarray(V.encode(params, vcfg, pixels, grid))
        before = V.TRACES["count"]
        padded = np.asarray(V.encode_bucketed(params, vcfg, jnp.asarray(pixels), grid))  # a device array too
        traces += V.TRACES["count"] - before
        assert padded.shape == exact.shape == (pixels.shape[0] // 4, 48)
        diff = float(np.abs(padded - exact).max())
        print(f"{case}: {pixels.shape[0]} patches in a bucket of 512 rows, max abs diff {diff:.3g}")
        assert diff <= 1e-6, case
    assert traces <= 1  # three grids, one compilation for their bucket


def test_bf16_weights_run_close_to_float32(tower):
    _, vcfg, params, state = tower
    grid = np.array(GRIDS["image"])
    pixels = _pixels(vcfg, grid, seed=4)
    f32 = np.asarray(V.encode(params, vcfg, pixels, grid))
    bf16 = V.encode(vision_params(state, vcfg, jnp.bfloat16), vcfg, pixels, grid)
    assert bf16.dtype == jnp.bfloat16
    err = float(np.abs(np.asarray(bf16, np.float32) - f32).max())
    assert err <= 0.1 * float(np.abs(f32).max()), err


def test_weights_round_trip_and_errors(tower):
    _, vcfg, params, state = tower
    back = vision_hf_tensors(params, vcfg)
    assert set(back) == set(state)
    for name, value in state.items():
        np.testing.assert_array_equal(back[name], value, err_msg=name)
    broken = dict(state)
    del broken["model.visual.blocks.1.attn.qkv.bias"]
    broken["model.visual.merger.linear_fc2.weight"] = state["model.visual.merger.linear_fc2.weight"][:, :4]
    broken["model.visual.extra.weight"] = np.zeros(3, np.float32)
    with pytest.raises(CheckpointError) as e:
        vision_params(broken, vcfg, np.float32)
    assert e.value.missing == ("model.visual.blocks.1.attn.qkv.bias",)
    assert e.value.unexpected == ("model.visual.extra.weight",)
    assert len(e.value.misshapen) == 1 and "linear_fc2" in e.value.misshapen[0]


@pytest.mark.parametrize("change, field", [
    ({"num_heads": 5}, "vision_config.num_heads"),           # 32 not divisible by 5
    ({"num_heads": 16}, "vision_config.num_heads"),          # head_dim 2: not a multiple of 4
    ({"num_position_embeddings": 15}, "vision_config.num_position_embeddings"),
    ({"depth": 0}, "vision_config.depth"),
    ({"patch_size": "16"}, "vision_config.patch_size"),
    ({"hidden_act": "relu"}, "vision_config.hidden_act"),
    ({"deepstack_visual_indexes": [1]}, "vision_config.deepstack_visual_indexes"),
    ({"rope_parameters": {"rope_type": "default"}}, "vision_config.rope_parameters"),
])
def test_bad_vision_config(change, field):
    with pytest.raises(ConfigError) as e:
        V.parse_vision_config({**TINY, **change})
    assert e.value.field == field


def test_bad_inputs(tower):
    _, vcfg, params, _ = tower
    pixels = _pixels(vcfg, GRIDS["image"])
    with pytest.raises(RequestError, match="pixel_values"):
        V.encode(params, vcfg, pixels[:-1], np.array(GRIDS["image"]))
    with pytest.raises(RequestError, match="grid_thw"):
        V.encode(params, vcfg, pixels, np.array([[1, 3, 8]]))  # height not a multiple of 2
