"""What `ninfer serve` and `ninfer generate|chat --server=HOST:PORT` do (their flags: server/cli.py).

`serve` builds the engine from the flags inside the server's warm-up (health NOT_SERVING until
it is ready) and serves until SIGTERM/SIGINT. The remote commands stream text to stdout and
progress to stderr, like their in-process twins. `--model=fake:NAME` serves the deterministic
fake engine of `server.fake_engine` (no model, no compilation: for trying the service out and tests);
`fake:NAME,step_s=0.02,len=200,warmup_s=5` sets its pace, output length and warm-up time.

The remote commands never print a traceback for user input: a request the client refuses
(server/validate.py) is one `[ninfer] RequestError: ...` line and exit 2, before connecting; a
server's refusal, or no server at the address, is one line and exit 1. Before the call they wait
(up to `wait_s`, default 120 s; 0 = not at all) for the server's health to turn SERVING, so a
command started right after `ninfer serve` waits out the warm-up instead of failing.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Callable, Iterable, Sequence

import grpc

TOKEN_ENV = "NINFER_TOKEN"


def _say(msg: str) -> None:
    print(f"[ninfer] {msg}", file=sys.stderr, flush=True)


def resolve_token(flag_value: str | None) -> str | None:
    """--token, else $NINFER_TOKEN (keeps the secret out of the process list), else none."""
    return flag_value or os.environ.get(TOKEN_ENV) or None


def fake_options(model: str) -> dict:
    """`fake:NAME[,step_s=SECONDS][,len=TOKENS][,warmup_s=SECONDS]`: the fake engine's pace, output
    length and how long its construction takes (a stand-in for loading and compiling)."""
    out: dict = {}
    for item in model.split(",")[1:]:
        key, _, value = item.partition("=")
        try:
            if key in ("step_s", "warmup_s"):
                out[key] = float(value)
            elif key == "len":
                out["min_len"] = out["max_len"] = int(value)
            else:
                raise ValueError
        except ValueError:
            raise ValueError(f"fake engine option {item!r}: expected step_s=SECONDS, len=TOKENS or "
                             "warmup_s=SECONDS") from None
    return out


def engine_factory(model: str, **settings: Any) -> Callable[[], Any]:
    """A function building the engine. Settings that are None keep the engine's defaults."""
    settings = {k: v for k, v in settings.items() if v is not None}

    if model.startswith("fake:"):
        def build_fake():
            from server.fake_engine import FakeEngine

            keep = {k: settings[k] for k in ("max_concurrency", "max_context", "chat_template") if k in settings}
            return FakeEngine(model=model, **keep, **fake_options(model))

        return build_fake

    def build():
        from ninfer_jax import Engine
        from ninfer_jax.cli_flags import engine_config

        return Engine(engine_config(model, **settings))

    return build


def log_access_to_stderr() -> None:
    """The HTTP access log (logger "ninfer.http.access", one line per request) on stderr, each
    line `[ninfer] TIME LINE`, apart from absl's own log handler; idempotent."""
    import logging

    logger = logging.getLogger("ninfer.http.access")
    if not any(getattr(h, "ninfer_access", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.ninfer_access = True
        handler.setFormatter(logging.Formatter("[ninfer] %(asctime)s.%(msecs)03d %(message)s", "%Y-%m-%dT%H:%M:%S"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def serve(*, model: str, host: str, port: int | None, token: str | None, grace_s: float, max_message_bytes: int,
          http_port: int | None = None, http_settings: Any = None, **engine_settings: Any) -> int:
    from server.app import InferenceServer
    from server.limits import ServerLimits

    if http_port is not None and (http_settings is None or http_settings.access_log):
        log_access_to_stderr()
    try:
        server = InferenceServer(engine_factory(model, **engine_settings), host=host, port=port,
                                 token=resolve_token(token), limits=ServerLimits(max_message_bytes=max_message_bytes),
                                 grace_s=grace_s, progress=_say, http_port=http_port, http_settings=http_settings)
    except OSError as exc:  # the request log's file, opened before the model loads
        _say(f"serve: {exc}")
        return 1
    try:
        server.serve_until_signal()
    except OSError as exc:
        _say(f"serve: {exc}")
        return 1
    return 1 if server.warm_up_error is not None or server.engine_failure is not None else 0


DEFAULT_WAIT_S = 120.0


def _refused(exc) -> int:
    """A request the client refused before sending (ClientRequestError): one line, exit 2."""
    _say(exc.details())
    return 2


def _rpc_failed(exc: grpc.RpcError, server: str) -> int:
    """A server's refusal, or no server at all: one line, exit 1."""
    from server.client import is_unreachable

    if is_unreachable(exc):
        _say(f"no server answered at {server}")
    else:
        _say(f"server answered {exc.code().name}: {exc.details()}")
    return 1


def _wait_serving(client, server: str, wait_s: float | None) -> int | None:
    """Wait up to `wait_s` seconds for the server's health to report SERVING (0 or None: don't
    wait), with one progress line when it does not at once. An exit code to return now (no
    server answered), or None to make the call: also when the server still does not serve
    (warming up when the time ran out, shutting down, its engine failed): the call's answer
    then says why."""
    if not wait_s or wait_s <= 0:
        return None

    def progress(state: str) -> None:
        if state == "UNREACHABLE":
            _say(f"waiting for a server to answer at {server} (up to {wait_s:g} s)...")
        else:
            _say(f"waiting for {server} to finish warming up (up to {wait_s:g} s)...")

    if client.wait_serving(wait_s, on_wait=progress) == "UNREACHABLE":
        _say(f"no server answered at {server} (waited {wait_s:g} s)")
        return 1
    return None


def _stream_turn(start, server: str, label: str = ""):
    """Start a call with `start()`, print each message's text as it arrives and usage to stderr.
    (exit code, final message or None): 0, 2 if the client refused the request, 1 on an RPC
    error, 130 on Ctrl-C."""
    from server.client import FINISH_NAMES, ClientRequestError

    call, printed, final = None, False, None
    try:
        call = start()
        for msg in call:
            if msg.text:
                print(msg.text, end="", flush=True)
                printed = True
            if msg.finish_reason:
                print()
                printed = False
                final = msg
                u = msg.usage
                _say(f"{label}finish_reason={FINISH_NAMES[msg.finish_reason]} prompt_tokens={u.prompt_tokens} "
                     f"cached_tokens={u.cached_tokens} completion_tokens={u.completion_tokens}")
        return 0, final
    except ClientRequestError as exc:
        return _refused(exc), None
    except grpc.RpcError as exc:
        if printed:
            print(flush=True)  # end the partial line on stdout
        return _rpc_failed(exc, server), None
    except KeyboardInterrupt:
        if call is not None:
            call.cancel()
        print(file=sys.stderr)
        _say("interrupted")
        return 130, None


def _connect(server: str, token: str | None):
    """A client for `server`, or a ClientRequestError for a token that cannot be sent."""
    from server.client import NInferClient

    return NInferClient(server, token=resolve_token(token))


def generate_remote(server: str, prompt: str | Sequence[int], sampling: dict | None, *, token: str | None = None,
                    timeout: float | None = None, wait_s: float = DEFAULT_WAIT_S) -> int:
    """`ninfer generate --server`: 0; 2 for a request refused before connecting (one stderr line,
    `[ninfer] RequestError: field: why`); 1 when the server refused or did not answer (one
    line); 130 on Ctrl-C. Waits up to `wait_s` seconds for the server to finish warming up
    (not counted in `timeout`, the call's deadline)."""
    from server.client import generate_request

    return _remote(server, token, wait_s, lambda: generate_request(prompt, sampling=sampling),
                   lambda client: _stream_turn(lambda: client.generate_stream(prompt, sampling=sampling,
                                                                              timeout=timeout), server)[0])


def _remote(server: str, token: str | None, wait_s: float, check: Callable[[], Any],
            run: Callable[[Any], int]) -> int:
    """The remote commands' frame: `check()` refuses bad input before connecting (2), then the
    client waits up to `wait_s` for SERVING and `run(client)` makes the call; 130 on Ctrl-C."""
    from server.client import ClientRequestError

    try:
        check()
        client = _connect(server, token)
    except ClientRequestError as exc:
        return _refused(exc)
    with client:
        try:
            code = _wait_serving(client, server, wait_s)
            return code if code is not None else run(client)
        except KeyboardInterrupt:
            print(file=sys.stderr)
            _say("interrupted")
            return 130


def chat_remote(server: str, messages: list[dict], sampling: dict | None, *, session: str | None = None,
                token: str | None = None, timeout: float | None = None, wait_s: float = DEFAULT_WAIT_S,
                turns: Iterable[str] | None = None) -> int:
    """`ninfer chat --server`. With `turns` None: one request with `messages`. With `turns` (user
    messages, e.g. lines of stdin, read lazily): a conversation that starts from `messages` (the
    history so far, may be empty); each turn appends the user message, streams the reply, and
    appends the assistant message as the server parsed it (content, reasoning, tool calls), all
    under one session (`session`, default `cli-<pid>`); per turn one stderr line with its usage.
    Exit codes and waiting as `generate_remote`; a conversation stops at the first failed turn."""
    from server.client import chat_request

    def run(client) -> int:
        if turns is None:
            return _stream_turn(lambda: client.chat_stream(messages, sampling=sampling, session=session,
                                                           timeout=timeout), server)[0]
        return _conversation(client, server, messages, sampling, session or f"cli-{os.getpid()}", timeout, turns)

    return _remote(server, token, wait_s, lambda: chat_request(messages, sampling=sampling, session=session), run)


def _conversation(client, server: str, messages: list[dict], sampling, session: str, timeout, turns) -> int:
    from server.client import assistant_message

    history = list(messages)
    for turn, text in enumerate(turns, 1):
        history.append({"role": "user", "content": text})
        code, final = _stream_turn(lambda: client.chat_stream(history, sampling=sampling, session=session,
                                                              timeout=timeout), server, label=f"turn {turn}: ")
        if code:
            return code
        history.append(assistant_message(final.message) if final is not None and final.HasField("message")
                       else {"role": "assistant", "content": ""})
    return 0
