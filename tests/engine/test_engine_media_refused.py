"""A text-only checkpoint (the built-in model) refuses image and video input at the boundary with a
typed error, before any media is read, and goes on serving: a prompt whose placeholders ran as
text would be a fluent wrong answer. (Media on a VL checkpoint: test_engine_media.py.)"""
import base64

import pytest

from engine_helpers import assert_idle_and_empty, make_engine, run_until_done
from ninfer_jax import SamplingParams
from ninfer_jax.frontend.errors import MediaNotSupportedError, UnsupportedContentError

NOT_AN_IMAGE = "data:image/png;base64," + base64.b64encode(b"not a png at all").decode()


@pytest.fixture(scope="module")
def engine(tiny_model):
    return make_engine(tiny_model, max_context=256)


@pytest.mark.parametrize("part", [
    {"type": "image_url", "image_url": {"url": NOT_AN_IMAGE}},
    {"type": "input_image", "image_url": NOT_AN_IMAGE},
    {"type": "video", "video": [NOT_AN_IMAGE, NOT_AN_IMAGE]},
])
def test_media_is_refused_before_it_is_read_and_the_engine_goes_on(engine, part):
    msgs = [{"role": "user", "content": [{"type": "text", "text": "what is this?"}, part]}]
    with pytest.raises(MediaNotSupportedError) as err:  # not UndecodableMediaError: nothing was decoded
        engine.submit_chat(msgs)
    assert isinstance(err.value, UnsupportedContentError)
    h = engine.submit_chat([{"role": "user", "content": "hello"}],
                           sampling=SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    run_until_done(engine, [h])
    assert len(h.result().token_ids) == 4
    assert_idle_and_empty(engine)


def test_a_rendered_prompt_with_media_is_refused(engine):
    rendered = engine.chat_frontend().render_chat([{"role": "user", "content": "hi"}])
    with_media = type("Rendered", (), {"media": (object(),), "media_ranges": (object(),),
                                       "token_ids": rendered.token_ids})()
    before = engine.stats()["requests_submitted"]
    with pytest.raises(MediaNotSupportedError, match="text-only"):
        engine.submit_rendered(with_media)
    engine.step()
    assert engine.stats()["requests_submitted"] == before
