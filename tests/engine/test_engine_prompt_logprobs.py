"""vLLM's prompt_logprobs on the engine (issue 36): every prompt token after the first gets its
logprob under the model's raw distribution, its rank and the top ones; the request prefills its
whole prompt itself (a cached prefix gives no logits), its output is the same as without the
option, and a pause in its prefill (Replay recomputes some chunks) records each position once."""
from __future__ import annotations

import numpy as np
import pytest

from ninfer_jax import SamplingParams
from ninfer_jax.errors import RequestError

from engine_helpers import make_engine, run_until_done

PROMPT = [(11 * i + 4) % 1000 + 3 for i in range(150)]  # five 32-token chunks


def _reference(model, ids):
    logits = np.asarray(model.forward(np.array(ids, np.int32)), np.float64)
    lp = logits - logits.max(-1, keepdims=True)
    return lp - np.log(np.exp(lp).sum(-1, keepdims=True))


@pytest.fixture(scope="module")
def engine(tiny_model):
    e = make_engine(tiny_model)
    yield e
    e.close()


def _run(engine, sp, pause_at=None, route="replay"):
    h = engine.submit(PROMPT, sp, request_id="p")
    paused = False
    for _ in range(2000):
        if h.done():
            break
        engine.step()
        engine.check_integrity()
        req = engine.core.by_id.get("p")
        if pause_at and not paused and req is not None and req.fed >= pause_at and req in engine.core.residents:
            paused = engine.core.pause("p", route)
    assert pause_at is None or paused
    return h.result()


def test_entries_equal_the_whole_sequence_forward_and_nothing_is_reused(engine, tiny_model):
    plain = _run(engine, SamplingParams(temperature=0, max_tokens=5))  # the prompt is now cached
    got = _run(engine, SamplingParams(temperature=0, max_tokens=5, prompt_logprobs=4))
    assert got.token_ids == plain.token_ids and got.usage.cached_tokens == 0
    assert plain.prompt_logprobs is None and len(got.prompt_logprobs) == len(PROMPT)
    assert got.prompt_logprobs[0] is None
    ref = _reference(tiny_model, PROMPT)
    for p in range(1, len(PROMPT)):
        e = got.prompt_logprobs[p]
        assert e.token_id == PROMPT[p] and abs(e.logprob - ref[p - 1, PROMPT[p]]) < 1e-4
        assert e.rank == 1 + int(np.sum(ref[p - 1] > ref[p - 1, PROMPT[p]]))
        assert [t for t, _ in e.top] == np.argsort(-ref[p - 1], kind="stable")[:4].tolist()
    engine.check_integrity()


@pytest.mark.parametrize("route", ["replay", "snapshot"])
def test_a_pause_in_the_prefill_records_each_position_once(engine, route):
    """The prompt is cached whole by then: a Replay must still not take a source past the
    position it needs logits from."""
    sp = SamplingParams(temperature=0, max_tokens=5, prompt_logprobs=1)
    whole = _run(engine, sp)
    paused = _run(engine, sp, pause_at=96, route=route)
    assert paused.token_ids == whole.token_ids
    assert [e and (e.token_id, e.rank) for e in paused.prompt_logprobs] == \
           [e and (e.token_id, e.rank) for e in whole.prompt_logprobs]
    assert max(abs(a.logprob - b.logprob) for a, b in zip(paused.prompt_logprobs[1:], whole.prompt_logprobs[1:])) \
        < 1e-5


def test_with_speculative_decoding_they_equal_the_plain_engines(plain_and_spec):
    """The MTP prefill step gives every position's logits as the plain one does: the same entries,
    the same output (drafting changes nothing)."""
    plain, spec = plain_and_spec
    prompt = PROMPT[:70]
    for sp in (SamplingParams(max_tokens=6, temperature=0, prompt_logprobs=3),
               SamplingParams(max_tokens=6, temperature=1.0, seed=5, prompt_logprobs=0, logprobs=1)):
        a, b = plain.generate(prompt, sp), spec.generate(prompt, sp)
        assert b.token_ids == a.token_ids and b.prompt_logprobs == a.prompt_logprobs
        assert len(b.prompt_logprobs) == len(prompt) and b.prompt_logprobs[0] is None


def test_bad_values_are_refused():
    for bad in (-1, 21, 1.5):
        with pytest.raises(RequestError, match="sampling.prompt_logprobs"):
            SamplingParams(prompt_logprobs=bad)


def test_cancel_mid_prefill_leaves_nothing(engine):
    h = engine.submit(PROMPT, SamplingParams(max_tokens=5, prompt_logprobs=2))
    engine.step()
    h.cancel()
    run_until_done(engine, [h])
    assert h.result().finish_reason == "cancelled"
    assert engine.stats()["residents"] == 0
    engine.check_integrity()
