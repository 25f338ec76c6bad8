"""Video files (issue 34): MP4, WebM and the other containers FFmpeg reads are decoded by PyAV
(`frontend/media.decode_video_file`) exactly as the reference's PyAV reader decodes them, with the
size and frame limits checked before any frame is decoded; without PyAV the error says how to get
it. The files are encoded here, in memory, by PyAV itself."""
from __future__ import annotations

import numpy as np
import pytest

from ninfer_jax.frontend import media
from ninfer_jax.frontend.errors import (TooManyFramesError, TooManyPixelsError, UndecodableMediaError,
                                        UnsupportedMediaError)

av = pytest.importorskip("av")
from tiny_vl import encode_video as encode  # noqa: E402  (after the skip)


@pytest.fixture(scope="module", params=[("mp4", "mpeg4"), ("webm", "libvpx-vp9")], ids=["mp4", "webm"])
def video(request):
    return encode(*request.param)


def test_frames_and_rate_equal_the_reference_reader(video, tmp_path):
    from transformers.video_utils import read_video_pyav

    frames, fps = media.decode_video_file(video)
    path = tmp_path / "clip"
    path.write_bytes(video)
    # every frame (a WebM declares no frame count, so the reference's own default would take none)
    want, meta = read_video_pyav(str(path), lambda metadata, **kw: np.arange(12))
    assert fps == pytest.approx(meta.fps) == 6.0
    assert len(frames) == len(want) == 12
    assert np.array_equal(np.stack(frames), want)  # bit for bit: the same decoder, the same conversion


def test_a_video_file_goes_through_decode_animation(video):
    frames, fps = media.decode_animation(video)
    assert len(frames) == 12 and fps == 6.0 and frames[0].shape == (48, 64, 3)


def test_limits_are_checked_before_decoding(video, monkeypatch):
    with pytest.raises(TooManyFramesError):
        media.decode_video_file(video, max_input_frames=5)
    with pytest.raises(TooManyPixelsError):
        media.decode_video_file(video, max_input_pixels=48 * 64 - 1)
    with pytest.raises(UnsupportedMediaError, match="FFmpeg"):
        media.decode_video_file(b"\x00\x00\x00\x18ftypmp42 not really a video")
    truncated = video[:len(video) // 3]
    with pytest.raises((UndecodableMediaError, UnsupportedMediaError)):
        frames, _ = media.decode_video_file(truncated)
        if len(frames) == 12:  # a container that hides its damage is still not the whole video
            raise UndecodableMediaError("undetected")


def test_without_pyav_the_error_says_how_to_get_it(video, monkeypatch):
    monkeypatch.setattr(media, "_pyav", lambda: None)
    with pytest.raises(UnsupportedMediaError, match="pip install av"):
        media.decode_animation(video)
