"""vLLM's stop parameters on the engine (issue 36): `min_tokens` holds back EOS, the stop ids and
the stop strings until that many tokens are out; `include_stop_str_in_output` keeps the stop
string, or a stop id's text, in the output; a stop id's own text is not output otherwise.

Each case is derived from the greedy output of the built-in model on one prompt, so the
expectation follows from what the model generates, not from a recorded string."""
from __future__ import annotations

import pytest

from ninfer_jax import SamplingParams
from ninfer_jax.errors import RequestError

PROMPT = [{"role": "user", "content": "Hi there"}]


def _run(engine, **kw):
    return engine.chat(PROMPT, sampling=SamplingParams(temperature=0, max_tokens=16, **kw))


def test_min_tokens_holds_back_a_stop_id_and_then_lets_it_end(plain_and_spec):
    plain, spec = plain_and_spec
    base = _run(plain)
    first = base.token_ids[0]
    assert _run(plain, stop_token_ids=(first,)).token_ids == (first,)  # it stops at once
    held = _run(plain, stop_token_ids=(first,), min_tokens=3)
    assert first not in held.token_ids[:3] and len(held.token_ids) >= 3
    if held.finish_reason == "stop":  # it may end on the stop id once three tokens are out
        assert held.token_ids[-1] == first and first not in held.token_ids[:-1]
    # Speculative decoding verifies its drafts against the same held-back distribution.
    assert _run(spec, stop_token_ids=(first,), min_tokens=3).token_ids == held.token_ids


def test_min_tokens_holds_back_eos(plain_and_spec):
    """Greedy replies of this model do not end, so seeded draws are searched for one that ends on
    EOS; with min_tokens past that length, EOS is never drawn before it, and speculative decoding
    draws exactly the same tokens."""
    plain, spec = plain_and_spec
    eos = set(plain.program.eos_token_ids)
    drawn = (plain.chat(PROMPT, sampling=SamplingParams(temperature=1.0, seed=seed, max_tokens=40))
             for seed in range(64))
    seed, ended = next((s, c) for s, c in enumerate(drawn) if c.finish_reason == "stop" and c.token_ids[-1] in eos)
    n = len(ended.token_ids)
    held = SamplingParams(temperature=1.0, seed=seed, max_tokens=40, min_tokens=n + 2)
    longer = plain.chat(PROMPT, sampling=held)
    assert len(longer.token_ids) >= n + 2 and not set(longer.token_ids[:n + 2]) & eos
    assert spec.chat(PROMPT, sampling=held).token_ids == longer.token_ids


def test_min_tokens_holds_back_stop_strings(plain_and_spec):
    plain, _ = plain_and_spec
    base = _run(plain)
    assert base.text.startswith("\n")
    assert _run(plain, stop=("\n",)).text == ""  # the first token's text holds the stop string
    later = _run(plain, stop=("\n",), min_tokens=4)
    assert len(later.token_ids) > 4 and later.text == base.text[:base.text.index("\n", 1)]


def test_include_stop_str_in_output(plain_and_spec):
    plain, _ = plain_and_spec
    base = _run(plain)
    word = base.text.strip().split()[1][:4]  # a stop string inside the second word
    at = base.text.index(word)
    assert _run(plain, stop=(word,)).text == base.text[:at]
    kept = _run(plain, stop=(word,), include_stop_str_in_output=True)
    assert kept.text == base.text[:at + len(word)]


def test_a_stop_id_text_is_output_only_when_asked(plain_and_spec):
    plain, _ = plain_and_spec
    base = _run(plain)
    third = base.token_ids[2]
    without = _run(plain, stop_token_ids=(third,))
    with_it = _run(plain, stop_token_ids=(third,), include_stop_str_in_output=True)
    assert without.token_ids == with_it.token_ids == base.token_ids[:3]  # the id itself is output
    piece = plain.tokenizer.decode(base.token_ids[:3])
    assert with_it.text == piece and without.text == plain.tokenizer.decode(base.token_ids[:2])
    assert with_it.text != without.text


@pytest.mark.parametrize("bad, field", [({"min_tokens": -1}, "min_tokens"), ({"min_tokens": 1.5}, "min_tokens"),
                                        ({"min_tokens": 20, "max_tokens": 10}, "min_tokens"),
                                        ({"include_stop_str_in_output": "yes"}, "include_stop_str_in_output")])
def test_bad_values_are_refused_naming_the_field(bad, field):
    with pytest.raises(RequestError, match=f"sampling.{field}"):
        SamplingParams(**bad)
