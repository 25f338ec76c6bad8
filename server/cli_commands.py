"""What `ninfer serve` and `ninfer generate|chat --server=HOST:PORT` do (flags live in ninfer_jax/cli.py).

`serve` builds the engine from the flags inside the server's warm-up (health NOT_SERVING until
it is ready) and serves until SIGTERM/SIGINT. The remote commands stream text to stdout and
progress to stderr, like their in-process twins. `--model=fake:NAME` serves the deterministic
fake engine of `server.testing` (no model, no compilation: for trying the service out and tests);
`fake:NAME,step_s=0.02,len=200` sets its pace and output length.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable, Sequence

import grpc

TOKEN_ENV = "NINFER_TOKEN"


def _say(msg: str) -> None:
    print(f"[ninfer] {msg}", file=sys.stderr, flush=True)


def resolve_token(flag_value: str | None) -> str | None:
    """--token, else $NINFER_TOKEN (keeps the secret out of the process list), else none."""
    return flag_value or os.environ.get(TOKEN_ENV) or None


def fake_options(model: str) -> dict:
    """`fake:NAME[,step_s=SECONDS][,len=TOKENS]`: the fake engine's pace and output length."""
    out: dict = {}
    for item in model.split(",")[1:]:
        key, _, value = item.partition("=")
        try:
            if key == "step_s":
                out["step_s"] = float(value)
            elif key == "len":
                out["min_len"] = out["max_len"] = int(value)
            else:
                raise ValueError
        except ValueError:
            raise ValueError(f"fake engine option {item!r}: expected step_s=SECONDS or len=TOKENS") from None
    return out


def engine_factory(model: str, **settings: Any) -> Callable[[], Any]:
    """A function building the engine. Settings that are None keep the engine's defaults."""
    settings = {k: v for k, v in settings.items() if v is not None}

    if model.startswith("fake:"):
        def build_fake():
            from server.testing import FakeEngine

            keep = {k: settings[k] for k in ("max_concurrency", "max_context") if k in settings}
            return FakeEngine(model=model, **keep, **fake_options(model))

        return build_fake

    def build():
        from ninfer_jax import Engine, EngineConfig

        cache_keys = ("device_state_slots", "host_capacity_bytes")
        cache = {k: settings.pop(k) for k in cache_keys if k in settings}
        if cache:
            from ninfer_jax import ContextCacheConfig

            settings["context_cache"] = ContextCacheConfig(**cache)
        return Engine(EngineConfig(model=model, **settings))

    return build


def serve(*, model: str, host: str, port: int, token: str | None, grace_s: float, max_message_bytes: int,
          **engine_settings: Any) -> int:
    from server.app import InferenceServer
    from server.limits import ServerLimits

    server = InferenceServer(engine_factory(model, **engine_settings), host=host, port=port,
                             token=resolve_token(token), limits=ServerLimits(max_message_bytes=max_message_bytes),
                             grace_s=grace_s, progress=_say)
    try:
        server.serve_until_signal()
    except OSError as exc:
        _say(f"serve: {exc}")
        return 1
    return 1 if server.warm_up_error is not None or server.engine_failure is not None else 0


def _stream_to_stdout(call) -> int:
    """Print each message's text as it arrives; usage to stderr. 0, or 1 on an RPC error."""
    from server.client import FINISH_NAMES

    try:
        for msg in call:
            if msg.text:
                print(msg.text, end="", flush=True)
            if msg.finish_reason:
                print()
                u = msg.usage
                _say(f"finish_reason={FINISH_NAMES[msg.finish_reason]} prompt_tokens={u.prompt_tokens} "
                     f"cached_tokens={u.cached_tokens} completion_tokens={u.completion_tokens}")
        return 0
    except grpc.RpcError as exc:
        print(file=sys.stderr)
        _say(f"server answered {exc.code().name}: {exc.details()}")
        return 1
    except KeyboardInterrupt:
        call.cancel()
        return 130


def generate_remote(server: str, prompt: str | Sequence[int], sampling: dict, *, token: str | None = None,
                    timeout: float | None = None) -> int:
    from server.client import NInferClient

    with NInferClient(server, token=resolve_token(token)) as client:
        return _stream_to_stdout(client.generate_stream(prompt, sampling=sampling, timeout=timeout))


def parse_messages(text: str | None, prompt: str) -> list[dict]:
    """--messages (a JSON list, or @FILE holding one), else one user message with --prompt."""
    if not text:
        return [{"role": "user", "content": prompt}]
    if text.startswith("@"):
        with open(text[1:], encoding="utf-8") as f:
            text = f.read()
    try:
        messages = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--messages is not valid JSON: {exc.msg}") from None
    if not isinstance(messages, list):
        raise ValueError("--messages must be a JSON list of messages")
    return messages


def chat_remote(server: str, messages: list[dict], sampling: dict, *, session: str | None = None,
                token: str | None = None, timeout: float | None = None) -> int:
    from server.client import NInferClient

    with NInferClient(server, token=resolve_token(token)) as client:
        return _stream_to_stdout(client.chat_stream(messages, sampling=sampling, session=session, timeout=timeout))
