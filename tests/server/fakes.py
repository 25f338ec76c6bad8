"""The server tests' doubles and helpers.

`FakeEngine` is server.fake_engine's fake engine (the one `ninfer serve --model=fake:NAME` serves)
with the tests' controls: scripted output (`script`), an error raised by the next submit
(`inject_error`), and a request that fails after its first token (`fail_next_request`).
`running_server` is server.fake_engine's; `wait_until`, `cut_streams` and `spawn_serve` drive
servers from the tests.
"""
from __future__ import annotations

import contextlib
import random
import time
from typing import Any

from server import fake_engine
from server.fake_engine import FakeHandle, running_server  # noqa: F401 (the tests import them from here)


class FakeEngine(fake_engine.FakeEngine):
    def __init__(self, *, script: str | None = None, **kw):
        """`script`: every request generates exactly this text's tokens, then stops (a model that
        answers with a tool call, say)."""
        self.script = None
        self._inject: list[BaseException] = []
        self._fail_next: list[str] = []
        self._failing: dict[FakeHandle, str] = {}
        super().__init__(**kw)
        self.script = self.tokenizer.encode(script) if script else None

    def submit(self, prompt, sampling=None, **kw) -> FakeHandle:
        if self._inject:
            raise self._inject.pop(0)
        return super().submit(prompt, sampling, **kw)

    def fail_next_request(self, message: str) -> None:
        """The next submitted request finishes with finish_reason "error" after one token."""
        self._fail_next.append(message)

    def inject_error(self, exc: BaseException) -> None:
        """The next submit raises `exc` (to test error mapping of engine-only errors)."""
        self._inject.append(exc)

    def _queued(self, handle: FakeHandle) -> None:
        if self._fail_next:
            self._failing[handle] = self._fail_next.pop(0)

    def _token(self, h: FakeHandle, i: int) -> int:
        return self.script[i % len(self.script)] if self.script else super()._token(h, i)

    def _length(self, h: FakeHandle) -> int:
        return len(self.script) if self.script else super()._length(h)

    def _finish(self, h: FakeHandle, reason: str, error: str | None = None) -> None:
        self._failing.pop(h, None)
        super()._finish(h, reason, error)

    def _step(self, h: FakeHandle) -> None:
        message = self._failing.get(h)
        if message is not None and h.tokens:
            self._finish(h, "error", message)
            return
        super()._step(h)


def wait_until(predicate, timeout: float = 5.0, step: float = 0.01) -> bool:
    """Poll `predicate` for at most `timeout` seconds; its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return bool(predicate())


def cut_streams(target: str, prompts: list[list[int]], plan: list[str], sampling: dict, *, seed: int = 0,
                timeout: float = 120.0) -> list[tuple[list[int], Any]]:
    """Open one Generate stream per prompt, all at once, from one asyncio thread. `plan[i]` is
    "finish" (read to the end), "cancel" (cancel after 1-3 tokens) or "disconnect" (close the
    stream's own channel after 1-3 tokens). Returns (token ids seen, final message or None) per
    stream; a "finish" stream that fails raises."""
    import asyncio

    import grpc

    from server.client import sampling_to_proto
    from server.proto import ninfer_pb2 as pb
    from server.proto import ninfer_pb2_grpc as pb_grpc

    rng = random.Random(seed)
    cuts = [rng.randrange(1, 4) for _ in prompts]

    async def one(shared, i):
        own = grpc.aio.insecure_channel(target) if plan[i] == "disconnect" else None
        call = pb_grpc.NInferStub(own or shared).Generate(
            pb.GenerateRequest(token_ids=pb.TokenIds(ids=prompts[i]), sampling=sampling_to_proto(sampling)),
            timeout=timeout)
        ids, final = [], None
        try:
            async for msg in call:
                ids.extend(msg.token_ids)
                if msg.finish_reason:
                    final = msg
                if plan[i] != "finish" and len(ids) >= cuts[i]:
                    if plan[i] == "cancel":
                        call.cancel()
                    else:
                        await own.close(grace=None)
                    break
        except grpc.aio.AioRpcError as e:
            if plan[i] == "finish":
                raise AssertionError(f"stream {i} failed: {e.code()} {e.details()}") from None
        finally:
            if own is not None:
                await own.close(grace=None)
        return ids, final

    async def main():
        async with grpc.aio.insecure_channel(target) as shared:
            return await asyncio.wait_for(asyncio.gather(*(one(shared, i) for i in range(len(prompts)))),
                                          timeout=timeout)

    return asyncio.run(main())


@contextlib.contextmanager
def spawn_serve(*flags: str, pattern: str = r"serving .* on (127\.0\.0\.1:\d+)", timeout: float = 60.0):
    """`ninfer serve FLAGS` in a child process, read until its stderr says it serves; yields (the
    process, the address `pattern` captured) and kills the process on exit if it still runs.
    AssertionError with what it printed when it never serves."""
    import os
    import re
    import subprocess
    import sys

    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "server.cli", "serve", *flags], stderr=subprocess.PIPE,
                            text=True, env=env, cwd=os.getcwd())
    try:
        lines, address, deadline = [], None, time.monotonic() + timeout
        while address is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            lines.append(line)
            m = re.search(pattern, line)
            if m:
                address = m.group(1)
            elif not line and proc.poll() is not None:
                break
        if address is None:
            raise AssertionError("ninfer serve did not start serving:\n" + "".join(lines))
        yield proc, address
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def serve_http(factory, token=None):
    """A warmed-up InferenceServer of `factory`'s engine with only its HTTP API, on loopback."""
    from server.app import InferenceServer

    srv = InferenceServer(factory, port=None, http_port=0, token=token, grace_s=2.0, progress=lambda m: None)
    srv.start()
    srv.warm_up()
    return srv


def http_settled(srv) -> None:
    """Nothing left running in the HTTP front or the engine, and the ledger whole."""
    assert wait_until(lambda: srv.http.front.active_count() == 0, 30.0), "requests still registered"
    assert wait_until(lambda: srv.engine.stats()["residents"] + srv.engine.stats()["queued"] == 0, 30.0)
    srv.engine.check_integrity()
