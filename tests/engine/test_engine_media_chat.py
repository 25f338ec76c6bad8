"""Chat with images and videos through the engine (issue 34): a whole tiny VL checkpoint folder as the
hub ships one (tests/tiny_vl.py `save_vl_folder`: weights, tokenizer with the vision tokens, chat
template, preprocessor configs), media as OpenAI `image_url` data URLs, `file://` URLs under the
allowed folder, and video frame lists.

The prompt the engine runs is the chat frontend's (its expansion equals the reference processor's,
tests/frontend/test_media_parts.py); its tokens and logprobs equal the reference `Model.forward`
with the frontend's prepared pixels; turn 2 with the same image reuses it, a changed image does not;
every bad input is its typed error before any work, and the engine goes on serving.
"""
from __future__ import annotations

import base64

import pytest

from engine_helpers import assert_idle_and_empty
from media_helpers import check_against_forward
from ninfer_jax import ContextCacheConfig, Engine, EngineConfig, SamplingParams
from ninfer_jax.config import MediaConfig
from ninfer_jax.frontend.errors import MediaSourceError, TooManyPixelsError, UndecodableMediaError
from ninfer_jax.model.model import load_model
from ninfer_jax.program.program import Program

pytest.importorskip("transformers")
pytest.importorskip("torch")
from tiny_vl import data_url, png_bytes, save_vl_folder  # noqa: E402  (after the skips)


@pytest.fixture(scope="module")
def vl(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen3_5_vl_chat")
    save_vl_folder(folder)
    media = tmp_path_factory.mktemp("media")
    return str(folder), load_model(str(folder), dtype="float32"), media


def _engine(vl, **overrides):
    folder, model, media = vl
    cfg = EngineConfig(**{"model": folder, "max_concurrency": 2, "max_context": 320, "chunk_size": 8,
                          "progress": False, "context_cache": ContextCacheConfig(host_capacity_bytes=4 << 20),
                          "media": MediaConfig(allowed_local_media_path=str(media), max_input_pixels=4096),
                          **overrides})
    return Engine(cfg, program=Program(cfg, model=model), start=False)


def _sampling(engine):
    vision = engine.program.model.vision.tokens
    stops = (vision.image_token_id, vision.video_token_id, vision.vision_start_token_id)
    return SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, stop_token_ids=stops, logprobs=2)


def _user(*parts, text="describe this picture"):
    return {"role": "user", "content": [{"type": "text", "text": text}, *parts]}


def _image_part(url):
    return {"type": "image_url", "image_url": {"url": url}}


def _chat(engine, messages):
    got = engine.chat(messages, sampling=_sampling(engine))
    assert got.finish_reason in ("length", "stop"), got.error
    return got


def _reference_check(engine, messages, got):
    rendered = engine.chat_frontend().render_chat(messages)
    assert tuple(rendered.token_ids) == got.prompt_token_ids
    images = [m for m, r in zip(rendered.media, rendered.media_ranges) if r.kind == "image"]
    videos = [m for m, r in zip(rendered.media, rendered.media_ranges) if r.kind == "video"]
    check_against_forward(engine.program.model, got.prompt_token_ids, images, videos, got)
    return rendered


def test_image_and_video_chat_equal_the_reference(vl):
    engine = _engine(vl)
    msgs = [_user(_image_part(data_url(png_bytes(1))))]
    got = _chat(engine, msgs)
    rendered = _reference_check(engine, msgs, got)
    assert [r.kind for r in rendered.media_ranges] == ["image"]
    frames = [data_url(png_bytes(10 + i, (16, 16))) for i in range(3)]  # odd: the last frame repeats
    msgs = [_user({"type": "video", "video": frames, "fps": 1.0}, text="and this video")]
    got = _chat(engine, msgs)
    assert [r.kind for r in _reference_check(engine, msgs, got).media_ranges] == ["video"]
    assert engine.stats()["vision_encodes"] == 2
    assert_idle_and_empty(engine)


def test_an_mp4_video_url_equals_the_reference(vl):
    """A video file (MP4, decoded by PyAV as the reference's reader decodes it) as a `video_url`
    data URL: its frames sampled at the processor's fps, the prompt's logits those of the
    reference forward with the frontend's pixels."""
    pytest.importorskip("av")
    from tiny_vl import encode_video

    engine = _engine(vl)
    url = "data:video/mp4;base64," + base64.b64encode(encode_video("mp4", "mpeg4", frames=8, fps=4)).decode()
    msgs = [_user({"type": "video_url", "video_url": {"url": url}}, text="what happens?")]
    got = _chat(engine, msgs)
    rendered = _reference_check(engine, msgs, got)
    assert [r.kind for r in rendered.media_ranges] == ["video"]
    assert_idle_and_empty(engine)


def test_turn_two_reuses_the_same_image_not_a_changed_one(vl):
    _, _, media = vl
    (media / "shot.png").write_bytes(png_bytes(2))
    engine = _engine(vl)
    cold = _engine(vl, context_cache=ContextCacheConfig(enabled=False, host_capacity_bytes=0))
    first = [_user(_image_part(f"file://{media / 'shot.png'}"))]
    out = _chat(engine, first)
    turn2 = first + [{"role": "assistant", "content": out.text},
                     _user(_image_part(data_url(png_bytes(3))), text="and now?")]
    same = _chat(engine, turn2)
    ranges = engine.chat_frontend().render_chat(turn2).media_ranges
    assert same.usage.cached_tokens >= ranges[0].end, (same.usage, ranges)
    assert same.token_ids == _chat(cold, turn2).token_ids
    _reference_check(engine, turn2, same)
    (media / "shot.png").write_bytes(png_bytes(4))  # another picture of the same size, same URL
    changed = _chat(engine, turn2)
    assert changed.usage.cached_tokens <= ranges[0].start, changed.usage
    assert changed.token_ids == _chat(cold, turn2).token_ids
    assert_idle_and_empty(engine)


@pytest.mark.parametrize("part,error", [
    (_image_part("data:image/png;base64," + base64.b64encode(b"not a png").decode()), UndecodableMediaError),
    (_image_part("file:///etc/hostname"), MediaSourceError),
    (_image_part("https://example.com/cat.png"), MediaSourceError),
    (_image_part(data_url(png_bytes(5, (80, 80)))), TooManyPixelsError),
])
def test_bad_media_is_a_typed_error_and_the_engine_goes_on(vl, part, error):
    engine = _engine(vl)
    with pytest.raises(error):
        engine.submit_chat([_user(part)])
    engine.step()
    assert engine.stats()["requests_submitted"] == 0
    assert _chat(engine, [_user(_image_part(data_url(png_bytes(6))))]).token_ids
    assert_idle_and_empty(engine)
