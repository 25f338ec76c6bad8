"""Generated text back into a structured assistant message (the SCN-1 round trip)."""
from __future__ import annotations

from ninfer_jax.frontend import parse_assistant_output


def test_parse_reasoning_content_and_tool_calls():
    out = parse_assistant_output('<think>\nNeed weather.\n</think>\n\nChecking.\n<tool_call>\n'
                                 '{"name": "get_weather", "arguments": {"city":"Paris"}}\n</tool_call>')
    assert out.reasoning_content == "Need weather." and out.content == "Checking."
    assert out.tool_calls == ({"type": "function", "id": "call_0",
                               "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},)


def test_invalid_tool_call_block_stays_in_content():
    out = parse_assistant_output("Hi <tool_call>{broken</tool_call>")
    assert out.tool_calls == () and out.content == "Hi <tool_call>{broken</tool_call>"
    assert out.as_message() == {"role": "assistant", "content": "Hi <tool_call>{broken</tool_call>"}


def test_scn1_parsed_call_renders_in_normalised_form(frontend):
    user = [{"role": "user", "content": "Weather in Paris?"}]
    first = frontend.render_chat(user)
    generated = '<tool_call>\n{"name": "get_weather", "arguments": {"city":"Paris"}}\n</tool_call>'
    msg = parse_assistant_output(generated).as_message()
    nxt = frontend.render_chat(user + [msg, {"role": "tool", "tool_call_id": "call_0", "content": "sunny"}])
    assert '{"city": "Paris"}' in nxt.text and generated not in nxt.text
    assert first.recovery_position.identity.matches(nxt.token_ids)
