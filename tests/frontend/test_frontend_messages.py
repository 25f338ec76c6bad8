"""Bad input gets a typed error (doctrine 3, docs/rules.md); tool calls are normalised (REC-3)."""
from __future__ import annotations

import pytest

from ninfer_jax.frontend import (FrontendError, InputTooLongError, MalformedInputError, MalformedToolCallError,
                                 UnknownRoleError, UnsupportedContentError)

USER = {"role": "user", "content": "What is the weather?"}


def _call(arguments, **extra):
    return {"role": "assistant", "content": None,
            "tool_calls": [dict({"id": "c1", "type": "function",
                                 "function": {"name": "get_weather", "arguments": arguments}}, **extra)]}


def test_unknown_role_is_a_typed_error(frontend):
    with pytest.raises(UnknownRoleError, match="function"):
        frontend.render_chat([{"role": "function", "content": "x"}])
    with pytest.raises(UnknownRoleError):
        frontend.render_chat([{"content": "no role"}])


@pytest.mark.parametrize("message", [
    _call("{not json"),
    _call("[1, 2]"),
    _call(7),
    {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {"arguments": "{}"}}]},
    {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {"name": "f"}}]},
    {"role": "assistant", "content": None, "tool_calls": [{"type": "retrieval", "function": {"name": "f", "arguments": {}}}]},
    {"role": "assistant", "content": None, "tool_calls": "get_weather()"},
    {"role": "assistant", "content": None, "tool_calls": ["get_weather()"]},
])
def test_malformed_tool_call_is_a_typed_error(frontend, message):
    with pytest.raises(MalformedToolCallError):
        frontend.render_chat([USER, message])


def test_tool_messages_must_answer_a_tool_call(frontend):
    with pytest.raises(MalformedToolCallError):
        frontend.render_chat([USER, {"role": "tool", "content": "sunny"}])
    with pytest.raises(MalformedToolCallError, match="c9"):
        frontend.render_chat([USER, _call("{}"), {"role": "tool", "tool_call_id": "c9", "content": "sunny"}])
    with pytest.raises(MalformedToolCallError):
        frontend.render_chat([USER], tools=[{"type": "function", "function": {"description": "no name"}}])


def test_malformed_messages_are_typed_errors(frontend):
    for bad in ([], "hello", [["user", "hi"]], [{"role": "user", "content": None}],
                [{"role": "user", "content": 3}], [{"role": "user", "content": [{"type": "text"}]}],
                [{"role": "assistant", "content": None}],
                [{"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}]):
        with pytest.raises(MalformedInputError):
            frontend.render_chat(bad)
    with pytest.raises(UnsupportedContentError):
        frontend.render_chat([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])
    with pytest.raises(MalformedInputError):
        frontend.render_chat([USER], template_kwargs={"messages": []})


def test_over_long_input_is_a_typed_error(tokenizer):
    from ninfer_jax.frontend import ChatFrontend
    front = ChatFrontend(tokenizer, max_input_tokens=32, max_input_chars=2000)
    assert front.render_chat([{"role": "user", "content": "hi"}]).prompt_tokens <= 32
    with pytest.raises(InputTooLongError) as info:
        front.render_chat([{"role": "user", "content": "hello world " * 20}])
    assert info.value.limit == 32 and info.value.length > 32
    with pytest.raises(InputTooLongError):
        front.render_chat([{"role": "user", "content": "x" * 5000}])
    with pytest.raises(InputTooLongError):
        front.prepare_prompt(list(range(33)))
    with pytest.raises(MalformedInputError):
        front.prepare_prompt([1024])
    with pytest.raises(MalformedInputError):
        front.prepare_prompt("")
    assert issubclass(InputTooLongError, FrontendError) and issubclass(MalformedToolCallError, FrontendError)


def test_rec3_tool_call_arguments_are_normalised_whatever_their_spacing(frontend):
    a = frontend.render_chat([USER, _call('{"city":"Paris"}'), {"role": "tool", "content": "sunny"}])
    b = frontend.render_chat([USER, _call('{ "city" : "Paris" }'), {"role": "tool", "content": "sunny"}])
    c = frontend.render_chat([USER, _call({"city": "Paris"}), {"role": "tool", "content": "sunny"}])
    assert a.token_ids == b.token_ids == c.token_ids
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in a.text


def test_tool_responses_group_into_one_user_turn(frontend):
    two = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": {}}},
        {"id": "b", "type": "function", "function": {"name": "g", "arguments": {}}}]}
    p = frontend.render_chat([USER, two, {"role": "tool", "tool_call_id": "a", "content": "1"},
                              {"role": "tool", "tool_call_id": "b", "content": "2"}])
    assert "<|im_start|>user\n<tool_response>\n1\n</tool_response>\n<tool_response>\n2\n</tool_response><|im_end|>" in p.text
    # The first tool message does not end on a message boundary of its own.
    assert p.response_replay.message_index == 3
