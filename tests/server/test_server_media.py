"""Images and videos over the gRPC service and the OpenAI-compatible HTTP API (issue 34), on a whole
tiny VL checkpoint folder (tests/tiny_vl.py) served by one `InferenceServer` (gRPC and HTTP):

- HTTP `image_url` data URLs and gRPC image bytes / video frames give the tokens of the same
  engine in process (`engine.chat` with the same media);
- every bad input is its typed error (HTTP 400 naming the error, gRPC INVALID_ARGUMENT), refused
  before the engine, and nothing leaks (`check_integrity`); a text-only checkpoint refuses media.
"""
from __future__ import annotations

import base64
import io
import json

import grpc
import httpx2
import openai
import pytest
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

from fakes import wait_until
from ninfer_jax import SamplingParams
from server.app import InferenceServer
from server.cli_commands import engine_factory
from server.client import NInferClient

pytest.importorskip("transformers")
pytest.importorskip("torch")
from tiny_vl import data_url, png_bytes, save_vl_folder  # noqa: E402  (after the skips)


def _ico() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (16, 16), (10, 20, 30)).save(buf, format="ICO")
    return buf.getvalue()


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vl_served")
    save_vl_folder(folder)
    media = tmp_path_factory.mktemp("served_media")
    factory = engine_factory(str(folder), dtype="float32", max_concurrency=2, max_context=256, chunk_size=16,
                             progress=False, allowed_local_media_path=str(media), max_input_pixels=4096)
    srv = InferenceServer(factory, port=0, http_port=0, grace_s=2.0, progress=lambda m: None)
    srv.start()
    srv.warm_up()
    http = openai.OpenAI(api_key="unused", base_url=f"http://127.0.0.1:{srv.http.port}/v1", max_retries=0,
                         timeout=120.0)
    grpc_client = NInferClient(f"127.0.0.1:{srv.port}")
    yield srv, http, grpc_client, str(folder), media
    grpc_client.close()
    srv.shutdown(grace_s=2.0)


def _settled(srv):
    assert wait_until(lambda: srv.engine.stats()["residents"] + srv.engine.stats()["queued"] == 0, 30.0)
    srv.engine.check_integrity()


GREEDY = {"temperature": 0.0, "max_tokens": 5}


def _user(*parts):
    return [{"role": "user", "content": [{"type": "text", "text": "what is this"}, *parts]}]


def test_http_and_grpc_media_equal_the_engine_in_process(live):
    srv, http, rpc, folder, _ = live
    image = png_bytes(1)
    want = srv.engine.chat(_user({"type": "image", "image": image}), sampling=SamplingParams(**GREEDY))
    assert want.usage.prompt_tokens > 10
    got = http.chat.completions.create(model=folder, messages=_user({"type": "image_url",
                                                                     "image_url": {"url": data_url(image)}}),
                                       max_tokens=5, temperature=0)
    assert got.usage.prompt_tokens == want.usage.prompt_tokens
    assert got.choices[0].message.content == want.text
    by_rpc = rpc.chat(_user({"type": "image", "image": image}), sampling=GREEDY)
    assert by_rpc.token_ids == list(want.token_ids)
    frames = [png_bytes(10 + i, (16, 16)) for i in range(4)]
    want_video = srv.engine.chat(_user({"type": "video", "video": frames, "fps": 2.0}),
                                 sampling=SamplingParams(**GREEDY))
    got_video = rpc.chat(_user({"type": "video", "video": frames, "fps": 2.0}), sampling=GREEDY)
    assert got_video.token_ids == list(want_video.token_ids)
    assert got_video.usage["prompt_tokens"] == want_video.usage.prompt_tokens
    metrics = {(s.name, tuple(s.labels.items())): s.value
               for fam in text_string_to_metric_families(httpx2.get(f"http://127.0.0.1:{srv.http.port}/metrics").text)
               for s in fam.samples}
    stats = srv.engine.stats()
    assert metrics[("ninfer:vision_encodes_total", ())] == stats["vision_encodes"] == 2  # one image, one video
    assert metrics[("ninfer:media_cache_hits_total", ())] == stats["media_cache_hits"] >= 2
    assert metrics[("ninfer:media_cache_bytes", ())] == stats["media_cache_bytes"] > 0
    _settled(srv)


BAD = [
    ("undecodable", {"type": "image_url", "image_url": {"url": "data:image/png;base64,"
                                                        + base64.b64encode(b"junk").decode()}},
     "UndecodableMediaError"),
    ("remote", {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}, "MediaSourceError"),
    ("outside", {"type": "image_url", "image_url": {"url": "file:///etc/hostname"}}, "MediaSourceError"),
    ("too_big", {"type": "image_url", "image_url": {"url": data_url(png_bytes(2, (90, 90)))}}, "TooManyPixelsError"),
    ("too_many_frames", {"type": "video", "video": [data_url(png_bytes(i, (16, 16))) for i in range(9)]},
     "TooManyFramesError"),  # the checkpoint's video max_frames is 8
    ("format", {"type": "image_url", "image_url": {"url": "data:image/x-icon;base64,"
                                                   + base64.b64encode(_ico()).decode()}}, "UnsupportedMediaError"),
]


@pytest.mark.parametrize("part,error", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_media_is_refused_on_both_surfaces(live, part, error):
    srv, http, rpc, folder, _ = live
    before = srv.engine.stats()["requests_submitted"]
    with pytest.raises(openai.BadRequestError) as info:
        http.chat.completions.create(model=folder, messages=_user(part), max_tokens=3)
    assert info.value.body["message"].startswith(f"{error}: "), info.value.body
    if part["type"] == "video":  # gRPC carries a video's frames as bytes
        part = dict(part, video=[base64.b64decode(f.split(",", 1)[1]) for f in part["video"]])
    with pytest.raises(grpc.RpcError) as rpc_info:
        rpc.chat(_user(part), sampling=GREEDY)
    assert rpc_info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error in rpc_info.value.details(), rpc_info.value.details()
    assert srv.engine.stats()["requests_submitted"] == before  # refused before the engine
    _settled(srv)


def test_a_text_only_checkpoint_refuses_media_over_http():
    srv = InferenceServer(engine_factory("builtin:tiny-hybrid", max_concurrency=1, max_context=256, progress=False),
                          port=None, http_port=0, grace_s=2.0, progress=lambda m: None)
    srv.start()
    srv.warm_up()
    try:
        http = openai.OpenAI(api_key="unused", base_url=f"http://127.0.0.1:{srv.http.port}/v1", max_retries=0)
        with pytest.raises(openai.BadRequestError) as info:
            http.chat.completions.create(model="builtin:tiny-hybrid", max_tokens=3, messages=_user(
                {"type": "image_url", "image_url": {"url": data_url(png_bytes(3))}}))
        assert "text-only" in json.dumps(info.value.body)
        assert srv.engine.stats()["requests_submitted"] == 0
    finally:
        srv.shutdown(grace_s=2.0)
