"""Round trip with Qwen3.5's released chat template (issue 36).

`fixtures/qwen3_5_chat_template.jinja` is the chat template the Qwen3.5 checkpoints ship
(Qwen/Qwen3.5-35B-A3B's chat_template.jinja, Apache-2.0), kept verbatim as test data: the
engine's renderer must render it as transformers does, and an assistant message the output
parser returns must render back, next turn, to what the model generated. Its tool calls are in
the XML form (`<function=NAME>` / `<parameter=KEY>`); it trims content and reasoning, and it
drops the reasoning of turns before the last user query: those are the only losses, the
template's own.
"""
from __future__ import annotations

import pathlib

import pytest

from ninfer_jax.frontend import parse_assistant_output
from ninfer_jax.frontend.chat import ChatFrontend
from ninfer_jax.frontend.output_parser import OutputStream

TEMPLATE = (pathlib.Path(__file__).parent / "fixtures" / "qwen3_5_chat_template.jinja").read_text()
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                                    "units": {"type": "object"}}}}}


@pytest.fixture(scope="module")
def frontend(tokenizer):
    return ChatFrontend(tokenizer, TEMPLATE)


def _call(name, **params) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


# What a Qwen3.5 model writes after the generation prompt's `<think>\n`.
AGENT_TURNS = [
    "The user wants the weather.\n</think>\n\n" + _call("get_weather", city="Paris"),
    "Two cities.\n</think>\n\nChecking both.\n\n" + _call("get_weather", city="Oslo", days=3) + "\n"
    + _call("get_weather", city="Rome", units='{"temp": "C", "wind": ["km/h"]}'),
    "Multi-line.\n</think>\n\n" + _call("get_weather", city="New\nYork", days="true"),
]


def test_the_template_renders_as_transformers_renders_it(frontend, tokenizer):
    from transformers.utils.chat_template_utils import render_jinja_template

    msg = parse_assistant_output(AGENT_TURNS[1]).as_message()
    conv = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"}, msg,
            {"role": "tool", "content": "sunny"}, {"role": "tool", "content": "rain"}]
    for kwargs in ({}, {"enable_thinking": False}):
        ours = frontend.render_chat(conv, tools=[WEATHER], template_kwargs=kwargs).text
        theirs, _ = render_jinja_template([conv], tools=[WEATHER], chat_template=TEMPLATE,
                                          add_generation_prompt=True, **kwargs)
        assert ours == theirs[0]


@pytest.mark.parametrize("generated", AGENT_TURNS)
def test_an_agent_turn_renders_back_to_the_generated_text(frontend, generated):
    """Tool calls then their results: the call turn follows the last user query, so the template
    keeps its reasoning, and the next prompt starts with this prompt + the generated text."""
    history = [{"role": "user", "content": "Weather?"}]
    first = frontend.render_chat(history, tools=[WEATHER])
    assert first.text.endswith("<|im_start|>assistant\n<think>\n")
    parsed = parse_assistant_output(generated)
    assert parsed.tool_calls and "<tool_call>" not in parsed.content
    follow = [{"role": "tool", "tool_call_id": c["id"], "content": "sunny"} for c in parsed.tool_calls]
    nxt = frontend.render_chat(history + [parsed.as_message()] + follow, tools=[WEATHER])
    assert nxt.text.startswith(first.text + generated + "<|im_end|>\n"), nxt.text[len(first.text):]
    exact = list(first.token_ids) + list(frontend.tokenizer.encode(generated + "<|im_end|>"))
    assert list(nxt.token_ids[:len(exact)]) == exact


def test_xml_arguments_keep_their_values_and_the_text_they_were():
    args = parse_assistant_output(AGENT_TURNS[1]).tool_calls[1]["function"]["arguments"]
    assert args == {"city": "Rome", "units": {"temp": "C", "wind": ["km/h"]}}
    first = parse_assistant_output(AGENT_TURNS[1]).tool_calls[0]["function"]["arguments"]
    assert first == {"city": "Oslo", "days": 3}
    # `true` would render back as Python's `True`: it stays the text the model wrote
    assert parse_assistant_output(AGENT_TURNS[2]).tool_calls[0]["function"]["arguments"] == {
        "city": "New\nYork", "days": "true"}


def test_a_stream_gives_the_same_message(frontend):
    for generated in AGENT_TURNS:
        stream = OutputStream(think_open=True)
        reasoning = content = ""
        for i in range(0, len(generated), 3):
            c, r = stream.push(generated[i:i + 3])
            content, reasoning = content + c, reasoning + r
        c, r, calls = stream.finish()
        whole = parse_assistant_output(generated)
        assert (content + c, reasoning + r, calls) == (whole.content, whole.reasoning_content, whole.tool_calls)


def test_what_the_template_itself_drops_is_all_that_is_lost(frontend):
    """A reply followed by a new user query: the template drops that reply's reasoning (and,
    with `enable_thinking: false`, its empty think block) and trims its content. The next prompt
    still starts with everything before the reply, and with the reply's content as generated."""
    history = [{"role": "user", "content": "Hi"}]
    for kwargs, generated in (({}, "Greeting.\n</think>\n\nHello there!"),
                              ({"enable_thinking": False}, "Hello there!")):
        first = frontend.render_chat(history, template_kwargs=kwargs)
        msg = parse_assistant_output(generated, reasoning=not kwargs).as_message()
        nxt = frontend.render_chat(history + [msg, {"role": "user", "content": "Thanks"}], template_kwargs=kwargs)
        head = first.text[:first.text.rindex("<|im_start|>assistant\n")]
        assert nxt.text.startswith(head + "<|im_start|>assistant\nHello there!<|im_end|>\n<|im_start|>user\nThanks")
        assert not nxt.text.startswith(first.text)  # the think block the template drops


def test_tool_choice_grammar_takes_the_xml_form_and_nothing_else(tokenizer):
    """With this template, `tool_choice` required / named holds the output to the XML form the
    parser reads (engine/grammar.py `tool_call_form_of`), each parameter to its schema."""
    from ninfer_jax.engine.grammar import Grammars, StructuredOutput, tool_call_form_of

    assert tool_call_form_of(TEMPLATE) == "xml" and tool_call_form_of(tokenizer.chat_template) == "json"
    grammars = Grammars(tokenizer.backend.to_str(), tokenizer.vocab_size, [tokenizer.encode("<|im_end|>")[0]],
                        {t.content: t.id for t in tokenizer.added_tokens}, tool_call_form="xml")
    tool = dict(WEATHER["function"], parameters=dict(WEATHER["function"]["parameters"], required=["city"]))
    so = StructuredOutput("tool_calls", {"tools": [{"type": "function", "function": tool}], "name": None})

    def accepts(text: str) -> bool:
        m = grammars.matcher(so)
        for t in tokenizer.encode(text):
            if not m.allowed()[t]:
                return False
            m.consume(t)
        return m.accepting()

    good = [_call("get_weather", city="Paris"), _call("get_weather", city="New\nYork", days=3),
            _call("get_weather", city="Oslo", units='{"temp": "C"}') + "\n" + _call("get_weather", city="Rome")]
    for text in good:
        assert accepts(text), text
        assert parse_assistant_output(text, reasoning=False).tool_calls  # what the parser reads back
    for text in (_call("get_weather", days=3),  # the required city is missing
                 _call("get_weather", city="Paris", days="soon"),  # not an integer
                 _call("get_time", city="Paris"),  # no such tool
                 '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'):  # JSON form
        assert not accepts(text), text
