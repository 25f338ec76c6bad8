"""Cache markers resolved to exact frontiers (SH-2..7)."""
from __future__ import annotations

import pytest

from ninfer_jax.frontend import (ChatFrontend, ContentBoundary, MarkerError, MarkerPolicy, MessageBoundary,
                                 ToolsBoundary)

TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}
CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Tell me a story about the sea."},
    {"role": "assistant", "content": "Once upon a time there was a boat."},
    {"role": "user", "content": "Tell me more."},
]


def _text_before(p, frontier, tokenizer):
    return tokenizer.decode(p.token_ids[:frontier])


def test_sh2_explicit_markers_resolve_merge_equal_and_come_in_order(frontend):
    p = frontend.render_chat(CONVERSATION, marker_policy="none",
                             cache_markers=[{"message": 3}, {"message": 0}, MessageBoundary(-1), {"message": 1, "part": 0}])
    frontiers = [m.frontier for m in p.markers]
    assert frontiers == sorted(frontiers) and len(frontiers) == 3
    last = p.markers[-1]
    assert last.explicit == (MessageBoundary(3), MessageBoundary(3)) and not last.is_automatic
    for m in p.markers:
        assert m.identity.frontier == m.frontier and m.identity.tokens == p.token_ids[: m.frontier]


def test_sh2_more_than_four_markers_is_a_typed_error(frontend):
    with pytest.raises(MarkerError):
        frontend.render_chat(CONVERSATION, cache_markers=[{"message": i % 4} for i in range(5)])
    with pytest.raises(MarkerError):
        frontend.render_chat(CONVERSATION, cache_markers=[{"message": 9}])
    with pytest.raises(MarkerError):
        frontend.render_chat(CONVERSATION, cache_markers=[{"message": 0, "part": 3}])
    with pytest.raises(MarkerError):
        frontend.render_chat(CONVERSATION, cache_markers=[{"bogus": 1}])


def test_sh2_cache_control_hints_become_explicit_markers(frontend, tokenizer):
    messages = [dict(CONVERSATION[0], cache_control={"type": "ephemeral"}),
                {"role": "user", "content": [{"type": "text", "text": "Tell me a story.", "cache_control": {"type": "ephemeral"}},
                                             {"type": "text", "text": " About the sea."}]}]
    p = frontend.render_chat(messages, tools=[dict(TOOL, cache_control={"type": "ephemeral"})], marker_policy="none")
    kinds = sorted(type(s).__name__ for m in p.markers for s in m.explicit)
    assert kinds == ["ContentBoundary", "MessageBoundary", "ToolsBoundary"]
    story = [m for m in p.markers if ContentBoundary(1, 0) in m.explicit][0]
    assert _text_before(p, story.frontier, tokenizer).endswith("Tell me a story.")
    assert "cache_control" not in p.text


def test_sh3_automatic_marker_is_the_end_of_the_last_cacheable_source_part(frontend, tokenizer):
    p = frontend.render_chat(CONVERSATION)
    (auto,) = p.markers
    assert auto.automatic == (ContentBoundary(3, 0),) and auto.explicit == ()
    assert _text_before(p, auto.frontier, tokenizer).endswith("Tell me more.")


def test_sh3_structured_tool_call_uses_its_message_boundary(frontend, tokenizer):
    call = {"role": "assistant", "content": "Let me look.",
            "tool_calls": [{"type": "function", "function": {"name": "lookup", "arguments": {}}}]}
    p = frontend.render_chat(CONVERSATION[:2] + [call], tools=[TOOL], add_generation_prompt=False)
    (auto,) = p.markers
    assert auto.automatic == (MessageBoundary(2),)
    assert _text_before(p, auto.frontier, tokenizer).endswith("</tool_call><|im_end|>\n")
    # An empty tool result has no boundary of its own: the tool call's message boundary serves.
    result = {"role": "tool", "content": ""}
    q = frontend.render_chat(CONVERSATION[:2] + [call, result], tools=[TOOL])
    assert q.markers[0].automatic == (MessageBoundary(2),)


def test_sh3_tools_boundary_when_there_is_no_message_content(frontend, tokenizer):
    p = frontend.render_chat([{"role": "user", "content": ""}], tools=[TOOL, dict(TOOL, function={"name": "other"})])
    (auto,) = p.markers
    assert auto.automatic == (ToolsBoundary(1),)
    assert _text_before(p, auto.frontier, tokenizer).endswith('{"type": "function", "function": {"name": "other"}}')


def test_sh3_earlier_source_part_is_reused_while_its_token_prefix_agrees(frontend):
    first = frontend.render_chat(CONVERSATION[:2])
    grown = frontend.render_chat(CONVERSATION)
    assert first.markers[0].identity.matches(grown.token_ids)
    assert grown.markers[0].frontier > first.markers[0].frontier


def test_sh7_appending_that_changes_the_bpe_tail_token_invalidates_a_source_part_position(frontend, tokenizer):
    first = frontend.render_chat([{"role": "user", "content": "Call the funct"}])
    grown = frontend.render_chat([{"role": "user", "content": "Call the function"}])
    marker = first.markers[0]
    char = len(first.text[: first.text.index("Call the funct") + len("Call the funct")])
    assert grown.text[:char] == first.text[:char]  # the characters still agree ...
    assert not marker.identity.matches(grown.token_ids)  # ... the tokens do not: " f"+"un"+"ct" vs " function"
    # Inside one request: a part whose end the next part's text merges into is no frontier.
    split = frontend.render_chat([{"role": "user", "content": [{"type": "text", "text": "Call the funct"},
                                                               {"type": "text", "text": "ion, please."}]}],
                                 cache_markers=[{"message": 0, "part": 0}])
    (rejected,) = split.rejected_markers
    assert rejected.spec == ContentBoundary(0, 0) and "exact token frontier" in rejected.reason
    assert [m.automatic for m in split.markers] == [(ContentBoundary(0, 1),)]


def test_sh7_automatic_marker_walks_back_to_an_earlier_exact_source_part(frontend, tokenizer):
    template = frontend.template.source.replace(
        "render_content(message.content) ~ '<|im_end|>", "render_content(message.content) ~ 'ion<|im_end|>")
    front = ChatFrontend(tokenizer, template)
    p = front.render_chat([{"role": "user", "content": [{"type": "text", "text": "First part."},
                                                        {"type": "text", "text": " call the funct"}]}])
    (auto,) = p.markers
    assert auto.automatic == (ContentBoundary(0, 0),)
    assert _text_before(p, auto.frontier, tokenizer).endswith("First part.")


def test_sh4_automatic_marker_merges_with_an_equal_explicit_marker(frontend):
    p = frontend.render_chat(CONVERSATION, cache_markers=[{"message": 3, "part": 0}, {"message": 0}])
    assert len(p.markers) == 2
    merged = p.markers[-1]
    assert merged.explicit == (ContentBoundary(3, 0),) and merged.automatic == (ContentBoundary(3, 0),)


def test_sh4_four_explicit_markers_make_the_automatic_one_yield(frontend):
    four = [{"message": 0}, {"message": 1}, {"message": 2}, {"message": 3}]
    p = frontend.render_chat(CONVERSATION, cache_markers=four)
    assert len(p.markers) == 4 and not any(m.is_automatic for m in p.markers)
    assert p.automatic_markers_yielded == (ContentBoundary(3, 0),)
    # Three explicit markers leave the fourth slot to the automatic one (RD-10).
    q = frontend.render_chat(CONVERSATION, cache_markers=four[:3])
    assert len(q.markers) == 4 and q.markers[-1].is_automatic and q.automatic_markers_yielded == ()
    # Four explicit markers, one equal to the automatic position: it merges instead of yielding.
    r = frontend.render_chat(CONVERSATION, cache_markers=four[:3] + [{"message": 3, "part": 0}])
    assert len(r.markers) == 4 and r.markers[-1].is_automatic and r.automatic_markers_yielded == ()


def test_sh4_explicit_message_boundary_keeps_the_callers_meaning(frontend, tokenizer):
    p = frontend.render_chat(CONVERSATION, cache_markers=[{"message": 3}])
    explicit = [m for m in p.markers if m.explicit][0]
    auto = [m for m in p.markers if m.is_automatic][0]
    assert explicit is not auto and explicit.frontier > auto.frontier
    assert _text_before(p, explicit.frontier, tokenizer).endswith("Tell me more.<|im_end|>\n")
    assert _text_before(p, auto.frontier, tokenizer).endswith("Tell me more.")


def test_sh6_structure_policy_offers_leading_instructions_and_tools(frontend, tokenizer):
    p = frontend.render_chat([{"role": "developer", "content": "Be brief."}, CONVERSATION[1]],
                             tools=[TOOL], marker_policy=MarkerPolicy.STRUCTURE)
    specs = [s for m in p.markers for s in m.automatic]
    assert specs == [ToolsBoundary(0), MessageBoundary(0)]
    assert _text_before(p, p.markers[1].frontier, tokenizer).endswith("</tool_call><|im_end|>\n")


def test_sh7_unprovable_source_positions_are_rejected_but_message_boundaries_stay(tokenizer):
    template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    messages = [dict(m) for m in CONVERSATION]
    messages[1]["content"] = " Tell me a story about the sea. "
    p = ChatFrontend(tokenizer, template).render_chat(messages, cache_markers=[{"message": 1, "part": 0}, {"message": 1}])
    assert [r.spec for r in p.rejected_markers] == [ContentBoundary(1, 0), ContentBoundary(3, 0)]
    assert all("provenance" in r.reason for r in p.rejected_markers)
    assert [m.explicit for m in p.markers] == [(MessageBoundary(1),)]


def test_sh7_message_boundary_inside_a_rewritten_past_turn_is_not_offered(frontend):
    messages = [CONVERSATION[1], {"role": "assistant", "reasoning_content": "think", "content": "Sure."},
                CONVERSATION[3]]
    p = frontend.render_chat(messages, cache_markers=[{"message": 1}])
    (rejected,) = p.rejected_markers
    assert "not a prefix" in rejected.reason


def test_scn2_recovery_point_and_automatic_marker_share_one_frontier(frontend):
    p = frontend.render_chat(CONVERSATION)
    (auto,) = p.markers
    assert p.recovery_position.kind.value == "C" and auto.frontier == p.recovery_position.frontier
    assert auto.identity == p.recovery_position.identity
    assert p.save_opportunities == (auto.frontier,)


def test_scn3_markers_at_alpha_and_alpha_beta_and_alpha_serves_alpha_gamma(frontend):
    alpha_beta = frontend.render_chat(CONVERSATION, cache_markers=[{"message": 1}, {"message": 2}],
                                      marker_policy="none")
    alpha, deeper = alpha_beta.markers
    gamma = CONVERSATION[:2] + [{"role": "assistant", "content": "A different story."}, CONVERSATION[3]]
    alpha_gamma = frontend.render_chat(gamma)
    assert alpha.identity.matches(alpha_gamma.token_ids)
    assert not deeper.identity.matches(alpha_gamma.token_ids)


@pytest.mark.parametrize("marker", [{"message": -1}, {"message": 0, "part": -1}, {"tool": -1}])
def test_sh2_negative_wire_marker_indices_are_refused(frontend, marker):
    """A JSON marker naming message -1 would mark whatever message is last today; refused."""
    with pytest.raises(MarkerError, match="non-negative"):
        frontend.render_chat(CONVERSATION, cache_markers=[marker])
