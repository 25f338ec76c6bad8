"""The replay driver on a scripted engine (no model, no ledger): sessions in turn order,
concurrency bound, timestamp order, history built from the trace's replies, TTFT on the
Program's clock; and the figures, with the offline upper bound, on hand-made outcomes."""
import dataclasses
import json
import queue
from types import SimpleNamespace

import pytest

from ninfer_jax.bench import trace as T
from ninfer_jax.engine.types import Completion, Usage
from trace_helpers import marconi_line


class ScriptedHandle:
    def __init__(self, rid, prompt, steps):
        self.request_id, self.prompt, self.left = rid, tuple(prompt), steps
        self._events, self.completion = queue.Queue(), None

    def done(self):
        return self.completion is not None

    def result(self, timeout=None):
        return self.completion


class ScriptedEngine:
    """Each request takes `steps` cycles; its first token appears after the first one."""

    tokenizer = None

    def __init__(self, steps=3):
        self.program = SimpleNamespace(sim_seconds=0.0, vocab_size=1024)
        self.program.clock = lambda: self.program.sim_seconds  # modelled, as SimProgram's
        self.steps, self.live, self.log, self.max_live, self.chats = steps, [], [], 0, []

    def submit(self, prompt, sampling, request_id=None, session=None):
        h = ScriptedHandle(request_id, prompt, self.steps)
        self.live.append(h)
        self.max_live = max(self.max_live, len(self.live))
        self.log.append(("submit", request_id, session))
        return h

    def submit_chat(self, messages, tools=None, session=None, cache_markers=None, sampling=None, request_id=None):
        self.chats.append((request_id, messages, tools, cache_markers))
        return self.submit([len(messages)], sampling, request_id=request_id, session=session)

    def step(self):
        self.program.sim_seconds += 0.5
        for h in list(self.live):
            h.left -= 1
            h._events.put("token")
            if h.left == 0:
                self.live.remove(h)
                h.completion = Completion(h.request_id, h.prompt, (7, 8), "", "length", Usage(len(h.prompt), 0, 2))
                self.log.append(("finish", h.request_id, None))

    def check_integrity(self):
        pass

    def stats(self):
        return {"prefill_tokens": 0}


def _marconi_trace():
    lines = []
    for s, t0 in (("a", 0.0), ("b", 0.1), ("c", 0.2)):
        for turn in range(3):
            lines.append(marconi_line(s, turn, t0 + turn, [1, 2, turn + 3], [4]))
    return T.parse_lines(lines)


def test_sessions_run_in_turn_order_with_at_most_concurrency_in_flight():
    eng = ScriptedEngine()
    res = T.Replayer(eng, _marconi_trace(), concurrency=2).run()
    assert eng.max_live == 2 and len(res.outcomes) == 9
    assert [e[1] for e in eng.log[:2]] == ["trace-0", "trace-3"]  # the two earliest sessions start first
    when = {(kind, rid): i for i, (kind, rid, _) in enumerate(eng.log)}
    for s in range(3):
        for turn in (1, 2):
            rid, prev = f"trace-{3 * s + turn}", f"trace-{3 * s + turn - 1}"
            assert when[("finish", prev)] < when[("submit", rid)], "a turn waits for its predecessor"
    assert {e[2] for e in eng.log if e[0] == "submit"} == {"a", "b", "c"}  # session= reaches the engine
    assert all(o.ttft_s == 0.5 for o in res.outcomes)  # one modelled step to the first token
    # This engine's Completions carry no completion_s / max_output_gap_s: the completion time is
    # the end of the cycle the tool saw the request finish, and there is no gap to report.
    assert all(o.completion_s == 1.5 and o.max_gap_s is None for o in res.outcomes)
    assert res.clock == "modelled"


def test_one_session_is_strictly_sequential_even_with_room():
    lines = [marconi_line("s", turn, 10.0 - turn, [1, turn + 2], [5]) for turn in range(4)]
    eng = ScriptedEngine(steps=1)
    res = T.Replayer(eng, T.parse_lines(lines), concurrency=8).run()
    assert eng.max_live == 1
    assert [o.index for o in res.outcomes] == [0, 1, 2, 3]  # turn order, whatever the timestamps say


def test_chat_history_appends_messages_and_replies_and_keeps_tools():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    lines = [
        json.dumps({"session": "s", "turn": 0, "messages": [{"role": "user", "content": "one"}], "tools": tools,
                    "reply": {"role": "assistant", "content": "r1", "reasoning_content": "t1"}}),
        json.dumps({"session": "s", "turn": 1, "messages": [{"role": "user", "content": "two"}], "reply": "r2",
                    "cache_markers": [{"message": 0}]}),
        json.dumps({"session": "s", "turn": 2, "full_history": True, "messages": [{"role": "user", "content": "new"}]}),
    ]
    eng = ScriptedEngine(steps=1)
    T.Replayer(eng, T.parse_lines(lines), concurrency=1).run()
    (_, m0, t0, _), (_, m1, t1, k1), (_, m2, t2, _) = eng.chats
    assert m0 == [{"role": "user", "content": "one"}] and t0 == tools
    assert m1 == [{"role": "user", "content": "one"},
                  {"role": "assistant", "content": "r1", "reasoning_content": "t1"},
                  {"role": "user", "content": "two"}]
    assert t1 == tools and k1 == [{"message": 0}]
    assert m2 == [{"role": "user", "content": "new"}] and t2 == tools


def test_a_request_refused_at_the_boundary_is_counted_and_its_session_goes_on():
    from ninfer_jax.errors import RequestError

    class Refusing(ScriptedEngine):
        def submit(self, prompt, sampling, request_id=None, session=None):
            if request_id == "trace-0":
                raise RequestError("prompt: too long")
            return super().submit(prompt, sampling, request_id=request_id, session=session)

    lines = [marconi_line("s", 0, 0, [1, 2], [3]), marconi_line("s", 1, 1, [1, 2, 3], [3])]
    res = T.Replayer(Refusing(steps=1), T.parse_lines(lines), concurrency=2).run()
    bad, good = sorted(res.outcomes, key=lambda o: o.index)
    assert bad.finish_reason == "error" and "too long" in bad.error and not bad.prompt_ids
    assert good.finish_reason == "length" and good.prompt_ids == (1, 2, 3)


def _outcome(i, prompt, output, cached=0, ttft=1.0, done=None, gap=None):
    return T.Outcome(i, "s", tuple(prompt), tuple(output), cached, ttft, "length",
                     completion_s=done, max_gap_s=gap)


def test_replayer_takes_completion_time_and_gap_from_the_completion():
    class Timed(ScriptedEngine):  # an engine whose Completions carry the OBS-4 figures
        def step(self):
            live = list(self.live)
            super().step()
            for h in live:
                if h.completion is not None:
                    h.completion = dataclasses.replace(h.completion, completion_s=0.25, max_output_gap_s=0.125)

    eng = Timed(steps=2)
    res = T.Replayer(eng, _marconi_trace(), concurrency=3).run()
    assert all(o.completion_s == 0.25 and o.max_gap_s == 0.125 for o in res.outcomes)


def test_latency_figures_p50_p99_cached_and_cold():
    """OBS-4: completion time and max inter-token gap beside TTFT, nearest-rank p50/p99 over the
    requests that have one; a request with fewer than two tokens has no gap."""
    tr = T.parse_lines([marconi_line("s", i, i, [1, 2, i + 3], [5]) for i in range(4)])
    hot = T.RunResult([_outcome(i, [1, 2, i + 3], [5, 6], 0, 0.5, done=1.0 + i, gap=None if i == 0 else 0.1 * i)
                       for i in range(4)], {}, 1.0, "modelled", tr)
    cold = T.RunResult([_outcome(i, [1, 2, i + 3], [5, 6], 0, 0.5, done=2.0, gap=0.0) for i in range(4)],
                       {}, 1.0, "modelled", tr)
    f = T.figures(tr, hot, cold, program="sim", cold_disabled=True)
    assert (f["completion_p50_s"], f["completion_p99_s"]) == (3.0, 4.0)
    assert f["max_gap_p50_s"] == pytest.approx(0.2) and f["max_gap_p99_s"] == pytest.approx(0.3)
    assert (f["cold_completion_p50_s"], f["cold_completion_p99_s"], f["cold_max_gap_p99_s"]) == (2.0, 2.0, 0.0)
    none = T.figures(tr, T.RunResult([_outcome(0, [1, 2, 3], [5])], {}, 1.0, "modelled", tr), None,
                     program="sim", cold_disabled=False)
    assert none["completion_p50_s"] is None and none["max_gap_p99_s"] is None
    assert "cold_completion_p50_s" not in none


def test_offline_upper_bound_on_a_hand_made_trace():
    outs = [
        _outcome(0, [1, 2, 3, 4], [5, 6]),  # nothing before it
        _outcome(1, [1, 2, 3, 4, 5, 9], [1]),  # extends request 0's E [1,2,3,4,5] (its last output is not input)
        _outcome(2, [1, 2, 7], [1]),  # shares [1, 2]
        _outcome(3, [8, 1, 2], [1]),  # shares nothing: prefixes only
        _outcome(4, [1, 2, 3, 4, 5, 9, 1], [2]),  # request 1's E is its whole prompt + [1][:-1]
    ]
    assert T.offline_upper_bound(outs) == 0 + 5 + 2 + 0 + 6
    outs[1].session = outs[3].session = "t"  # other sessions: 1 and 3 share only with each other
    assert T.offline_upper_bound(outs, within_sessions=True) == 0 + 0 + 2 + 0 + 5
    failed = T.Outcome(9, "s")  # refused requests have no prompt and do not count
    assert T.offline_upper_bound(outs[:2] + [failed]) == 5


def test_figures_relate_reuse_to_the_bound_and_cached_ttft_to_cold():
    tr = T.parse_lines([marconi_line("s", 0, 0, [1, 2, 3, 4], [5, 6]), marconi_line("s", 1, 1, [1, 2, 3, 4, 5, 9], [1])])
    hot = T.RunResult([_outcome(0, [1, 2, 3, 4], [5, 6], 0, 2.0), _outcome(1, [1, 2, 3, 4, 5, 9], [1], 4, 1.0)],
                      {"prefill_tokens": 6, "reused_tokens": 4, "h2d_bytes": 10, "d2h_bytes": 20, "generated_tokens": 3,
                       "decode_steps": 2, "pauses_replay": 1}, 1.0, "modelled", tr)
    cold = T.RunResult([_outcome(0, [1, 2, 3, 4], [5, 6], 0, 2.0), _outcome(1, [1, 2, 3, 4, 5, 9], [1], 0, 3.0)],
                       {"prefill_tokens": 10}, 1.0, "modelled", tr)
    f = T.figures(tr, hot, cold, program="sim", cold_disabled=True)
    assert (f["prompt_tokens"], f["cached_tokens"], f["upper_bound_tokens"]) == (10, 4, 5)
    assert f["reuse_pct"] == 40.0 and f["reuse_of_upper_bound_pct"] == 80.0 and f["upper_bound_pct"] == 50.0
    assert f["ttft_mean_s"] == 1.5 and f["cold_ttft_mean_s"] == 2.5 and f["ttft_mean_cached_over_cold"] == 0.6
    assert f["prefill_cached_over_cold"] == 0.6 and f["outputs_identical"] is True and f["outputs_differing"] == 0
    assert (f["h2d_bytes"], f["d2h_bytes"], f["requests"], f["sessions"]) == (10, 20, 2, 1)
    assert f["mean_decode_rows"] == 1.5 and f["pauses"] == 1 and f["cold_mean_decode_rows"] is None
    cold.outcomes[1] = _outcome(1, [1, 2, 3, 4, 5, 9], [2], 0, 3.0)
    f = T.figures(tr, hot, cold, program="sim", cold_disabled=True)
    assert f["outputs_identical"] is False and f["outputs_differing"] == 1
    assert "cold_ttft_mean_s" not in T.figures(tr, hot, None, program="sim", cold_disabled=False)


def test_assistant_message_parses_reasoning_and_tool_calls_and_drops_the_stop_token():
    from ninfer_jax.frontend import Tokenizer

    tok = Tokenizer.load("builtin:tiny-hybrid")
    text = '<think>\nplan it\n</think>\n\nok\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
    ids = tok.encode(text) + [tok.eos_token_ids[0]]
    msg = T.assistant_message(tok, ids)
    assert msg["reasoning_content"] == "plan it" and msg["content"].strip() == "ok"
    assert msg["tool_calls"][0]["function"] == {"name": "f", "arguments": {"x": 1}}
    assert T.assistant_message(tok, tok.encode("just text")) == {"role": "assistant", "content": "just text"}


def test_the_replay_tunes_the_collector_only_while_it_runs():
    # issue 15: the start-up heap is frozen and young passes are rarer during a replay; the
    # process's collector is as it was afterwards, also when the replay fails
    import gc

    class Seen(ScriptedEngine):
        def step(self):
            self.during = (gc.get_threshold()[0], gc.get_freeze_count() > 0)
            return super().step()

    gc.unfreeze()  # (another test may have frozen its heap)
    before = gc.get_threshold()
    frozen = gc.get_freeze_count()
    eng = Seen()
    T.Replayer(eng, _marconi_trace(), concurrency=2).run()
    assert eng.during == (T.GC_YOUNG, True)
    assert gc.get_threshold() == before and gc.get_freeze_count() == frozen == 0

    class Failing(ScriptedEngine):
        def step(self):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        T.Replayer(Failing(), _marconi_trace(), concurrency=2).run()
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
