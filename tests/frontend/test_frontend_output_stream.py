"""The streaming output parser emits exactly the final parse, in order, never taking text back."""
from __future__ import annotations

import random

import pytest

from ninfer_jax.frontend.output_parser import OutputStream, parse_assistant_output

FRAGMENTS = ["Hello", " world", "\n", "\n\n", "<think>", "</think>", "plan a", "<tool_call>",
             "</tool_call>", '{"name": "get_weather", "arguments": {"city": "Paris"}}', "{bad json",
             "<", "</", "<tool", "done.", "é", "x < y", "<thin"]


def _stream(text: str, cuts: list[int], think_open: bool = False, tools: bool = True):
    s = OutputStream(think_open=think_open, tool_calls=tools)
    content, reasoning = [], []
    last = 0
    for cut in cuts + [len(text)]:
        c, r = s.push(text[last:cut])
        content.append(c)
        reasoning.append(r)
        last = cut
    c, r, calls = s.finish()
    return "".join(content) + c, "".join(reasoning) + r, calls, s


@pytest.mark.parametrize("seed", range(300))
def test_stream_deltas_add_up_to_the_final_parse(seed):
    rng = random.Random(seed)
    think_open, tools = seed % 5 == 0, seed % 7 != 0
    text = "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 14)))
    cuts = sorted(rng.sample(range(len(text) + 1), min(len(text), rng.randint(0, 8))))
    content, reasoning, calls, s = _stream(text, cuts, think_open, tools)
    want = s.parsed()
    assert content == want.content
    assert reasoning == (want.reasoning_content or "")
    assert calls == want.tool_calls
    # One character at a time gives the same answer.
    assert _stream(text, list(range(len(text))), think_open, tools)[:3] == (content, reasoning, calls)
    assert tools or not calls


def test_plain_text_streams_as_it_comes():
    s = OutputStream()
    assert s.push("Hello") == ("Hello", "")
    assert s.push(" wor") == (" wor", "")
    assert s.push("ld\n") == ("ld", "")  # a trailing newline waits for what follows it
    assert s.push("<tool") == ("", "")   # may open a tool call
    assert s.push('_call>{"name": "f", "arguments": {}}') == ("", "")
    assert s.push("</tool_call>") == ("", "")
    content, reasoning, calls = s.finish()
    assert (content, reasoning) == ("", "") and calls[0]["function"]["name"] == "f"


def test_reasoning_is_released_when_it_closes():
    s = OutputStream()
    assert s.push("<think>\nstep 1") == ("", "")
    assert s.push("</think>\n\nAnswer") == ("Answer", "step 1")
    assert s.finish()[:2] == ("", "")
    assert parse_assistant_output("<think>\nstep 1</think>\n\nAnswer").reasoning_content == "step 1"
