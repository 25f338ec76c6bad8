"""Image and video preprocessing for the Qwen3.5 vision tower, equal to the reference processor.

Turns an image (encoded bytes, a `PIL.Image.Image` or a uint8 array) or a list of video frames
into the tower's input, exactly as transformers' `Qwen2VLImageProcessorPil` (images) and
`Qwen3VLVideoProcessor` (videos) do for a Qwen3.5 checkpoint:

1. decode with Pillow (encoded bytes are turned upright by their EXIF orientation, as
   transformers' `load_image` does) and convert to RGB (transparency composited onto white, as
   the processor does, grey repeated);
2. `smart_resize`: height and width become multiples of `patch_size * merge_size` (32), the pixel
   count is brought into [min_pixels, max_pixels] keeping the aspect ratio (a small image is
   upscaled); for a video the budget counts the frames too;
3. resize with Pillow's BICUBIC filter on the uint8 image, then `x * rescale_factor` in float64
   cast to float32, then `(x - mean) / std` in float32;
4. patchify: a still image is `temporal_patch_size` identical frames; a video whose frame count is
   not a multiple of it repeats its last frame; patches are laid out in merge-block order, giving
   `pixel_values [grid_t * grid_h * grid_w, C * T * P * P]` (C, T, P, P flattened in that order)
   and `grid_thw = (grid_t, grid_h, grid_w)`.

Which reference: `AutoImageProcessor` builds `Qwen2VLImageProcessor` (the torchvision backend)
when torchvision is installed and `Qwen2VLImageProcessorPil` otherwise. This project's reference
extra (torch + transformers) has no torchvision, so the PIL class is the one it builds, and this
module matches it to float32 rounding (tests/frontend/test_media.py). The torchvision backend
resizes uint8 tensors with torch's antialiased bicubic kernel, which differs from Pillow's by one
uint8 level on under 1% of pixels (more where one axis is upscaled and the other downscaled); its
grids are identical. The reference video processor exists only with torchvision; its sizes
(`smart_resize` with frames) and layout are reproduced here and the frames are resized like images.

Defaults: the processor classes' own defaults are not the released ones (Qwen2-VL's: patch 14,
CLIP mean/std, min 56*56 pixels), so settings are read from the checkpoint's
`preprocessor_config.json` / `video_preprocessor_config.json`. A missing file gives the values
every released Qwen3.5 (and Qwen3-VL) checkpoint ships: patch 16, temporal 2, merge 2, mean and
std 0.5, rescale 1/255; images `size = {shortest_edge: 65536 (256*256 = 64 merged tokens),
longest_edge: 16777216}`; videos `{shortest_edge: 4096, longest_edge: 25165824}` with fps 2,
min_frames 4, max_frames 768 (`Qwen3VLVideoProcessor`'s defaults).

Bad input raises a `MediaError` subclass (frontend/errors.py) before any expensive work: the size
is read from the file header before decoding, the frame count before any frame is decoded.
"""
from __future__ import annotations

import hashlib
import io
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import ConfigError
from .errors import TooManyFramesError, TooManyPixelsError, UndecodableMediaError, UnsupportedMediaError

IMAGE_CONFIG = "preprocessor_config.json"
VIDEO_CONFIG = "video_preprocessor_config.json"
ALLOWED_FORMATS = frozenset({"PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF"})
MAX_INPUT_PIXELS = 8192 * 8192      # default per-image (per-frame) limit of `prepare_*`
MAX_ASPECT_RATIO = 200              # the reference's smart_resize refuses more
_BICUBIC = 3                        # PIL.Image.Resampling.BICUBIC, the reference's `resample`


@dataclass(frozen=True)
class ProcessorSettings:
    """The preprocessing settings of one checkpoint (images or videos); see the module docstring."""

    patch_size: int = 16
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 65536
    max_pixels: int = 16777216
    image_mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    image_std: tuple[float, ...] = (0.5, 0.5, 0.5)
    rescale_factor: float = 1 / 255
    do_resize: bool = True
    do_rescale: bool = True
    do_normalize: bool = True
    do_convert_rgb: bool = True
    fps: float | None = None
    min_frames: int | None = None
    max_frames: int | None = None

    @property
    def factor(self) -> int:
        """Height and width are resized to multiples of this (one merged token's side)."""
        return self.patch_size * self.merge_size

    @classmethod
    def video_defaults(cls) -> ProcessorSettings:
        return cls(min_pixels=4096, max_pixels=25165824, fps=2.0, min_frames=4, max_frames=768)

    @classmethod
    def from_dict(cls, config: Mapping[str, Any] | None, *, video: bool = False) -> ProcessorSettings:
        """Settings from a parsed (video_)preprocessor_config.json; None gives the released defaults.

        Both spellings of the pixel budget are read: `size: {shortest_edge, longest_edge}` (newer
        files) and top-level `min_pixels` / `max_pixels`, which win as in the reference."""
        base = cls.video_defaults() if video else cls()
        if config is None:
            return base
        if not isinstance(config, Mapping):
            raise ConfigError("preprocessor_config", f"must be a JSON object, got {type(config).__name__}")
        values = asdict(base)
        for key in ("patch_size", "temporal_patch_size", "merge_size", "min_frames", "max_frames"):
            if config.get(key) is not None:
                values[key] = _positive_int(key, config[key])
        size = config.get("size") or {}
        if not isinstance(size, Mapping):
            raise ConfigError("size", f"must be an object with shortest_edge/longest_edge, got {size!r}")
        for key, names in (("min_pixels", ("shortest_edge", "min_pixels")),
                           ("max_pixels", ("longest_edge", "max_pixels"))):
            for name in names:
                if size.get(name) is not None:
                    values[key] = _positive_int(f"size.{name}", size[name])
                    break
            if config.get(key) is not None:
                values[key] = _positive_int(key, config[key])
        for key in ("image_mean", "image_std"):
            if config.get(key) is not None:
                values[key] = _channels(key, config[key])
        for key in ("do_resize", "do_rescale", "do_normalize", "do_convert_rgb"):
            if config.get(key) is not None:
                values[key] = bool(config[key])
        for key in ("rescale_factor", "fps"):
            if config.get(key) is not None:
                values[key] = float(config[key])
        if config.get("resample", _BICUBIC) != _BICUBIC:
            raise ConfigError("resample", f"only BICUBIC ({_BICUBIC}) is supported, got {config['resample']!r}")
        if values["min_pixels"] > values["max_pixels"]:
            raise ConfigError("size", f"min_pixels {values['min_pixels']} > max_pixels {values['max_pixels']}")
        if any(s == 0 for s in values["image_std"]):
            raise ConfigError("image_std", "must not hold a zero")
        return cls(**values)

    @classmethod
    def from_folder(cls, folder: str | Path, *, video: bool = False) -> ProcessorSettings:
        """Settings from a checkpoint folder's config file; a missing file gives the defaults."""
        path = Path(folder) / (VIDEO_CONFIG if video else IMAGE_CONFIG)
        if not path.is_file():
            return cls.from_dict(None, video=video)
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ConfigError(path.name, f"does not parse: {e}") from e
        return cls.from_dict(config, video=video)

    def canonical(self) -> str:
        """A stable text of every field, hashed into each digest."""
        return json.dumps(asdict(self), sort_keys=True)


@dataclass(frozen=True, eq=False)
class PreparedImage:
    """The vision tower's input for one image or video.

    `pixel_values` is float32 `[grid_t * grid_h * grid_w, 3 * T * P * P]`; `digest` is the
    SHA-256 hex of the decoded RGB pixels, their shape and the settings (the media identity)."""

    pixel_values: np.ndarray
    grid_thw: tuple[int, int, int]
    digest: str


PreparedVideo = PreparedImage


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(height, width) rounded to multiples of `factor`, scaled into [min_pixels, max_pixels]."""
    _check_aspect(height, width)
    return _fit(height, width, factor, min_pixels, max_pixels, frames=1, rounded_frames=1)


def smart_resize_video(num_frames: int, height: int, width: int, factor: int, temporal_factor: int,
                       min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """The video variant: frames smaller than `factor` are scaled up first, and the budget
    counts the frames (rounded to a multiple of `temporal_factor`)."""
    if num_frames < temporal_factor:
        raise UnsupportedMediaError(f"a video needs at least {temporal_factor} frames, got {num_frames}")
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    _check_aspect(height, width)
    return _fit(height, width, factor, min_pixels, max_pixels, frames=num_frames,
                rounded_frames=round(num_frames / temporal_factor) * temporal_factor)


def _fit(height: int, width: int, factor: int, min_pixels: int, max_pixels: int, *, frames: int,
         rounded_frames: int) -> tuple[int, int]:
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if rounded_frames * h_bar * w_bar > max_pixels:
        beta = math.sqrt(frames * height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif rounded_frames * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def sample_frame_indices(total: int, source_fps: float, settings: ProcessorSettings) -> np.ndarray:
    """Which of `total` frames (recorded at `source_fps`) the reference keeps: `settings.fps`
    per second, at least `min_frames`, at most `max_frames` and `total`, spread evenly."""
    if not source_fps or source_fps <= 0:
        raise UnsupportedMediaError(f"source_fps must be positive, got {source_fps!r}")
    num = int(total / source_fps * (settings.fps or 2.0))
    num = min(max(num, settings.min_frames or 4), settings.max_frames or 768, total)
    return np.linspace(0, total - 1, num).round().astype(int)


DEFAULT_ANIMATION_FPS = 10.0  # an animated image whose frames carry no duration


def decode_animation(data: bytes, *, max_input_pixels: int = MAX_INPUT_PIXELS,
                     max_input_frames: int | None = None) -> tuple[list, float]:
    """A video file -> its frames (PIL images or uint8 `[H, W, 3]` arrays, made RGB by
    `prepare_video` like any image) and its frame rate. An animated GIF, WebP or PNG is Pillow's
    (the rate from the frames' mean duration); MP4, WebM, MKV, MOV and the rest are PyAV's
    (FFmpeg, `decode_video_file`) when it is installed, else `UnsupportedMediaError` with the way out."""
    from PIL import Image, ImageSequence, UnidentifiedImageError

    if not isinstance(data, (bytes, bytearray, memoryview)) or not len(data):
        raise UndecodableMediaError("empty or missing video data")
    try:
        image = Image.open(io.BytesIO(bytes(data)))
    except Image.DecompressionBombError as e:
        raise TooManyPixelsError(str(e), pixels=-1, limit=max_input_pixels) from e
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        if _pyav() is not None:
            return decode_video_file(bytes(data), max_input_pixels=max_input_pixels, max_input_frames=max_input_frames)
        raise UnsupportedMediaError("a video file must be an animated GIF, WebP or PNG, or, with PyAV installed "
                                    "(pip install av), MP4, WebM and the other formats FFmpeg reads: give the video "
                                    f"as a list of frames ({e})") from e
    total = getattr(image, "n_frames", 1)
    if total < 2:
        raise UnsupportedMediaError(f"a {image.format} with one frame is an image, not a video")
    if max_input_frames is not None and total > max_input_frames:
        raise TooManyFramesError(f"{total} frames over the limit of {max_input_frames}", frames=total,
                                 limit=max_input_frames)
    _check_pixels(image.height, image.width, max_input_pixels)
    _check_aspect(image.height, image.width)
    frames, durations = [], []
    try:
        for frame in ImageSequence.Iterator(image):
            durations.append(frame.info.get("duration") or 0)
            frames.append(frame.copy())
    except (OSError, ValueError, SyntaxError, EOFError) as e:
        raise UndecodableMediaError(f"corrupt or truncated {image.format}: {e}") from e
    mean_ms = sum(durations) / len(durations)
    return frames, (1000.0 / mean_ms if mean_ms > 0 else DEFAULT_ANIMATION_FPS)


def _pyav():
    """The `av` module (PyAV: FFmpeg's decoders in one wheel), or None when it is not installed."""
    try:
        import av
    except ImportError:
        return None
    return av


def decode_video_file(data: bytes, *, max_input_pixels: int = MAX_INPUT_PIXELS,
                      max_input_frames: int | None = None) -> tuple[list[np.ndarray], float]:
    """An MP4, WebM, MKV, MOV... file -> its frames as uint8 `[H, W, 3]` RGB and its frame rate,
    as the reference's PyAV reader gives them (`to_ndarray(format="rgb24")` of every frame of the
    first video stream; the rate its `average_rate`). The size and the frame count the container
    declares are checked before any frame is decoded; the decoded count again as it goes."""
    av = _pyav()
    if av is None:
        raise UnsupportedMediaError("decoding MP4, WebM and other video files needs PyAV (pip install av): "
                                    "give the video as a list of frames")
    try:
        container = av.open(io.BytesIO(bytes(data)), mode="r")
    except (av.FFmpegError, ValueError, OSError) as e:
        raise UnsupportedMediaError(f"not a video file FFmpeg reads: {e}") from e
    with container:
        if not container.streams.video:
            raise UnsupportedMediaError("the file holds no video stream")
        stream = container.streams.video[0]
        if stream.width and stream.height:
            _check_pixels(stream.height, stream.width, max_input_pixels)
            _check_aspect(stream.height, stream.width)
        if max_input_frames is not None and stream.frames > max_input_frames:
            raise TooManyFramesError(f"{stream.frames} frames over the limit of {max_input_frames}",
                                     frames=stream.frames, limit=max_input_frames)
        rate = stream.average_rate or stream.guessed_rate
        frames = []
        try:
            for frame in container.decode(stream):
                if max_input_frames is not None and len(frames) >= max_input_frames:
                    raise TooManyFramesError(f"more than {max_input_frames} frames", frames=len(frames) + 1,
                                             limit=max_input_frames)
                if (frame.height, frame.width) != (stream.height, stream.width):
                    _check_pixels(frame.height, frame.width, max_input_pixels)
                frames.append(frame.to_ndarray(format="rgb24"))
        except av.FFmpegError as e:
            raise UndecodableMediaError(f"corrupt or truncated video: {e}") from e
    if len(frames) < 2:
        raise UnsupportedMediaError(f"a video file with {len(frames)} frame(s) is not a video")
    return frames, (float(rate) if rate else DEFAULT_ANIMATION_FPS)


def prepare_image(data: Any, settings: ProcessorSettings | None = None, *,
                  max_input_pixels: int = MAX_INPUT_PIXELS) -> PreparedImage:
    """One image -> its pixel_values, grid_thw and digest (see the module docstring)."""
    settings = settings or ProcessorSettings()
    rgb = _decode(data, settings, max_input_pixels)
    height, width = rgb.shape[:2]
    if settings.do_resize:
        height, width = smart_resize(height, width, settings.factor, settings.min_pixels, settings.max_pixels)
    frame = _normalize(_resize(rgb, height, width, settings.do_resize), settings)
    frames = np.broadcast_to(frame, (settings.temporal_patch_size, *frame.shape))
    pixel_values, grid = _patchify(frames, settings)
    return PreparedImage(pixel_values, grid, _digest("image", [rgb], settings))


def prepare_video(frames: Sequence[Any], settings: ProcessorSettings | None = None, *,
                  source_fps: float | None = None, max_input_frames: int | None = None,
                  max_input_pixels: int = MAX_INPUT_PIXELS) -> PreparedVideo:
    """A video given as its frames (each like `prepare_image`'s input, or one uint8 [F, H, W, C]
    array) -> pixel_values, grid_thw
    and digest. With `source_fps`, frames are sampled as the reference does (`settings.fps`);
    without it they are taken as already sampled and must not exceed `settings.max_frames`."""
    settings = settings or ProcessorSettings.video_defaults()
    if isinstance(frames, np.ndarray) and frames.ndim == 4:
        frames = list(frames)
    if isinstance(frames, (bytes, bytearray, np.ndarray)) or not isinstance(frames, Sequence):
        raise UnsupportedMediaError(f"a video is a list of frames, got {type(frames).__name__}")
    total = len(frames)
    if max_input_frames is not None and total > max_input_frames:
        raise TooManyFramesError(f"{total} frames over the limit of {max_input_frames}",
                                 frames=total, limit=max_input_frames)
    if source_fps is not None:
        frames = [frames[i] for i in sample_frame_indices(total, source_fps, settings)]
    elif settings.max_frames is not None and total > settings.max_frames:
        raise TooManyFramesError(f"{total} frames over max_frames {settings.max_frames} (pass source_fps to sample)",
                                 frames=total, limit=settings.max_frames)
    if len(frames) < settings.temporal_patch_size:
        raise UnsupportedMediaError(f"a video needs at least {settings.temporal_patch_size} frames, got {len(frames)}")
    rgbs = [_decode(f, settings, max_input_pixels) for f in frames]
    if len({r.shape for r in rgbs}) != 1:
        raise UnsupportedMediaError(f"frames differ in size: {sorted({r.shape[:2] for r in rgbs})}")
    height, width = rgbs[0].shape[:2]
    if settings.do_resize:
        height, width = smart_resize_video(len(rgbs), height, width, settings.factor, settings.temporal_patch_size,
                                           settings.min_pixels, settings.max_pixels)
    stack = np.stack([_normalize(_resize(r, height, width, settings.do_resize), settings) for r in rgbs])
    pad = -len(stack) % settings.temporal_patch_size
    if pad:
        stack = np.concatenate([stack, np.repeat(stack[-1:], pad, axis=0)])
    pixel_values, grid = _patchify(stack, settings)
    return PreparedImage(pixel_values, grid, _digest("video", rgbs, settings))


# --- steps -----------------------------------------------------------------------------------


def _positive_int(field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value <= 0:
        raise ConfigError(field, f"must be a positive integer, got {value!r}")
    return int(value)


def _channels(field: str, value: Any) -> tuple[float, ...]:
    values = [value] * 3 if isinstance(value, (int, float)) else list(value)
    if len(values) != 3:
        raise ConfigError(field, f"needs 3 values (RGB), got {value!r}")
    return tuple(float(v) for v in values)


def _check_aspect(height: int, width: int) -> None:
    if min(height, width) <= 0:
        raise UnsupportedMediaError(f"empty image {height}x{width}")
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise UnsupportedMediaError(f"aspect ratio {height}x{width} is over {MAX_ASPECT_RATIO}")


def _check_pixels(height: int, width: int, limit: int) -> None:
    if height * width > limit:
        raise TooManyPixelsError(f"{width}x{height} = {height * width} pixels over the limit of {limit}",
                                 pixels=height * width, limit=limit)


def _decode(data: Any, settings: ProcessorSettings, max_input_pixels: int) -> np.ndarray:
    """The RGB uint8 [H, W, 3] array of one input; its size is checked before decoding."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    if isinstance(data, np.ndarray):
        return _array_to_rgb(data, settings, max_input_pixels)
    if isinstance(data, (bytes, bytearray, memoryview)):
        if not len(data):
            raise UndecodableMediaError("empty image data")
        try:
            image = Image.open(io.BytesIO(bytes(data)))   # lazy: reads the header only
        except Image.DecompressionBombError as e:
            raise TooManyPixelsError(str(e), pixels=-1, limit=max_input_pixels) from e
        except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
            raise UndecodableMediaError(f"not an image Pillow can read: {e}") from e
        if image.format not in ALLOWED_FORMATS:
            raise UnsupportedMediaError(f"format {image.format} is not one of {sorted(ALLOWED_FORMATS)}")
        _check_pixels(image.height, image.width, max_input_pixels)
        _check_aspect(image.height, image.width)
        try:
            image.load()
            image = ImageOps.exif_transpose(image)   # as transformers' load_image does for files
        except (OSError, ValueError, SyntaxError, EOFError) as e:
            raise UndecodableMediaError(f"corrupt or truncated {image.format}: {e}") from e
    elif isinstance(data, Image.Image):
        image = data
        _check_pixels(image.height, image.width, max_input_pixels)
        _check_aspect(image.height, image.width)
    else:
        raise UnsupportedMediaError(f"an image is bytes, a PIL image or a uint8 array, got {type(data).__name__}")
    if not settings.do_convert_rgb:
        if image.mode != "RGB":
            raise UnsupportedMediaError(f"mode {image.mode} is not RGB and do_convert_rgb is off")
        return np.asarray(image)
    try:
        if "A" in image.getbands() or image.info.get("transparency") is not None:
            white = Image.new("RGBA", image.size, (255, 255, 255, 255))
            image = Image.alpha_composite(white, image.convert("RGBA"))
        return np.asarray(image.convert("RGB"))
    except (OSError, ValueError) as e:
        raise UnsupportedMediaError(f"mode {image.mode} does not convert to RGB: {e}") from e


def _array_to_rgb(array: np.ndarray, settings: ProcessorSettings, max_input_pixels: int) -> np.ndarray:
    """A uint8 [H, W], [H, W, 1|3|4] array as RGB, the way the reference converts arrays."""
    if array.dtype != np.uint8 or array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[2] not in (1, 3, 4)):
        raise UnsupportedMediaError(f"an image array is uint8 [H, W] or [H, W, 1|3|4], got {array.dtype} "
                                    f"{list(array.shape)}")
    _check_pixels(array.shape[0], array.shape[1], max_input_pixels)
    _check_aspect(array.shape[0], array.shape[1])
    if array.ndim == 2:
        array = array[:, :, None]
    if array.shape[2] != 3 and not settings.do_convert_rgb:
        raise UnsupportedMediaError(f"{array.shape[2]} channels and do_convert_rgb is off")
    if array.shape[2] == 1:
        array = np.repeat(array, 3, axis=2)
    elif array.shape[2] == 4:
        alpha = array[..., 3:4] / 255
        array = np.round(alpha * array[..., :3] + (1 - alpha) * 255).astype(np.uint8)
    return np.ascontiguousarray(array)


def _resize(rgb: np.ndarray, height: int, width: int, do_resize: bool) -> np.ndarray:
    """Pillow BICUBIC on the uint8 image, as the reference's PIL backend does."""
    if not do_resize:
        return rgb
    from PIL import Image

    return np.asarray(Image.fromarray(rgb).resize((width, height), resample=_BICUBIC))


def _normalize(image: np.ndarray, settings: ProcessorSettings) -> np.ndarray:
    """[H, W, 3] uint8 -> [3, H, W] float32: rescale in float64 cast to float32, then
    (x - mean) / std in float32 (the reference's order and precisions)."""
    x = image
    if settings.do_rescale:
        x = (x.astype(np.float64) * settings.rescale_factor).astype(np.float32)
    if settings.do_normalize:
        x = x.astype(np.float32) if not np.issubdtype(x.dtype, np.floating) else x
        mean = np.asarray(settings.image_mean, dtype=x.dtype)
        std = np.asarray(settings.image_std, dtype=x.dtype)
        x = (x - mean) / std
    return np.ascontiguousarray(np.moveaxis(x.astype(np.float32), -1, 0))


def _patchify(frames: np.ndarray, settings: ProcessorSettings) -> tuple[np.ndarray, tuple[int, int, int]]:
    """[F, C, H, W] (F a multiple of T) -> [grid_t * grid_h * grid_w, C * T * P * P] in merge-block
    order: (t, h-block, w-block, h-in-block, w-in-block) rows, (C, T, P, P) columns."""
    p, m, t = settings.patch_size, settings.merge_size, settings.temporal_patch_size
    n, c, height, width = frames.shape
    grid_t, grid_h, grid_w = n // t, height // p, width // p
    if height % (p * m) or width % (p * m):
        raise UnsupportedMediaError(f"{height}x{width} is not a multiple of {p * m} (set do_resize)")
    x = frames.reshape(grid_t, t, c, grid_h // m, m, p, grid_w // m, m, p)
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return np.ascontiguousarray(x.reshape(grid_t * grid_h * grid_w, c * t * p * p)), (grid_t, grid_h, grid_w)


def _digest(kind: str, rgbs: Sequence[np.ndarray], settings: ProcessorSettings) -> str:
    h = hashlib.sha256(f"ninfer-jax/media/v1:{kind}:{len(rgbs)}:{settings.canonical()}".encode())
    for rgb in rgbs:
        h.update(f"{rgb.shape}".encode())
        h.update(np.ascontiguousarray(rgb).tobytes())
    return h.hexdigest()
