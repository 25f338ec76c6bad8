"""Round trip (issue 36): the assistant message a client gets back renders, next turn, to exactly
the text that was generated, so turn N+1's prompt starts with turn N's prompt + generated tokens.

The parser takes out only the structure (reasoning, tool calls) and the separators the template
writes back around it; the content keeps its own newlines. `ninfer chat` (in process) builds its
history with `trace_replay.assistant_message`, HTTP and gRPC with the same parser
(tests/server/test_http_openai.py, tests/server/test_server_engine.py drive those).
"""
from __future__ import annotations

import pytest

from ninfer_jax import Engine, EngineConfig, SamplingParams
from ninfer_jax.bench.trace_replay import assistant_message
from ninfer_jax.frontend import parse_assistant_output
from ninfer_jax.frontend.chat import ChatFrontend

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string"}}}}}


@pytest.fixture(scope="module")
def engine():
    e = Engine(EngineConfig(max_concurrency=2, max_context=512, chunk_size=64, progress=False))
    yield e
    e.close()


@pytest.mark.parametrize("user", ["Hi there", "What is the weather in Paris?", "List three fruits.", "hello\n\n"])
@pytest.mark.parametrize("max_tokens", [5, 40])
def test_ninfer_chat_history_renders_the_generated_tokens_back(engine, user, max_tokens):
    history = [{"role": "user", "content": user}]
    done = engine.chat(history, sampling=SamplingParams(temperature=0, max_tokens=max_tokens))
    msg = assistant_message(engine.tokenizer, done.token_ids)
    nxt = engine.chat_frontend().render_chat(history + [msg, {"role": "user", "content": "ok"}])
    exact = list(done.prompt_token_ids) + list(done.token_ids)
    assert list(nxt.token_ids[:len(exact)]) == exact, (done.text, msg)


# Generated texts with structure, as a Qwen3-style model writes them.
STRUCTURED = [
    "\nJust text.\n\n",
    "<think>\nThe user wants weather.\n</think>\n\nChecking.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "<think>\n\nTwo blank lines.\n\n</think>\n\n\nAnswer with a leading newline.\n",
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n<tool_call>\n'
    '{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>',
    "Before.\n\n<tool_call>\n{broken json\n</tool_call>\n",
]


@pytest.mark.parametrize("generated", STRUCTURED)
def test_structured_output_renders_back_verbatim_with_the_builtin_template(engine, generated):
    """The built-in template renders content verbatim, `<think>\\n…\\n</think>\\n\\n` around the
    reasoning of the last turn and one newline before each call: the next turn's text (its tool
    results, or nothing, follow: the reasoning stays) starts with the prompt + the generated text, character for
    character."""
    frontend = engine.chat_frontend()
    history = [{"role": "user", "content": "Weather?"}]
    first = frontend.render_chat(history, tools=[WEATHER])
    msg = parse_assistant_output(generated).as_message()
    follow = [{"role": "tool", "tool_call_id": c["id"], "content": "sunny"} for c in msg.get("tool_calls", [])]
    # Nothing after a reply without calls: a later user turn would drop its reasoning (the template's rule).
    nxt = frontend.render_chat(history + [msg] + follow, tools=[WEATHER])
    assert nxt.text.startswith(first.text + generated + "<|im_end|>"), (msg, nxt.text[len(first.text):])


# A Qwen3-style template that normalises what it renders (written for this test, not a released
# file): the reasoning stripped of newlines, the content after it left-stripped.
NORMALISING = """{%- for message in messages -%}
{%- if message.role == 'user' -%}{{- '<|im_start|>user\\n' ~ message.content ~ '<|im_end|>\\n' -}}
{%- elif message.role == 'assistant' -%}
{{- '<|im_start|>assistant\\n' -}}
{%- if message.reasoning_content -%}
{{- '<think>\\n' ~ message.reasoning_content.strip('\\n') ~ '\\n</think>\\n\\n' ~ message.content.lstrip('\\n') -}}
{%- else -%}{{- message.content -}}{%- endif -%}
{{- '<|im_end|>\\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"""


def test_a_normalising_template_loses_only_what_it_strips(engine):
    frontend = ChatFrontend(engine.tokenizer, NORMALISING)
    history = [{"role": "user", "content": "Why?"}]
    first = frontend.render_chat(history)
    for generated, exact in (("<think>\nBecause.\n</think>\n\nSo.", True),  # its normal form: whole
                             ("<think>\n\nBecause.\n</think>\n\n\nSo.", False)):  # it strips these newlines
        msg = parse_assistant_output(generated).as_message()
        text = frontend.render_chat(history + [msg]).text
        assert text.startswith(first.text + generated) is exact
        assert text.startswith(first.text + "<think>\nBecause.\n</think>\n\nSo.<|im_end|>\n")
