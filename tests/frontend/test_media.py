"""Image / video preprocessing (ninfer_jax/frontend/media.py) against transformers' processor.

The image reference is what `AutoImageProcessor.from_pretrained` builds from a folder holding a
Qwen3.5 `preprocessor_config.json` (the PIL backend without torchvision; with torchvision the PIL
class is asked for by name, the one media.py matches). The video reference, `Qwen3VLVideoProcessor`,
needs torchvision, so it is assembled from the reference's own pieces: its video `smart_resize`, the
PIL image processor's resize / rescale / normalize per frame, and its `patchify`. Where torchvision
is installed, the torchvision classes themselves are compared too, loosely: torch's uint8 bicubic
resize differs from Pillow's by a few levels on some pixels. Images are small: seconds.
"""
from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from ninfer_jax.errors import ConfigError
from ninfer_jax.frontend.errors import (MediaError, TooManyFramesError, TooManyPixelsError, UndecodableMediaError,
                                        UnsupportedMediaError)
from ninfer_jax.frontend.media import ProcessorSettings, prepare_image, prepare_video, smart_resize

ATOL = 1e-5
# The released Qwen3.5 files (image and video), as the checkpoints ship them.
IMAGE_CONFIG = {"size": {"longest_edge": 16777216, "shortest_edge": 65536}, "patch_size": 16,
                "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5],
                "image_std": [0.5, 0.5, 0.5], "processor_class": "Qwen3VLProcessor",
                "image_processor_type": "Qwen2VLImageProcessorFast"}
VIDEO_CONFIG = {"size": {"longest_edge": 25165824, "shortest_edge": 4096}, "patch_size": 16,
                "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5],
                "image_std": [0.5, 0.5, 0.5], "processor_class": "Qwen3VLProcessor",
                "video_processor_type": "Qwen3VLVideoProcessor"}


def _image(h, w, seed=0, channels=3):
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    smooth = np.stack([yy * 255 // max(h - 1, 1), xx * 255 // max(w - 1, 1), (xx + yy) * 5 % 256], -1)
    noise = rng.integers(0, 256, (h, w, 3))
    rgb = ((smooth + noise) // 2).astype(np.uint8)
    if channels == 4:
        return np.concatenate([rgb, rng.integers(0, 256, (h, w, 1), dtype=np.uint8)], -1)
    return rgb


def _png(array, mode=None):
    buf = io.BytesIO()
    Image.fromarray(array, mode).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen35")
    (d / "preprocessor_config.json").write_text(json.dumps(IMAGE_CONFIG))
    (d / "video_preprocessor_config.json").write_text(json.dumps(VIDEO_CONFIG))
    return d


@pytest.fixture(scope="module")
def reference(folder):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    proc = transformers.AutoImageProcessor.from_pretrained(folder)
    if proc.backend != "pil":   # torchvision installed: its tensor resize is not Pillow's
        proc = transformers.AutoImageProcessor.from_pretrained(folder, backend="pil")
    assert type(proc).__name__ == "Qwen2VLImageProcessorPil"
    return proc


def _ref_image(proc, image, **kwargs):
    out = proc(images=image, return_tensors="np", **kwargs)
    return out["pixel_values"], tuple(int(v) for v in out["image_grid_thw"][0])


def _check(mine, ref):
    values, grid = ref
    assert mine.grid_thw == grid
    assert mine.pixel_values.dtype == np.float32 and mine.pixel_values.shape == values.shape
    diff = float(np.abs(mine.pixel_values - values).max())
    assert diff <= ATOL, diff
    return diff


def test_settings_read_both_spellings_and_default_to_the_released_values(folder, tmp_path):
    s = ProcessorSettings.from_folder(folder)
    assert (s.patch_size, s.temporal_patch_size, s.merge_size, s.min_pixels, s.max_pixels) == (16, 2, 2, 65536, 16777216)
    assert s == ProcessorSettings.from_folder(tmp_path)          # no file: the released values
    v = ProcessorSettings.from_folder(folder, video=True)
    assert (v.min_pixels, v.max_pixels, v.fps, v.min_frames, v.max_frames) == (4096, 25165824, 2.0, 4, 768)
    old = ProcessorSettings.from_dict({"min_pixels": 3136, "max_pixels": 1003520, "patch_size": 14,
                                       "image_mean": [0.48145466, 0.4578275, 0.40821073],
                                       "size": {"shortest_edge": 1, "longest_edge": 2}})
    assert (old.min_pixels, old.max_pixels, old.factor) == (3136, 1003520, 28)
    with pytest.raises(ConfigError):
        ProcessorSettings.from_dict({"patch_size": 0})
    with pytest.raises(ConfigError):
        ProcessorSettings.from_dict({"resample": 2})


def test_smart_resize_equals_the_reference_functions(reference):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as ref_image
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize as ref_video

    from ninfer_jax.frontend.media import smart_resize_video
    rng = np.random.default_rng(7)
    for h, w in rng.integers(1, 5000, (300, 2)):
        h, w = int(h), int(w)
        if max(h, w) / min(h, w) > 200:
            continue
        for lo, hi in ((65536, 16777216), (1024, 4096), (3136, 1003520)):
            assert smart_resize(h, w, 32, lo, hi) == ref_image(h, w, 32, lo, hi)
        n = int(rng.integers(2, 40))
        assert smart_resize_video(n, h, w, 32, 2, 4096, 25165824) == ref_video(n, h, w, 2, 32, 4096, 25165824)


@pytest.mark.parametrize("hw", [(20, 30), (60, 200), (210, 50), (64, 96)])
def test_image_shapes_match_the_reference(reference, hw):
    image = Image.fromarray(_image(*hw, seed=hw[0]))
    mine = prepare_image(_png(np.asarray(image)), ProcessorSettings.from_dict(IMAGE_CONFIG))
    _check(mine, _ref_image(reference, image))
    # every one of these is below min_pixels: upscaled to at least 65536 pixels
    t, h, w = mine.grid_thw
    assert t == 1 and h * w * 16 * 16 >= 65536


def test_image_above_max_pixels_is_downscaled_like_the_reference(reference):
    config = dict(IMAGE_CONFIG, size={"shortest_edge": 1024, "longest_edge": 64 * 64})
    image = Image.fromarray(_image(150, 220, seed=3))
    mine = prepare_image(image, ProcessorSettings.from_dict(config))
    _check(mine, _ref_image(reference, image, size={"shortest_edge": 1024, "longest_edge": 64 * 64}))
    t, h, w = mine.grid_thw
    assert h * w * 16 * 16 <= 64 * 64
    assert smart_resize(150, 220, 32, 1024, 4096) == (h * 16, w * 16)


def test_rgba_grayscale_and_palette_inputs_convert_like_the_reference(reference):
    s = ProcessorSettings.from_dict(IMAGE_CONFIG)
    rgba = Image.fromarray(_image(40, 50, seed=5, channels=4), "RGBA")
    gray = Image.fromarray(_image(45, 33, seed=6)[..., 0], "L")
    palette = Image.fromarray(_image(30, 40, seed=7)).convert("P")
    for image in (rgba, gray, palette):
        _check(prepare_image(image, s), _ref_image(reference, image))
        _check(prepare_image(_png(np.asarray(image), image.mode) if image.mode != "P" else image, s),
               _ref_image(reference, image))
    # arrays: the reference's array conversion (grey repeated, alpha blended onto white)
    for array in (_image(40, 50, seed=8, channels=4), _image(40, 50, seed=9)[..., :1]):
        _check(prepare_image(array, s), _ref_image(reference, array))


def _ref_video(proc, frames, config):
    """Qwen3VLVideoProcessor's output with Pillow's resize, assembled from the reference's pieces."""
    import torch
    from transformers.image_processing_backends import PilBackend
    from transformers.image_utils import PILImageResampling, SizeDict
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor, smart_resize as ref_resize

    s = ProcessorSettings.from_dict(config, video=True)
    h, w = ref_resize(len(frames), *frames[0].shape[:2], temporal_factor=s.temporal_patch_size,
                            factor=s.factor, min_pixels=s.min_pixels, max_pixels=s.max_pixels)
    out = []
    for frame in frames:
        chw = proc.process_image(Image.fromarray(frame), do_convert_rgb=True)
        chw = PilBackend.resize(proc, chw, SizeDict(height=h, width=w), resample=PILImageResampling.BICUBIC)
        out.append(proc.normalize(proc.rescale(chw, s.rescale_factor), list(s.image_mean), list(s.image_std)))
    video = torch.from_numpy(np.stack(out))[None]
    patches, gt, gh, gw = Qwen3VLVideoProcessor.patchify(None, video, s.patch_size, s.merge_size,
                                                        s.temporal_patch_size)
    return patches[0].numpy(), (gt, gh, gw)


@pytest.mark.parametrize("hw", [(40, 56), (20, 28)])
def test_three_frame_video_matches_the_reference(reference, folder, hw):
    frames = [_image(*hw, seed=10 + i) for i in range(3)]          # odd: the last frame repeats
    mine = prepare_video(frames, ProcessorSettings.from_folder(folder, video=True))
    assert mine.grid_thw[0] == 2
    _check(mine, _ref_video(reference, frames, VIDEO_CONFIG))
    # the repeated frame: the second temporal slot of the last grid_t row equals the first
    t, gh, gw = mine.grid_thw
    last = mine.pixel_values[gh * gw:].reshape(gh * gw, 3, 2, 16 * 16)
    np.testing.assert_array_equal(last[:, :, 0], last[:, :, 1])


def test_torchvision_backend_agrees_on_grids_and_within_a_few_levels(folder):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torchvision")
    image_proc = transformers.AutoImageProcessor.from_pretrained(folder, backend="torchvision")
    video_proc = transformers.AutoVideoProcessor.from_pretrained(folder)
    image = _image(60, 200, seed=2)
    ref = image_proc(images=Image.fromarray(image), return_tensors="np")
    mine = prepare_image(image, ProcessorSettings.from_folder(folder))
    assert mine.grid_thw == tuple(int(v) for v in ref["image_grid_thw"][0])
    assert np.abs(mine.pixel_values - ref["pixel_values"]).max() <= 4 / 127.5
    frames = [_image(100, 140, seed=20 + i) for i in range(3)]
    ref = video_proc(videos=[np.stack(frames)], return_tensors="np", do_sample_frames=False,
                     cap_pixels_per_frame=False)
    mine = prepare_video(frames, ProcessorSettings.from_folder(folder, video=True))
    assert mine.grid_thw == tuple(int(v) for v in ref["video_grid_thw"][0])
    assert np.abs(mine.pixel_values - ref["pixel_values_videos"]).max() <= 4 / 127.5


def test_video_frame_sampling_and_limits(folder):
    s = ProcessorSettings.from_folder(folder, video=True)
    frames = [_image(32, 32, seed=i) for i in range(60)]
    sampled = prepare_video(frames, s, source_fps=10.0)      # 6 s at 2 fps -> 12 frames
    assert sampled.grid_thw[0] == 6
    with pytest.raises(TooManyFramesError) as e:
        prepare_video(frames, s, max_input_frames=50)
    assert (e.value.frames, e.value.limit) == (60, 50)
    with pytest.raises(TooManyFramesError):
        prepare_video(frames, ProcessorSettings.from_dict(dict(VIDEO_CONFIG, max_frames=16), video=True))
    with pytest.raises(UnsupportedMediaError):
        prepare_video(frames[:1], s)                          # fewer than temporal_patch_size
    with pytest.raises(UnsupportedMediaError):
        prepare_video([frames[0], _image(40, 32)], s)         # frames of unequal size


def test_digest_is_stable_and_follows_every_pixel_and_the_settings():
    s = ProcessorSettings()
    a = _image(48, 64, seed=1)
    first = prepare_image(_png(a), s)
    assert first.digest == prepare_image(_png(a), s).digest == prepare_image(a.copy(), s).digest
    assert len(first.digest) == 64
    b = a.copy()
    b[17, 23, 1] ^= 1
    assert prepare_image(b, s).digest != first.digest
    assert prepare_image(a, ProcessorSettings(max_pixels=1 << 20)).digest != first.digest
    frames = [a, a, b]
    assert prepare_video(frames, s).digest != prepare_video([a, b, a], s).digest
    assert prepare_video(frames, s).digest != first.digest


def test_encoded_images_are_turned_upright_by_their_exif_orientation():
    from PIL import ImageOps

    image = Image.fromarray(_image(40, 72, seed=4))
    exif = Image.Exif()
    exif[0x0112] = 6                                      # rotate 90 degrees clockwise to view
    buf = io.BytesIO()
    image.save(buf, format="PNG", exif=exif)
    mine = prepare_image(buf.getvalue(), ProcessorSettings())
    upright = ImageOps.exif_transpose(Image.open(io.BytesIO(buf.getvalue())))
    assert upright.size == (40, 72)
    assert mine.digest == prepare_image(upright, ProcessorSettings()).digest


def test_bad_inputs_raise_typed_errors_before_decoding():
    s = ProcessorSettings()
    for data in (b"", b"not an image at all", _png(_image(40, 40))[:60]):
        with pytest.raises(UndecodableMediaError):
            prepare_image(data, s)
    buf = io.BytesIO()
    Image.fromarray(_image(40, 40)).save(buf, format="ICO")
    with pytest.raises(UnsupportedMediaError, match="ICO"):
        prepare_image(buf.getvalue(), s)
    for data in ("a path", np.zeros((8, 8, 3), np.float32), np.zeros((8, 8, 2), np.uint8), np.zeros((0, 8), np.uint8),
                 np.zeros((2, 500, 3), np.uint8)):
        with pytest.raises(UnsupportedMediaError):
            prepare_image(data, s)
    big = _png(_image(100, 120))
    with pytest.raises(TooManyPixelsError) as e:
        prepare_image(big, s, max_input_pixels=100 * 119)
    assert (e.value.pixels, e.value.limit) == (12000, 11900)
    with pytest.raises(TooManyPixelsError):
        prepare_video([big, big], ProcessorSettings.video_defaults(), max_input_pixels=1000)
    assert issubclass(TooManyPixelsError, MediaError) and issubclass(MediaError, ValueError)
    assert TooManyFramesError.code == "too_many_frames"
