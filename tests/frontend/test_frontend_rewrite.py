"""Typed rewrite points, the actual input recovery position and rewrite execution frontiers
(REC-3..8), on the built-in Qwen3-style template and on other template shapes."""
from __future__ import annotations

from ninfer_jax.frontend import ChatFrontend, RecoveryKind, RewriteKind

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
USER1 = {"role": "user", "content": "What is the weather in Paris?"}
CALL1 = {"role": "assistant", "reasoning_content": "I should call the weather tool.", "content": None,
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
RESULT1 = {"role": "tool", "tool_call_id": "c1", "content": "sunny, 21 C"}
ANSWER1 = {"role": "assistant", "reasoning_content": "The tool says sunny.", "content": "It is sunny in Paris."}
USER2 = {"role": "user", "content": "And tomorrow?"}


def _lcp(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def test_rec3_response_replay_is_just_before_the_generation_header(frontend, tokenizer):
    p = frontend.render_chat([SYSTEM, USER1])
    rr = p.response_replay
    assert rr.kind is RewriteKind.RESPONSE_REPLAY and rr.message_index == 1
    assert tokenizer.decode(p.token_ids[rr.frontier:]) == "<|im_start|>assistant\n"
    assert p.text[: rr.char_offset].endswith("<|im_end|>\n")
    assert rr.identity.tokens == p.token_ids[: rr.frontier]


def test_rec4_turn_closure_is_before_first_assistant_after_the_real_user(frontend, tokenizer):
    p = frontend.render_chat([SYSTEM, USER1, CALL1, RESULT1], tools=[TOOL])
    tc = p.turn_closure
    assert tc.kind is RewriteKind.TURN_CLOSURE and tc.message_index == 1
    assert tokenizer.decode(p.token_ids[tc.frontier:]).startswith("<|im_start|>assistant\n<think>")
    assert p.response_replay.message_index == 3 and p.response_replay.frontier > tc.frontier
    # A tool response is not a real user message: it never becomes the turn's user.
    assert tokenizer.decode(p.token_ids[p.response_replay.frontier:]) == "<|im_start|>assistant\n"


def test_rec6a_probe_keeps_response_replay_when_the_open_turn_survives(frontend):
    call = dict(CALL1)
    call.pop("reasoning_content")
    p = frontend.render_chat([SYSTEM, USER1, call, RESULT1], tools=[TOOL])
    assert p.typed_rewrite_point.kind is RewriteKind.RESPONSE_REPLAY


def test_rec6a_probe_picks_turn_closure_when_reasoning_would_be_dropped(frontend):
    p = frontend.render_chat([SYSTEM, USER1, CALL1, RESULT1], tools=[TOOL])
    assert p.typed_rewrite_point is p.turn_closure
    assert p.typed_rewrite_point.kind is RewriteKind.TURN_CLOSURE


def test_rec_dropped_reasoning_moves_reuse_back_to_typed_r_of_the_right_turn(frontend):
    """A past turn's dropped reasoning block: the next turn's prompt stops being an extension of
    the cached one inside that turn; reuse falls back to the typed R of that turn (user 1)."""
    step = frontend.render_chat([SYSTEM, USER1, CALL1, RESULT1], tools=[TOOL])
    next_turn = frontend.render_chat([SYSTEM, USER1, CALL1, RESULT1, ANSWER1, USER2], tools=[TOOL])
    common = _lcp(step.token_ids, next_turn.token_ids)
    # The deeper ResponseReplay point no longer matches; the TurnClosure point of user 1 does.
    assert not step.response_replay.identity.matches(next_turn.token_ids)
    assert step.turn_closure.message_index == 1 and step.turn_closure.identity.matches(next_turn.token_ids)
    assert step.turn_closure.frontier <= common < step.response_replay.frontier
    # The saved recovery position (C or R of that turn) is still a real prefix of the new prompt,
    # and nothing of the dropped region in between is.
    assert step.recovery_position.identity.matches(next_turn.token_ids)
    assert step.recovery_position.rewrite_point is step.turn_closure
    # The new turn has its own typed R at the end of user 2.
    assert next_turn.typed_rewrite_point.message_index == 5


def test_scn1_normalised_tool_call_falls_back_to_typed_r(frontend, tokenizer):
    """SCN-1 from the frontend side: E (prompt + generated text) stops matching when the client
    normalises the tool call; the typed R of the first request still matches."""
    call = dict(CALL1)
    call.pop("reasoning_content")
    first = frontend.render_chat([SYSTEM, USER1], tools=[TOOL])
    generated = '<tool_call>\n{"name": "get_weather", "arguments": {"city":"Paris"}}\n</tool_call><|im_end|>'
    e_tokens = first.token_ids + tuple(tokenizer.encode(generated))
    second = frontend.render_chat([SYSTEM, USER1, call, RESULT1], tools=[TOOL])
    assert second.token_ids[: len(first.token_ids)] == first.token_ids
    assert second.token_ids[: len(e_tokens)] != e_tokens  # the deeper part no longer matches
    assert first.recovery_position.identity.matches(second.token_ids)
    assert first.response_replay.identity.matches(second.token_ids)


def test_rec5_rec7_recovery_at_c_after_a_user_message_with_pure_template_closing(frontend, tokenizer):
    p = frontend.render_chat([SYSTEM, USER1])
    rec = p.recovery_position
    assert rec.kind is RecoveryKind.C and rec.rewrite_point is p.response_replay
    assert rec.frontier < p.response_replay.frontier
    assert tokenizer.decode(p.token_ids[rec.frontier: p.response_replay.frontier]) == "<|im_end|>\n"
    assert p.text[: p.text.index("<|im_end|>", p.text.index("Paris"))].endswith(USER1["content"])
    assert rec.identity.tokens == p.token_ids[: rec.frontier]


def test_rec7_recovery_at_r_after_a_tool_message(frontend):
    call = dict(CALL1)
    call.pop("reasoning_content")
    p = frontend.render_chat([SYSTEM, USER1, call, RESULT1], tools=[TOOL])
    assert p.typed_rewrite_point.kind is RewriteKind.RESPONSE_REPLAY
    assert p.recovery_position.kind is RecoveryKind.R
    assert p.recovery_position.frontier == p.response_replay.frontier
    assert "tool" in p.recovery_position.reason


def test_rec7_recovery_at_r_when_the_closing_holds_source_content(frontend):
    # Qwen3-style: the tools block follows the system content inside the same message, so
    # C→R is not pure template closing.
    p = frontend.render_chat([SYSTEM], tools=[TOOL])
    assert p.turn_closure is None  # REC-4: no real user message, no TurnClosure
    assert p.typed_rewrite_point.message_index == 0
    assert p.recovery_position.kind is RecoveryKind.R
    assert "source content" in p.recovery_position.reason


def test_rec7_recovery_at_r_when_c_is_not_an_exact_token_frontier(tokenizer):
    # A closing that continues the last word: "call the funct" + "ion" tokenises as " function".
    template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}ion<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    p = ChatFrontend(tokenizer, template).render_chat([{"role": "user", "content": "call the funct"}])
    assert p.provenance.proven
    assert p.recovery_position.kind is RecoveryKind.R
    assert "exact token frontier" in p.recovery_position.reason


def test_rec7_recovery_at_r_when_provenance_is_not_proven(tokenizer):
    template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    p = ChatFrontend(tokenizer, template).render_chat([{"role": "user", "content": " padded "}])
    assert not p.provenance.proven
    assert p.recovery_position.kind is RecoveryKind.R
    assert p.typed_rewrite_point.kind is RewriteKind.RESPONSE_REPLAY


def test_rec7_choice_follows_typed_r_not_markers(frontend):
    plain = frontend.render_chat([SYSTEM, USER1])
    marked = frontend.render_chat([SYSTEM, USER1], cache_markers=[{"message": 0}, {"message": 1}],
                                  marker_policy="none")
    assert marked.recovery_position == plain.recovery_position
    assert {m.frontier for m in marked.markers} == {plain.response_replay.frontier, marked.markers[0].frontier}


def test_rec8_rewrite_execution_frontiers_are_r_and_generation_start_whatever_the_recovery(frontend, tokenizer):
    at_c = frontend.render_chat([SYSTEM, USER1])
    assert at_c.recovery_position.kind is RecoveryKind.C
    assert at_c.rewrite_execution_frontiers == (at_c.response_replay.frontier, len(at_c.token_ids))
    assert at_c.recovery_position.frontier not in at_c.rewrite_execution_frontiers
    # Same structure, recovery forced to R by a template whose C is not exact: same math split.
    template = frontend.template.source.replace("render_content(message.content) ~ '<|im_end|>", "render_content(message.content) ~ 'ion<|im_end|>")
    at_r = ChatFrontend(tokenizer, template).render_chat([SYSTEM, {"role": "user", "content": "call the funct"}])
    assert at_r.recovery_position.kind is RecoveryKind.R
    assert at_r.rewrite_execution_frontiers == (at_r.response_replay.frontier, len(at_r.token_ids))
    # After the assistant header when thinking is off: the header and the empty think block.
    off = frontend.render_chat([SYSTEM, USER1], template_kwargs={"enable_thinking": False})
    r, end = off.rewrite_execution_frontiers
    assert tokenizer.decode(off.token_ids[r:end]) == "<|im_start|>assistant\n<think>\n\n</think>\n\n"


def test_rec6_raw_prompt_recovers_at_p(frontend):
    p = frontend.prepare_prompt("Hello world")
    assert p.recovery_position.kind is RecoveryKind.P and p.typed_rewrite_point is None
    assert p.recovery_position.frontier == len(p.token_ids) == p.rewrite_execution_frontiers[-1]
    q = frontend.prepare_prompt(list(p.token_ids))
    assert q.token_ids == p.token_ids and q.recovery_position.identity.digest == p.recovery_position.identity.digest


def test_rec6_no_generation_prompt_means_no_typed_rewrite(frontend):
    p = frontend.render_chat([SYSTEM, USER1], add_generation_prompt=False)
    assert p.typed_rewrite_point is None and p.recovery_position.kind is RecoveryKind.P


def test_rec4_turn_closure_on_a_non_chatml_template(hf_folder):
    from ninfer_jax.frontend import Tokenizer
    front = ChatFrontend(Tokenizer.from_folder(hf_folder))
    p = front.render_chat([{"role": "user", "content": "hello world"}, {"role": "assistant", "content": "sunny"},
                           {"role": "user", "content": "tell me a story"}])
    assert p.turn_closure.frontier == p.response_replay.frontier == len(p.token_ids)
    assert p.recovery_position.kind is RecoveryKind.C
    assert front.tokenizer.decode(p.token_ids[p.recovery_position.frontier:]) == " [/INST]"


def test_rec6a_probe_that_does_not_render_falls_back_to_turn_closure(frontend, tokenizer):
    template = "{% if messages | length > 4 %}{{ raise_exception('too long') }}{% endif %}" + frontend.template.source
    call = dict(CALL1)
    call.pop("reasoning_content")
    p = ChatFrontend(tokenizer, template).render_chat([SYSTEM, USER1, call, RESULT1], tools=[TOOL])
    assert p.typed_rewrite_point is p.turn_closure
    assert any("probe" in note for note in p.notes)
