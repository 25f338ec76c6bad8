"""`generate_remote` / `chat_remote` (ninfer generate|chat --server): exit codes and one-line
messages instead of tracebacks, waiting out the server's warm-up, multi-turn chat."""
from __future__ import annotations

import copy
import io
import os
import socket
import subprocess
import sys
import threading

import pytest

from ninfer_jax.engine.types import SamplingParams
from server.app import InferenceServer
from server.cli_commands import chat_remote, generate_remote
from server.limits import ServerLimits
from fakes import FakeEngine, running_server, wait_until

GREEDY = {"temperature": 0.0, "seed": 0, "max_tokens": 5}


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


@pytest.fixture
def streams(monkeypatch):
    """A function putting buffers in place of sys.stdout / sys.stderr (which the CLI functions look
    up at each print, from any thread). Called from the test body: pytest puts its own capture
    back between a fixture's setup and the test."""

    def redirect():
        out, err = io.StringIO(), io.StringIO()
        monkeypatch.setattr(sys, "stdout", out)
        monkeypatch.setattr(sys, "stderr", err)
        return out, err

    return redirect


class RecordingEngine(FakeEngine):
    """A FakeEngine that remembers every chat request it was given."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.chats: list[dict] = []

    def submit_chat(self, messages, *, session=None, **kwargs):
        self.chats.append({"messages": copy.deepcopy(messages), "session": session})
        return super().submit_chat(messages, session=session, **kwargs)


# --- refused before connecting: exit 2, one line ------------------------------------------------
@pytest.mark.parametrize("prompt, sampling, line", [
    ("hi", {"seed": -5}, "[ninfer] RequestError: sampling.seed: must be an int in [0, 2**63), got -5"),
    ("hi", {"max_tokens": 99999999999},
     "[ninfer] RequestError: sampling.max_tokens: must be at most 2147483647 (the protocol's int32), "
     "got 99999999999"),
    ("hi", {"temperature": "abc"}, "[ninfer] RequestError: sampling.temperature: must lie in [0, 100], got 'abc'"),
    (3.5, {}, "[ninfer] RequestError: prompt: must be text (str) or a list of token ids (ints), got float"),
])
def test_generate_remote_bad_input_is_one_line_and_exit_2(streams, prompt, sampling, line):
    out, err = streams()
    assert generate_remote(f"127.0.0.1:{_unused_port()}", prompt, sampling, wait_s=0.5) == 2
    assert _lines(err.getvalue()) == [line]  # before connecting: no "no server answered"
    assert out.getvalue() == ""


def test_chat_remote_bad_input_is_one_line_and_exit_2(streams):
    _, err = streams()
    server = f"127.0.0.1:{_unused_port()}"
    assert chat_remote(server, [{"role": "user", "content": 5}], {}, wait_s=0.5) == 2
    assert chat_remote(server, [{"role": "user", "content": "x"}], {"top_p": 0}, wait_s=0.5, turns=["a"]) == 2
    assert chat_remote(server, [{"role": "user", "content": "x"}], {}, session=7, wait_s=0.5) == 2
    assert _lines(err.getvalue()) == [
        "[ninfer] RequestError: messages[0].content: must be a list of parts (or text), got int",
        "[ninfer] RequestError: sampling.top_p: must lie in (0, 1], got 0",
        "[ninfer] RequestError: session: must be a string, got int"]


# --- no server: exit 1, one line saying so -------------------------------------------------------
def test_unreachable_server_is_exit_1_after_the_wait(streams):
    _, err = streams()
    server = f"127.0.0.1:{_unused_port()}"
    assert generate_remote(server, "hi", GREEDY, wait_s=0.5) == 1
    lines = _lines(err.getvalue())
    assert lines[-1] == f"[ninfer] no server answered at {server} (waited 0.5 s)"
    assert lines[:-1] == [f"[ninfer] waiting for a server to answer at {server} (up to 0.5 s)..."]
    assert "Traceback" not in err.getvalue()


def test_unreachable_server_without_waiting(streams):
    _, err = streams()
    server = f"127.0.0.1:{_unused_port()}"
    assert generate_remote(server, "hi", GREEDY, wait_s=0) == 1
    assert chat_remote(server, [{"role": "user", "content": "hi"}], GREEDY, wait_s=0) == 1
    assert _lines(err.getvalue()) == [f"[ninfer] no server answered at {server}"] * 2


def test_cli_subprocess_bad_input_has_no_traceback():
    """The real command: flags -> generate_remote, no server running."""
    server = f"127.0.0.1:{_unused_port()}"
    for flag, needle in (("--seed=-5", "sampling.seed"), ("--max_tokens=99999999999", "sampling.max_tokens")):
        out = subprocess.run([sys.executable, "-m", "server.cli", "generate", f"--server={server}", flag],
                             capture_output=True, text=True, timeout=120, cwd=os.getcwd())
        assert out.returncode == 2, out.stderr
        assert "Traceback" not in out.stderr
        (line,) = _lines(out.stderr)  # one line (server/cli.py may refuse it itself, before generate_remote)
        assert f"RequestError: {needle}: " in line


# --- the server refuses: exit 1, one line with the status ----------------------------------------
def test_server_refusal_is_one_line_and_exit_1(streams):
    out, err = streams()
    engine = FakeEngine()
    try:
        with running_server(engine, limits=ServerLimits(max_tokens=4)) as (srv, _):
            assert generate_remote(srv.address, "hi", {"max_tokens": 9}, wait_s=5) == 1
            assert chat_remote(srv.address, [{"role": "robot", "content": "hi"}], {}, wait_s=5) == 1
    finally:
        engine.close()
    lines = _lines(err.getvalue())
    assert lines[0] == ("[ninfer] server answered INVALID_ARGUMENT: RequestError: sampling.max_tokens: 9 exceeds "
                        "the server limit of 4")
    assert lines[1].startswith("[ninfer] server answered INVALID_ARGUMENT: UnknownRoleError")
    assert len(lines) == 2 and out.getvalue() == ""


# --- waiting for SERVING -------------------------------------------------------------------------
def _slow_server(engine, gate: threading.Event) -> InferenceServer:
    """A server whose warm-up (engine factory) blocks until `gate` is set."""

    def factory():
        assert gate.wait(60), "the test never opened the gate"
        return engine

    srv = InferenceServer(factory, port=0, close_engine=False)
    srv.start()
    threading.Thread(target=srv.warm_up, name="test-warmup", daemon=True).start()
    return srv


def test_generate_waits_for_the_warm_up_and_succeeds(streams):
    out, err = streams()
    engine, gate = FakeEngine(), threading.Event()
    srv = _slow_server(engine, gate)
    rc: list[int] = []
    worker = threading.Thread(target=lambda: rc.append(generate_remote(srv.address, "Tell me", GREEDY, wait_s=60)))
    try:
        worker.start()
        assert wait_until(lambda: "waiting for" in err.getvalue(), 30), err.getvalue()
        assert worker.is_alive() and not rc  # still waiting: no "warming up" failure
        assert engine.stats().get("requests_submitted", 0) == 0
        gate.set()
        worker.join(60)
        assert rc == [0], err.getvalue()
        want = engine.generate("Tell me", SamplingParams(**GREEDY))
    finally:
        gate.set()
        srv.shutdown(grace_s=1.0)
        engine.close()
    assert out.getvalue() == want.text + "\n"
    lines = _lines(err.getvalue())
    assert lines[0] == f"[ninfer] waiting for {srv.address} to finish warming up (up to 60 s)..."
    assert len(lines) == 2 and lines[1].startswith("[ninfer] finish_reason=")
    assert "warming up (loading" not in err.getvalue()


def test_the_wait_is_bounded(streams):
    """Still warming up when wait_s runs out: the call goes ahead and the server says why."""
    out, err = streams()
    engine, gate = FakeEngine(), threading.Event()
    srv = _slow_server(engine, gate)
    try:
        assert generate_remote(srv.address, "hi", GREEDY, wait_s=0.5) == 1
        assert chat_remote(srv.address, [{"role": "user", "content": "hi"}], GREEDY, wait_s=0) == 1
    finally:
        gate.set()
        srv.shutdown(grace_s=1.0)
        engine.close()
    assert _lines(err.getvalue()) == [
        f"[ninfer] waiting for {srv.address} to finish warming up (up to 0.5 s)...",
        "[ninfer] server answered UNAVAILABLE: server is warming up (loading and compiling the model)",
        "[ninfer] server answered UNAVAILABLE: server is warming up (loading and compiling the model)"]
    assert out.getvalue() == ""


def test_a_failed_engine_is_not_waited_on(streams):
    """NOT_SERVING because the engine failed (TXN-2) never turns SERVING: no wait, one line."""
    _, err = streams()
    engine = FakeEngine()
    try:
        with running_server(engine) as (srv, client):
            engine.failure = "EngineFailure: simulated"
            assert wait_until(lambda: client.health() == "NOT_SERVING", 10)
            assert generate_remote(srv.address, "hi", GREEDY, wait_s=600) == 1
    finally:
        engine.close()
    assert _lines(err.getvalue()) == [
        "[ninfer] server answered UNAVAILABLE: the engine failed and takes no requests: EngineFailure: simulated"]


# --- multi-turn chat -----------------------------------------------------------------------------
def test_chat_turns_share_a_session_and_grow_the_history(streams):
    out, err = streams()
    engine = RecordingEngine()
    try:
        with running_server(engine) as (srv, _):
            rc = chat_remote(srv.address, [], {"temperature": 0.0, "max_tokens": 6}, wait_s=5,
                             turns=iter(["first question", "second one", "third"]))
    finally:
        engine.close()
    assert rc == 0, err.getvalue()
    assert [c["session"] for c in engine.chats] == [f"cli-{os.getpid()}"] * 3
    histories = [c["messages"] for c in engine.chats]
    assert [len(h) for h in histories] == [1, 3, 5]
    assert [m["role"] for m in histories[2]] == ["user", "assistant", "user", "assistant", "user"]
    assert [m["content"] for m in histories[2] if m["role"] == "user"] == ["first question", "second one", "third"]
    for k in (0, 1):  # each history extends the one before it
        assert histories[k + 1][:len(histories[k])] == histories[k]
    replies = out.getvalue().splitlines()
    assert len(replies) == 3 and all(replies)
    assert [histories[2][1]["content"], histories[2][3]["content"]] == replies[:2]  # the reply joins the history
    lines = _lines(err.getvalue())
    assert [line.split(":")[0] for line in lines] == ["[ninfer] turn 1", "[ninfer] turn 2", "[ninfer] turn 3"]
    assert all("prompt_tokens=" in line and "cached_tokens=" in line for line in lines)


def test_chat_turns_keep_a_given_session_and_start_history(streams):
    _, err = streams()
    engine = RecordingEngine()
    system = {"role": "system", "content": "Be brief."}
    try:
        with running_server(engine) as (srv, _):
            rc = chat_remote(srv.address, [system], {"temperature": 0.0, "max_tokens": 3}, session="s1",
                             wait_s=5, turns=["a", "b"])
            single = chat_remote(srv.address, [{"role": "user", "content": "once"}], {"max_tokens": 3}, wait_s=5)
    finally:
        engine.close()
    assert rc == 0 and single == 0, err.getvalue()
    assert [c["session"] for c in engine.chats] == ["s1", "s1", None]
    assert engine.chats[0]["messages"] == [system, {"role": "user", "content": "a"}]
    assert engine.chats[1]["messages"][0] == system and len(engine.chats[1]["messages"]) == 4
    assert engine.chats[2]["messages"] == [{"role": "user", "content": "once"}]


def test_chat_turns_stop_at_the_first_failed_turn(streams):
    _, err = streams()
    engine = RecordingEngine()
    try:
        with running_server(engine, limits=ServerLimits(max_messages=2)) as (srv, _):
            rc = chat_remote(srv.address, [], {"max_tokens": 3}, wait_s=5, turns=["a", "b", "c"])
    finally:
        engine.close()
    assert rc == 1
    assert len(engine.chats) == 1  # turn 2 (3 messages) was refused by the server, turn 3 never sent
    assert _lines(err.getvalue())[-1] == ("[ninfer] server answered INVALID_ARGUMENT: RequestError: messages: 3 "
                                          "exceed the server limit of 2")
