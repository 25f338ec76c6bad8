"""Image and video content parts in chat messages -> a prompt with its media (issue 34).

A tiny byte-level tokenizer with the Qwen vision tokens added and a minimal template that renders
image / video parts the way the Qwen3.5 template does (`<|vision_start|><|image_pad|><|vision_end|>`,
`<|vision_start|><|video_pad|><|vision_end|>`). The expansion is compared with transformers'
`Qwen3VLProcessor` itself (the processor Qwen3.5 checkpoints name), run on the same rendered text
and tokenizer: images through the real PIL image processor, videos through a stand-in video
processor that returns this frontend's grid and the frames' metadata (the reference video
processor needs torchvision; its grids are checked in test_media.py).
"""
from __future__ import annotations

import base64
import io
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from tokenizers import Tokenizer as HFTokenizer

from ninfer_jax.frontend import ChatFrontend, MediaPolicy, MediaRange, Tokenizer
from ninfer_jax.frontend.errors import (MalformedInputError, MediaNotSupportedError, MediaPlaceholderError,
                                        MediaSourceError, MediaTooLargeError, RemoteMediaUnavailableError,
                                        TooManyFramesError, UndecodableMediaError, UnsupportedContentError,
                                        UnsupportedMediaError)
from ninfer_jax.frontend.media import ProcessorSettings, prepare_image, prepare_video
from ninfer_jax.frontend.messages import normalize_messages
from tiny_vl import QWEN_LIKE_TEMPLATE, save_vl_tokenizer


@pytest.fixture(scope="module")
def tok_file(tmp_path_factory):
    return Path(save_vl_tokenizer(tmp_path_factory.mktemp("vision_tok")))


@pytest.fixture(scope="module")
def vision_tok(tok_file) -> Tokenizer:
    return Tokenizer(HFTokenizer.from_file(str(tok_file)), name="vision-test", eos_token="<|im_end|>",
                     chat_template=QWEN_LIKE_TEMPLATE)


@pytest.fixture
def media_dir(tmp_path):
    d = tmp_path / "media"
    d.mkdir()
    return d


@pytest.fixture
def front(vision_tok, media_dir) -> ChatFrontend:
    return ChatFrontend(vision_tok, media_policy=MediaPolicy(allowed_local_media_path=str(media_dir)))


def _png(h=40, w=70, seed=0) -> bytes:
    rgb = np.random.default_rng(seed).integers(0, 256, (h, w, 3)).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    return buf.getvalue()


def _data_url(data: bytes, mime="image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def _user(*parts):
    return [{"role": "user", "content": list(parts)}]


def _image(url):
    return {"type": "image_url", "image_url": {"url": url}}


# --- parsing --------------------------------------------------------------------------------

def test_each_part_form_parses():
    png = _png()
    url = _data_url(png)
    frames = [_data_url(_png(seed=i)) for i in range(3)]
    conv = normalize_messages(_user(
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": url, "detail": "high"}},
        {"type": "image_url", "image_url": url},
        {"type": "input_image", "image_url": url},
        {"type": "image", "image": url},
        {"type": "image", "image": png},
        {"type": "image", "url": url},
        {"type": "video_url", "video_url": {"url": "file:///v.mp4"}},
        {"type": "video_url", "video_url": "file:///v.mp4"},
        {"type": "video", "video": frames, "fps": 2},
        {"type": "video", "video": [frames]},
        "done",
    ))
    content = conv.messages[0]["content"]
    assert content[0] == {"type": "text", "text": "look"} and content[-1] == {"type": "text", "text": "done"}
    assert [c["type"] for c in content[1:-1]] == ["image"] * 6 + ["video"] * 4
    assert all(c == {"type": c["type"]} for c in content[1:-1])  # template-ready: nothing else
    assert [(m.kind, m.message, m.part) for m in conv.media] == (
        [("image", 0, j) for j in range(1, 7)] + [("video", 0, j) for j in range(7, 11)])
    assert [m.source for m in conv.media[:6]] == [url, url, url, url, png, url]
    assert [m.source for m in conv.media[6:8]] == ["file:///v.mp4"] * 2
    assert conv.media[8].source is None and conv.media[8].frames == tuple(frames) and conv.media[8].fps == 2.0
    assert conv.media[9].frames == tuple(frames) and conv.media[9].fps is None
    assert conv.content_parts() == [12]


def test_text_only_messages_are_unchanged():
    conv = normalize_messages([{"role": "system", "content": "s"},
                               {"role": "user", "content": ["a", {"type": "input_text", "text": "b"}]}])
    assert conv.media == ()
    assert conv.messages[1]["content"] == [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]


@pytest.mark.parametrize("part, error", [
    ({"type": "image_url"}, MalformedInputError),
    ({"type": "image_url", "image_url": {"url": ""}}, MalformedInputError),
    ({"type": "image", "image": 3}, MalformedInputError),
    ({"type": "input_image", "file_id": "file-1"}, UnsupportedContentError),
    ({"type": "video", "video": []}, MalformedInputError),
    ({"type": "video", "video": [["a"], ["b"]]}, MalformedInputError),
    ({"type": "video", "video": ["a", "b"], "fps": 0}, MalformedInputError),
    ({"type": "input_audio", "input_audio": {"data": "x"}}, UnsupportedContentError),
])
def test_malformed_parts_are_typed_errors(part, error):
    with pytest.raises(error):
        normalize_messages(_user(part))


# --- expansion ------------------------------------------------------------------------------

def test_data_url_png_becomes_its_pad_run(front, vision_tok):
    png = _png()
    ref = prepare_image(png, ProcessorSettings())
    p = front.render_chat(_user({"type": "text", "text": "describe"}, _image(_data_url(png))))
    t, h, w = ref.grid_thw
    n = t * h * w // 4
    pad, start_id, end_id = (vision_tok.token_to_id(s) for s in ("<|image_pad|>", "<|vision_start|>", "<|vision_end|>"))
    assert p.token_ids.count(pad) == n
    (r,) = p.media_ranges
    assert r == MediaRange(r.start, r.start + n, ref.digest, "image")
    assert set(p.token_ids[r.start:r.end]) == {pad}
    assert p.token_ids[r.start - 1] == start_id and p.token_ids[r.end] == end_id  # wrapper outside the range
    assert len(p.media) == 1 and p.media[0].digest == ref.digest and p.media[0].grid_thw == ref.grid_thw
    np.testing.assert_array_equal(p.media[0].pixel_values, ref.pixel_values)
    assert p.text.count("<|image_pad|>") == 1  # the template's text; the ids are expanded
    assert p.identity(r.end).media == (r,) and p.identity(r.start).media == ()
    with pytest.raises(ValueError):
        p.identity(r.start + 1)
    assert p.chain.media == (r,)
    for f in (*p.save_opportunities, *p.rewrite_execution_frontiers):
        assert not p.chain.splits_media(f)


def test_same_image_same_digest_other_image_other_digest(front):
    a, b = _png(seed=1), _png(seed=2)
    p = front.render_chat(_user(_image(_data_url(a)), "and", _image(_data_url(a)), "vs", _image(_data_url(b))))
    r1, r2, r3 = p.media_ranges
    assert r1.digest == r2.digest != r3.digest
    assert r1.end - r1.start == r3.end - r3.start  # same size, same token count
    assert r1.end < r2.start < r2.end < r3.start
    # a text boundary between items maps through the first expansion onto the prompt's ids
    q = front.render_chat(_user(_image(_data_url(a)), "and", _image(_data_url(b))),
                          cache_markers=[{"message": 0, "part": 1}], marker_policy="none")
    (m,) = q.markers
    assert q.media_ranges[0].end < m.frontier < q.media_ranges[1].start
    assert front.tokenizer.decode(q.token_ids[m.frontier - 2:m.frontier]) == "<|vision_end|>and"
    assert m.identity.media == q.media_ranges[:1]


def test_file_url_inside_the_folder_reads_the_file(front, media_dir):
    png = _png(seed=3)
    (media_dir / "sub").mkdir()
    (media_dir / "sub" / "a.png").write_bytes(png)
    p = front.render_chat(_user(_image((media_dir / "sub" / "a.png").as_uri()), "x"))
    q = front.render_chat(_user(_image(_data_url(png)), "x"))
    assert p.token_ids == q.token_ids and p.media_ranges == q.media_ranges


def test_video_frames_expand_per_temporal_group(front, vision_tok):
    frames = [_png(64, 96, seed=i) for i in range(5)]
    ref = prepare_video(frames, ProcessorSettings.video_defaults())
    p = front.render_chat(_user({"type": "video", "video": [_data_url(f) for f in frames], "fps": 2.0}, "what?"))
    (r,) = p.media_ranges
    assert r.kind == "video" and r.digest == ref.digest
    t, h, w = ref.grid_thw
    assert t == 3
    run = p.token_ids[r.start:r.end]
    vs, ve, pad = (vision_tok.token_to_id(s) for s in ("<|vision_start|>", "<|vision_end|>", "<|video_pad|>"))
    assert run.count(pad) == t * h * w // 4 and run.count(vs) == t and run.count(ve) == t
    # The timestamps are the video's own media time, written into the prompt (not a clock): a
    # temporal group of frames at `fps` is stamped at the mean of its frames' times; an odd
    # count repeats the last frame to fill the last group.
    fps, group = 2.0, ProcessorSettings.video_defaults().temporal_patch_size
    index = list(range(len(frames))) + [len(frames) - 1] * (-len(frames) % group)
    index_means = [sum(index[g * group:(g + 1) * group]) / group for g in range(t)]
    assert index_means == [0.5, 2.5, 4.0]  # frame 4 repeated to fill the last group
    stamps = [f"<{m / fps:.1f} seconds>" for m in index_means]  # the processor's own format
    text = vision_tok.decode(run)
    assert text.startswith(stamps[0] + "<|vision_start|>") and all(s in text for s in stamps)
    assert p.token_ids[r.start - 1] == vs and p.token_ids[r.end] == ve  # the template's outer wrapper


def test_an_animated_gif_is_a_video_file_sampled_as_the_reference(front, vision_tok):
    """A video file Pillow decodes (an animated GIF: 12 frames of 250 ms, 4 fps) is sampled at the
    processor's 2 fps (`sample_frame_indices`: 6 frames, indices 0, 2, 4, 7, 9, 11) and stamped
    with those frames' own times (index / 4 fps), as the reference's video processor does."""
    from PIL import ImageSequence

    rng = np.random.default_rng(3)
    frames = [Image.fromarray(rng.integers(0, 256, (64, 96, 3), np.uint8)) for _ in range(12)]
    buf = io.BytesIO()
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:], duration=250, loop=0)
    p = front.render_chat(_user({"type": "video_url", "video_url": {"url": _data_url(buf.getvalue(), "image/gif")}}))
    (r,) = p.media_ranges
    decoded = [f.copy() for f in ImageSequence.Iterator(Image.open(io.BytesIO(buf.getvalue())))]
    indices = [0, 2, 4, 7, 9, 11]
    want = prepare_video([decoded[i] for i in indices], ProcessorSettings.video_defaults())
    assert r.kind == "video" and r.digest == want.digest
    np.testing.assert_array_equal(p.media[0].pixel_values, want.pixel_values)
    text = vision_tok.decode(p.token_ids[r.start:r.end])
    index_means = [(a + b) / 2 for a, b in zip(indices[::2], indices[1::2])]
    assert index_means == [1.0, 5.5, 10.0]  # each temporal group: the mean of its sampled frames' indices
    stamps = [f"<{m / 4.0:.1f} seconds>" for m in index_means]  # at the file's 4 fps, the processor's format
    assert all(s in text for s in stamps)
    assert [text.index(s) for s in stamps] == sorted(text.index(s) for s in stamps)


# --- against transformers' processor --------------------------------------------------------

def _reference_processor(tok_file, video_processor=None):
    pytest.importorskip("transformers")
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor

    class Processor(Qwen3VLProcessor):
        def check_argument_for_proper_class(self, name, arg):  # the video class check needs torchvision
            return None

    images = Qwen2VLImageProcessorPil(patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3,
                                      image_std=[0.5] * 3, size={"shortest_edge": 65536, "longest_edge": 16777216})
    return Processor(image_processor=images, tokenizer=PreTrainedTokenizerFast(tokenizer_file=str(tok_file)),
                     video_processor=video_processor)


def test_image_expansion_matches_transformers(front, tok_file):
    pngs = [_png(40, 70, seed=4), _png(300, 200, seed=5)]
    p = front.render_chat([{"role": "user", "content": [_image(_data_url(pngs[0])), "two pictures"]},
                           {"role": "assistant", "content": "ok"},
                           {"role": "user", "content": ["and", {"type": "input_image", "image_url": _data_url(pngs[1])}]}])
    proc = _reference_processor(tok_file)
    out = proc(text=[p.text], images=[Image.open(io.BytesIO(b)) for b in pngs], add_special_tokens=False,
               return_tensors="np")
    assert tuple(out["input_ids"][0].tolist()) == p.token_ids
    assert [tuple(g) for g in out["image_grid_thw"].tolist()] == [m.grid_thw for m in p.media]
    np.testing.assert_allclose(out["pixel_values"], np.concatenate([m.pixel_values for m in p.media]), atol=1e-5)


def test_video_expansion_matches_transformers(front, tok_file):
    pytest.importorskip("transformers")
    from transformers.video_utils import VideoMetadata

    clips = [[_png(64, 96, seed=10 + i) for i in range(5)], [_png(32, 32, seed=20 + i) for i in range(4)]]
    still = _png(seed=30)
    p = front.render_chat(_user("first", {"type": "video", "video": [_data_url(f) for f in clips[0]], "fps": 2.0},
                                "then", _image(_data_url(still)),
                                {"type": "video", "video": [[_data_url(f) for f in clips[1]]]}))
    grids = [m.grid_thw for m, r in zip(p.media, p.media_ranges) if r.kind == "video"]
    metas = [(5, 2.0), (4, 24.0)]  # no fps given: the reference assumes 24

    class GivenGridVideoProcessor:
        """Stands in for Qwen3VLVideoProcessor: this frontend's grids and the frames' metadata."""
        merge_size, temporal_patch_size = 2, 2
        model_input_names = ["pixel_values_videos", "video_grid_thw"]

        def __call__(self, videos, **kwargs):
            return {"video_grid_thw": np.array(grids),
                    "video_metadata": [VideoMetadata(total_num_frames=n, fps=fps, frames_indices=list(range(n)))
                                       for n, fps in metas]}

    proc = _reference_processor(tok_file, GivenGridVideoProcessor())
    out = proc(text=[p.text], images=[Image.open(io.BytesIO(still))],
               videos=[np.zeros((5, 64, 96, 3), np.uint8), np.zeros((4, 32, 32, 3), np.uint8)],
               add_special_tokens=False, return_tensors="np")
    assert tuple(out["input_ids"][0].tolist()) == p.token_ids
    assert [r.kind for r in p.media_ranges] == ["video", "image", "video"]


# --- bad input: typed errors before the template renders ------------------------------------

def _count_renders(monkeypatch, front):
    calls = []
    original = front.template.render
    monkeypatch.setattr(front.template, "render", lambda *a, **k: calls.append(1) or original(*a, **k))
    return calls


def test_bad_sources_are_typed_errors_before_rendering(front, media_dir, tmp_path, monkeypatch):
    outside = tmp_path / "outside.png"
    outside.write_bytes(_png())
    os.symlink(outside, media_dir / "link.png")
    calls = _count_renders(monkeypatch, front)
    cases = [
        ("data:image/png;base64,@@not base64@@", MediaSourceError),
        ("data:image/png," + base64.b64encode(_png()).decode(), MediaSourceError),           # not ;base64
        (_data_url(_png(), mime="text/plain"), MediaSourceError),
        (_data_url(b"not an image at all"), UndecodableMediaError),
        (outside.as_uri(), MediaSourceError),
        ((media_dir / "link.png").as_uri(), MediaSourceError),                               # symlink out
        ((media_dir / ".." / "outside.png").as_uri(), MediaSourceError),                     # .. out
        ((media_dir / "missing.png").as_uri(), MediaSourceError),
        ("file://host/x.png", MediaSourceError),
        ("https://example.com/a.png", MediaSourceError),
        ("/abs/path.png", MediaSourceError),
    ]
    for url, error in cases:
        with pytest.raises(error) as info:
            front.render_chat(_user(_image(_data_url(_png(seed=9))), "x", _image(url)))
        assert type(info.value) is error, (url, info.value)
    assert calls == []


def test_policy_limits(vision_tok, media_dir):
    png = _png()
    with pytest.raises(MediaSourceError):   # no folder configured
        ChatFrontend(vision_tok).render_chat(_user(_image((media_dir / "a.png").as_uri())))
    remote = ChatFrontend(vision_tok, media_policy=MediaPolicy(allow_remote_urls=True, fetch_timeout_s=5))
    with pytest.raises(RemoteMediaUnavailableError):   # nothing listens there
        remote.render_chat(_user(_image(f"http://127.0.0.1:{_closed_port()}/a.png")))
    small = ChatFrontend(vision_tok, media_policy=MediaPolicy(max_bytes=len(png) - 1))
    with pytest.raises(MediaTooLargeError):
        small.render_chat(_user(_image(_data_url(png))))
    few = ChatFrontend(vision_tok, media_policy=MediaPolicy(max_input_frames=2))
    with pytest.raises(TooManyFramesError):
        few.render_chat(_user({"type": "video", "video": [_data_url(png)] * 3}))
    with pytest.raises(UnsupportedMediaError, match="FFmpeg"):   # "MP4" bytes no decoder reads
        few.render_chat(_user({"type": "video_url", "video_url": {"url": _data_url(b"x", "video/mp4")}}))
    with pytest.raises(UnsupportedMediaError, match="one frame"):   # a still image is not a video file
        few.render_chat(_user({"type": "video_url", "video_url": {"url": _data_url(png)}}))


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def web(tmp_path):
    """A loopback HTTP server: /a.png (a PNG), /big.png (a PNG over 20 kB), /page (text/html),
    /slow (answers after 3 s); yields its base URL."""
    import http.server
    import threading
    import time

    files = {"/a.png": ("image/png", _png(seed=7)), "/big.png": ("image/png", _png(200, 200, seed=8)),
             "/page": ("text/html", b"<html></html>"), "/slow": ("image/png", _png(seed=9))}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            try:
                self._answer()
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client stopped reading (a refused size, a timeout): as it should

        def _answer(self):
            if self.path == "/slow":
                time.sleep(3)
            mime, body = files.get(self.path, ("text/plain", None))
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", mime)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", files
    server.shutdown()


def test_remote_urls_are_fetched_only_when_allowed_capped_and_timed(vision_tok, web):
    base, files = web
    refused = ChatFrontend(vision_tok)
    with pytest.raises(MediaSourceError, match="not allowed"):
        refused.render_chat(_user(_image(base + "/a.png")))
    allowed = ChatFrontend(vision_tok, media_policy=MediaPolicy(allow_remote_urls=True, max_bytes=20000,
                                                               fetch_timeout_s=1))
    p = allowed.render_chat(_user(_image(base + "/a.png")))
    want = prepare_image(files["/a.png"][1], ProcessorSettings())
    assert p.media_ranges[0].digest == want.digest
    for path, error in (("/big.png", MediaTooLargeError), ("/page", RemoteMediaUnavailableError),
                        ("/missing.png", RemoteMediaUnavailableError), ("/slow", RemoteMediaUnavailableError)):
        with pytest.raises(error):
            allowed.render_chat(_user(_image(base + path)))


def test_policy_is_checked():
    from ninfer_jax.errors import ConfigError
    for bad in ({"max_bytes": 0}, {"max_input_pixels": -1}, {"max_input_frames": True}, {"allowed_local_media_path": ""}):
        with pytest.raises(ConfigError):
            MediaPolicy(**bad)


def test_media_to_a_text_only_tokenizer(frontend, monkeypatch):
    calls = _count_renders(monkeypatch, frontend)
    for part in (_image(_data_url(_png())), {"type": "video", "video": ["data:,"]}):
        with pytest.raises(MediaNotSupportedError) as info:
            frontend.render_chat(_user("hi", part))
        assert isinstance(info.value, UnsupportedContentError)
    assert calls == []


def test_placeholder_mismatch_is_a_typed_error(front, vision_tok):
    with pytest.raises(MediaPlaceholderError):   # a text part writing the pad token
        front.render_chat(_user("<|vision_start|><|image_pad|>", _image(_data_url(_png()))))
    dropping = ChatFrontend(vision_tok, chat_template="{% for m in messages %}{{ m.role }}{% endfor %}")
    with pytest.raises(MediaPlaceholderError):   # a template that drops the image
        dropping.render_chat(_user("x", _image(_data_url(_png()))))


# --- markers and recovery -------------------------------------------------------------------

def test_markers_on_media_end_after_the_item(front):
    url = _data_url(_png())
    p = front.render_chat([{"role": "user", "content": [{"type": "text", "text": "look"},
                                                        {**_image(url), "cache_control": {"type": "ephemeral"}}]}],
                          marker_policy="none")
    (r,) = p.media_ranges
    assert [m.frontier for m in p.markers] == [r.end]
    auto = front.render_chat(_user("look", _image(url)))          # OpenAI default: the last part, the image
    assert [m.frontier for m in auto.markers] == [r.end]
    # C -> R would hold the image: recovery stays at R, after it
    assert auto.recovery_position.kind.value == "R" and auto.recovery_position.frontier > r.end
    before = front.render_chat(_user(_image(url), "look"))         # image first: C after the text is fine
    assert before.recovery_position.kind.value == "C"
    assert before.recovery_position.frontier > before.media_ranges[0].end


def test_responses_input_image(front):
    from ninfer_jax.frontend import ResponsesStore
    url = _data_url(_png())
    r = front.render_responses([{"type": "message", "role": "user",
                                 "content": [{"type": "input_text", "text": "see"},
                                             {"type": "input_image", "image_url": url}]}], store=ResponsesStore())
    assert len(r.prompt.media_ranges) == 1 and r.prompt.media_ranges[0].kind == "image"
