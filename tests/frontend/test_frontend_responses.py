"""Responses-style input over a stored history (SH-5)."""
from __future__ import annotations

import pytest

from ninfer_jax.frontend import (ContentBoundary, MalformedInputError, MalformedToolCallError, ResponsesStore,
                                 UnknownResponseError)


def _answer(text):
    return [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}]


def test_sh5_history_is_expanded_and_normalised_before_the_marker_policy(frontend, tokenizer):
    store = ResponsesStore()
    first = frontend.render_responses("Tell me a story.", store=store, instructions="Be brief.")
    store.put("r1", input_items=first.raw_input, output_items=_answer("Once upon a time."))
    second = frontend.render_responses([{"role": "user", "content": [{"type": "input_text", "text": "More."}]}],
                                       store=store, previous_response_id="r1", instructions="Be brief.")
    p = second.prompt
    assert [m["role"] for m in p.messages] == ["system", "user", "assistant", "user"]
    assert p.messages[2]["content"] == [{"type": "text", "text": "Once upon a time."}]
    # The policy runs on the expanded, normalised input: one automatic marker, at the new end.
    (auto,) = p.markers
    assert auto.automatic == (ContentBoundary(3, 0),)
    assert tokenizer.decode(p.token_ids[: auto.frontier]).endswith("More.")
    # The first turn's recovery position and marker are real prefixes of the second prompt.
    assert first.prompt.recovery_position.identity.matches(p.token_ids)
    assert first.prompt.markers[0].identity.matches(p.token_ids)


def test_sh5_stored_raw_input_carries_no_new_automatic_marker(frontend):
    store = ResponsesStore()
    raw = [{"role": "user", "content": "Tell me a story."}]
    first = frontend.render_responses(raw, store=store)
    assert first.prompt.markers[0].is_automatic
    assert first.raw_input == ({"role": "user", "content": "Tell me a story."},)
    store.put("r1", input_items=first.raw_input, output_items=_answer("Once."))
    assert store.get("r1").input_items == first.raw_input
    assert "cache_control" not in repr(store.get("r1"))
    # Later turns therefore see only their own automatic marker, never the stored one.
    second = frontend.render_responses("Again.", store=store, previous_response_id="r1")
    assert [m.automatic for m in second.prompt.markers] == [(ContentBoundary(2, 0),)]


def test_sh5_explicit_markers_belong_to_their_request(frontend):
    store = ResponsesStore()
    marked = [{"role": "user", "content": [{"type": "input_text", "text": "Long context.", "cache_control": {"type": "ephemeral"}}]}]
    first = frontend.render_responses(marked, store=store, marker_policy="none")
    assert [m.explicit for m in first.prompt.markers] == [(ContentBoundary(0, 0),)]
    store.put("r1", input_items=first.raw_input, output_items=_answer("Ok."))
    assert store.get("r1").input_items[0]["content"][0]["cache_control"] == {"type": "ephemeral"}  # kept raw
    second = frontend.render_responses("Next.", store=store, previous_response_id="r1", marker_policy="none")
    assert second.prompt.markers == ()


def test_sh5_function_calls_reasoning_and_outputs_normalise_into_chat_messages(frontend):
    store = ResponsesStore()
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    first = frontend.render_responses("Weather in Paris?", store=store, tools=tools)
    store.put("r1", input_items=first.raw_input, output_items=[
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Call the tool."}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'}])
    second = frontend.render_responses([{"type": "function_call_output", "call_id": "c1", "output": "sunny"}],
                                       store=store, previous_response_id="r1", tools=tools)
    msgs = second.prompt.messages
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool"]
    assert msgs[1]["reasoning_content"] == "Call the tool."
    assert msgs[1]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": {"city": "Paris"}}
    assert "<think>\nCall the tool.\n</think>" in second.prompt.text
    assert second.prompt.typed_rewrite_point.kind.value == "TurnClosure"


def test_sh5_store_errors_and_bound():
    store = ResponsesStore(max_responses=2)
    with pytest.raises(UnknownResponseError):
        store.history("missing")
    with pytest.raises(UnknownResponseError):
        store.put("r2", input_items=[], output_items=[], previous_response_id="missing")
    for k in range(3):
        store.put(f"r{k}", input_items=[{"role": "user", "content": str(k)}], output_items=[])
    assert len(store) == 2 and "r0" not in store and "r2" in store


def test_sh5_malformed_items_are_typed_errors(frontend):
    store = ResponsesStore()
    with pytest.raises(UnknownResponseError):
        frontend.render_responses("hi", store=store, previous_response_id="nope")
    with pytest.raises(MalformedInputError):
        frontend.render_responses([{"type": "web_search_call"}], store=store)
    with pytest.raises(MalformedToolCallError):
        frontend.render_responses([{"type": "function_call", "name": "f"}], store=store)
    with pytest.raises(MalformedInputError):
        frontend.render_responses(42, store=store)
