"""Responses-style input over a stored history (SH-5); the store's bounds, expiry and
persistence; truncation of a conversation over the input limit."""
from __future__ import annotations

import pytest

from ninfer_jax.frontend import (ChatFrontend, ContentBoundary, InputTooLongError, MalformedInputError,
                                 MalformedToolCallError, ResponsesStore, UnknownResponseError)
from ninfer_jax.frontend.errors import EvictedResponseError, ExpiredResponseError


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


# --- the store's bounds, expiry and persistence -----------------------------------------------
class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def _put(store, rid, text="x", previous=None):
    return store.put(rid, input_items=[{"role": "user", "content": text}], output_items=_answer("ok"),
                     previous_response_id=previous, response={"id": rid, "object": "response", "output": []})


def test_store_byte_budget_evicts_the_least_recently_used_with_a_typed_error(caplog):
    size = _put(ResponsesStore(), "r0").size  # every record here is the same size
    store = ResponsesStore(100, max_bytes=2 * size + size // 2)
    _put(store, "r0"), _put(store, "r1")
    store.get("r0")  # used: r1 is now the least recently used
    _put(store, "r2")
    assert len(store) == 2 and store.bytes <= store.max_bytes and "r1" not in store
    with pytest.raises(EvictedResponseError, match="r1.*evicted.*100 responses and .* bytes"):
        store.get("r1")
    with pytest.raises(EvictedResponseError, match="evicted"):
        _put(store, "r3", previous="r1")  # a chain onto it names why it is gone
    # One response larger than the whole budget is not stored at all, and says so later.
    with caplog.at_level("WARNING", logger="ninfer.frontend.responses"):
        assert _put(store, "big", "y" * (3 * size)) is None
    assert "big" in caplog.text and "not stored" in caplog.text
    with pytest.raises(EvictedResponseError, match="not stored: its .* bytes exceed the whole store budget"):
        store.history("big")
    assert sorted(store._items) == ["r0", "r2"]  # nothing else was evicted to make room
    # The count bound is a budget too.
    counted = ResponsesStore(1)
    _put(counted, "a"), _put(counted, "b")
    with pytest.raises(EvictedResponseError, match="at most 1 responses"):
        counted.get("a")


def test_store_expiry_with_an_injected_clock():
    clock = Clock()
    store = ResponsesStore(ttl_s=10, clock=clock)
    _put(store, "r1")
    clock.now += 6
    _put(store, "r2", previous="r1")
    assert [m["content"] for m in store.history("r2") if m.get("role") == "user"] == ["x", "x"]
    clock.now += 5  # r1 is 11 s old, r2 5 s
    assert "r1" not in store and "r2" in store and len(store) == 1
    with pytest.raises(ExpiredResponseError, match="r1.*expired 10 s after it was stored"):
        store.get("r1")
    with pytest.raises(ExpiredResponseError):
        store.history("r2")  # its parent is gone: the chain cannot be expanded
    clock.now += 5
    with pytest.raises(ExpiredResponseError, match="r2"):
        store.get("r2")
    with pytest.raises(UnknownResponseError, match="unknown response id"):
        store.get("never")


def test_store_deletion_is_an_unknown_response_afterwards(tmp_path):
    store = ResponsesStore(directory=tmp_path)
    _put(store, "r1")
    assert (tmp_path / "r1.json").exists()
    store.delete("r1")
    assert not (tmp_path / "r1.json").exists()
    with pytest.raises(UnknownResponseError, match="deleted") as info:
        store.get("r1")
    assert type(info.value) is UnknownResponseError
    with pytest.raises(UnknownResponseError):
        store.delete("r1")


def test_store_persists_chains_across_a_restart_and_skips_unreadable_files(tmp_path, caplog):
    clock = Clock()
    store = ResponsesStore(3, directory=tmp_path, ttl_s=100, clock=clock)
    for rid, previous in (("odd/id:1", None), ("r1", None), ("r2", "r1")):  # any id: the file name is quoted
        clock.now += 1
        _put(store, rid, rid, previous=previous)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["odd%2Fid%3A1.json", "r1.json", "r2.json"]  # no temp file
    (tmp_path / "garbage.json").write_text("{not json")
    (tmp_path / "wrong.json").write_text('{"version": 1, "response_id": "other"}')
    with caplog.at_level("WARNING", logger="ninfer.frontend.responses"):
        again = ResponsesStore(3, directory=tmp_path, ttl_s=100, clock=clock)
    assert "garbage.json" in caplog.text and "wrong.json" in caplog.text
    assert again.get("odd/id:1").input_items[0]["content"] == "odd/id:1"
    assert again.history("r2") == store.history("r2")  # used after odd/id:1: odd/id:1 is the least recent
    assert again.get("r2").response == {"id": "r2", "object": "response", "output": []}
    assert again.bytes == store.bytes
    # The least recently used (the oldest stored, after a restart) is evicted, with its file.
    clock.now += 1
    _put(again, "r3", previous="r2")
    assert not (tmp_path / "odd%2Fid%3A1.json").exists() and (tmp_path / "r3.json").exists()
    # A restart with a smaller budget applies it.
    small = ResponsesStore(2, directory=tmp_path, ttl_s=100, clock=clock)
    assert len(small) == 2 and not (tmp_path / "r1.json").exists()
    # The time stored is kept: a restart does not renew the expiry.
    clock.now += 100
    with pytest.raises(ExpiredResponseError):
        ResponsesStore(directory=tmp_path, ttl_s=100, clock=clock).get("r3")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["garbage.json", "wrong.json"]


# --- truncation -----------------------------------------------------------------------------------
def test_truncation_auto_drops_the_oldest_turns_keeping_instructions_and_the_newest(tokenizer):
    store = ResponsesStore()
    wide = ChatFrontend(tokenizer)
    turns = [f"Question {k}: " + "tell me more about the sea " * 8 for k in range(6)]
    prev = None
    for k, text in enumerate(turns[:-1]):
        rendered = wide.render_responses(text, store=store, previous_response_id=prev, instructions="Be brief.")
        store.put(f"r{k}", input_items=rendered.raw_input, output_items=_answer(f"Answer {k}."),
                  previous_response_id=prev)
        prev = f"r{k}"
    whole = wide.render_responses(turns[-1], store=store, previous_response_id=prev, instructions="Be brief.")
    limit = whole.prompt.prompt_tokens * 3 // 5
    narrow = ChatFrontend(tokenizer, max_input_tokens=limit)
    with pytest.raises(InputTooLongError):
        narrow.render_responses(turns[-1], store=store, previous_response_id=prev, instructions="Be brief.")
    cut = narrow.render_responses(turns[-1], store=store, previous_response_id=prev, instructions="Be brief.",
                                  truncation="auto")
    msgs = cut.prompt.messages
    assert cut.prompt.prompt_tokens <= limit and cut.dropped_messages > 0 and cut.dropped_messages % 2 == 0
    assert msgs[0]["content"] == "Be brief." and msgs[-1]["content"] == turns[-1]
    kept = [m["content"] for m in msgs if m["role"] == "user"]
    assert kept == turns[-len(kept):] and len(kept) < len(turns)
    # The fewest turns dropped: one more turn would not fit.
    more = [{"role": "system", "content": "Be brief."}] + list(whole.prompt.messages[cut.dropped_messages - 1:])
    with pytest.raises(InputTooLongError):
        narrow.render_chat(more)
    # Not even the newest turn fits: still a typed error.
    with pytest.raises(InputTooLongError, match="even with only the instructions and the newest turn"):
        ChatFrontend(tokenizer, max_input_tokens=20).render_responses(
            turns[-1], store=store, previous_response_id=prev, instructions="Be brief.", truncation="auto")
    with pytest.raises(MalformedInputError):
        wide.render_responses("hi", store=store, truncation="sometimes")
