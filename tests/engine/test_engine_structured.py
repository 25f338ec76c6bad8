"""Structured output on the engine (issue 36, engine/grammar.py): every kind of grammar holds on
the built-in model's output, greedy and seeded; a constrained row changes no batch mate's
tokens and is itself the same alone, batched, with MTP drafts, and across Snapshot and Replay
pauses in its decode; a grammar that does not compile is refused at submission.

The schemas bound every value (lengths, integer ranges) so that a tiny model's answer ends."""
from __future__ import annotations

import json
import re

import pytest

from ninfer_jax import ContextCacheConfig, SamplingParams
from ninfer_jax.engine.grammar import StructuredOutput
from ninfer_jax.errors import RequestError

from engine_helpers import make_engine, run_until_done

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["city", "days", "sunny"],
          "properties": {"city": {"type": "string", "maxLength": 10},
                         "days": {"type": "integer", "minimum": 0, "maximum": 30},
                         "sunny": {"type": "boolean"}}}
CHOICES = ("yes", "no", "maybe later")
REGEX = r"[0-9]{3}-[a-z]{2}"
KINDS = [StructuredOutput("json_schema", SCHEMA), StructuredOutput("json_object"),
         StructuredOutput("choice", CHOICES), StructuredOutput("regex", REGEX),
         StructuredOutput("lark", 'start: "Answer: " WORD "."\nWORD: /[a-z]{1,8}/')]


def _holds(so: StructuredOutput, text: str) -> bool:
    if so.kind == "json_schema":
        got = json.loads(text)
        return (set(got) == {"city", "days", "sunny"} and isinstance(got["city"], str) and len(got["city"]) <= 10
                and isinstance(got["days"], int) and 0 <= got["days"] <= 30 and isinstance(got["sunny"], bool))
    if so.kind == "json_object":
        return isinstance(json.loads(text), dict)
    if so.kind == "choice":
        return text in CHOICES
    if so.kind == "regex":
        return re.fullmatch(REGEX, text) is not None
    return re.fullmatch(r"Answer: [a-z]{1,8}\.", text) is not None


def _sp(so, i=0, **kw):
    base = dict(temperature=0) if i % 2 == 0 else dict(temperature=1.0, seed=100 + i)
    return SamplingParams(max_tokens=48, structured_output=so, **{**base, **kw})


PROMPT = [{"role": "user", "content": "The weather in Paris, as JSON please."}]


# json_object bounds nothing (any keys, any values): greedy only, where this model closes it.
CASES = [(so, i) for so in KINDS for i in ((0,) if so.kind == "json_object" else (0, 1, 3))]


@pytest.mark.parametrize("so, i", CASES, ids=[f"{so.kind}-{i}" for so, i in CASES])
def test_every_kind_holds_greedy_and_seeded_and_with_mtp(plain_and_spec, so, i):
    plain, spec = plain_and_spec
    got = plain.chat(PROMPT, sampling=_sp(so, i))
    assert got.finish_reason == "stop" and _holds(so, got.text), got.text
    assert got.token_ids[-1] in plain.program.eos_token_ids  # the grammar ended it with EOS
    assert spec.chat(PROMPT, sampling=_sp(so, i)).token_ids == got.token_ids  # drafts change nothing


@pytest.fixture(scope="module")
def cold(tiny_model):
    """A stepped engine with no context cache (the cold reference), C = 8."""
    engine = make_engine(tiny_model, max_concurrency=8, context_cache=ContextCacheConfig(enabled=False))
    yield engine
    engine.close()


def test_constrained_and_free_rows_batched_equal_each_alone(cold):
    engine = cold
    prompts = [engine.chat_frontend().render_chat([{"role": "user", "content": f"Question {i}: the weather?"}])
               .token_ids for i in range(8)]
    sps = [_sp(KINDS[i % 4], i) if i % 2 == 0 else SamplingParams(temperature=1.0, seed=i, max_tokens=20)
           for i in range(8)]
    alone = []
    for p, sp in zip(prompts, sps):
        h = engine.submit(list(p), sp)
        run_until_done(engine, [h])
        alone.append(h.result().token_ids)
    handles = [engine.submit(list(p), sp) for p, sp in zip(prompts, sps)]
    run_until_done(engine, handles)  # all eight queued before the first cycle: one batch
    assert [h.result().token_ids for h in handles] == alone
    assert all(_holds(sp.structured_output, h.result().text) for h, sp in zip(handles, sps)
               if sp.structured_output is not None)


@pytest.mark.parametrize("route", ["snapshot", "replay"])
def test_pauses_in_a_constrained_decode_change_nothing(tiny_model, cold, route):
    """A request paused after 3 and again after 9 constrained tokens resumes with its grammar where
    its committed output left it, and ends exactly as the uninterrupted run on a cold engine."""
    so = StructuredOutput("json_schema", SCHEMA)
    want = cold.chat(PROMPT, sampling=_sp(so, 1))
    engine = make_engine(tiny_model, max_concurrency=2)
    try:
        tokens = engine.chat_frontend().render_chat(PROMPT).token_ids
        h = engine.submit(list(tokens), _sp(so, 1), request_id="s")
        paused = set()
        for _ in range(2000):
            if h.done():
                break
            engine.step()
            engine.check_integrity()
            req = engine.core.by_id.get("s")
            for at in (3, 9):
                if at not in paused and req is not None and len(req.output) == at and req in engine.core.residents:
                    assert engine.core.pause("s", route)
                    paused.add(at)
        assert paused == {3, 9}
        assert h.result().token_ids == want.token_ids and _holds(so, h.result().text)
        engine.check_integrity()
    finally:
        engine.close()


def test_a_grammar_complete_before_min_tokens_ends_on_eos(plain_and_spec):
    """min_tokens holds EOS back, but a complete grammar allows nothing else: the grammar wins and
    the request ends (it used to draw a token the grammar refused and fail the engine)."""
    plain, spec = plain_and_spec
    so = StructuredOutput("choice", CHOICES)
    for engine in (plain, spec):
        got = engine.chat(PROMPT, sampling=_sp(so, 0, min_tokens=20))
        assert got.finish_reason == "stop" and got.text in CHOICES and len(got.token_ids) < 20
        assert got.token_ids[-1] in engine.program.eos_token_ids


@pytest.mark.parametrize("so, says", [
    (lambda: StructuredOutput("regex", "("), "does not compile"),
    (lambda: StructuredOutput("lark", "start: nothing"), "does not compile"),
    (lambda: StructuredOutput("json_schema", "{not json"), "not JSON"),
    (lambda: StructuredOutput("json_schema", [1]), "must be an object"),
    (lambda: StructuredOutput("choice", []), "non-empty list"),
    (lambda: StructuredOutput("choice", "yes"), "non-empty list"),
    (lambda: StructuredOutput("xml"), "must be one of"),
    (lambda: SamplingParams(structured_output={"type": "json_object"}), "must be a StructuredOutput"),
])
def test_a_bad_grammar_is_refused_before_it_is_queued(plain_and_spec, so, says):
    plain, _ = plain_and_spec
    before = plain.stats()["requests_submitted"]
    with pytest.raises(RequestError, match=f"structured_output.*{says}"):
        plain.submit([1, 2, 3], SamplingParams(structured_output=so()) if callable(so) else so)
    assert plain.stats()["requests_submitted"] == before


def test_a_grammar_compiles_once_and_each_request_walks_its_own_copy(cold):
    """A second request with the same spec copies the compiled grammar (n choices, retries, an
    agent's turns) instead of compiling it again; the copies advance independently."""
    engine = cold
    grammars = engine.core.grammars
    grammars.clear()
    before = grammars.compiled
    so = StructuredOutput("regex", r"[a-z]{3,6} [0-9]{2}")
    sps = [_sp(so, i) for i in range(4)]
    handles = [engine.submit([5, 6, 7 + i], sp) for i, sp in enumerate(sps)]
    run_until_done(engine, handles)
    assert grammars.compiled == before + 1
    alone = []
    for i, sp in enumerate(sps):
        h = engine.submit([5, 6, 7 + i], sp)
        run_until_done(engine, [h])
        alone.append(h.result().token_ids)
    assert [h.result().token_ids for h in handles] == alone
    assert all(re.fullmatch(r"[a-z]{3,6} [0-9]{2}", h.result().text) for h in handles)
    assert grammars.compiled == before + 1
