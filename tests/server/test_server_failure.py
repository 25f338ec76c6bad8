"""TXN-2 through the service: when the engine fails, health turns NOT_SERVING, open streams end
with a status naming the failure, new calls get UNAVAILABLE, GetStats still answers, and the
process still exits on SIGTERM (its graceful drain has nothing to wait for).

The engine is the real `Engine` on the cost-model Program (no compilation) with a fault
injected into its decode step. Every wait is bounded, so a regression fails instead of hanging."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import grpc
import pytest

from ninfer_jax import ContextCacheConfig, Engine, EngineConfig
from ninfer_jax.sim import SimProgram
from fakes import wait_until

LONG = {"temperature": 0, "max_tokens": 100, "ignore_eos": True}


def _faulty_engine(gate: threading.Event, after: int = 2) -> Engine:
    """A threaded engine whose decode step raises a simulated device error from its
    (after+1)-th call, once `gate` is set."""
    cfg = EngineConfig(max_concurrency=2, max_context=256, chunk_size=32, progress=False,
                       context_cache=ContextCacheConfig(host_capacity_bytes=1 << 20))
    program = SimProgram(cfg)
    real, calls = program.decode, [0]

    def decode(rows):
        calls[0] += 1
        if calls[0] > after:
            gate.wait(10)
            raise RuntimeError("simulated device error")
        return real(rows)

    program.decode = decode
    return Engine(cfg, program=program)


def _bounded_shutdown(srv, timeout: float = 15.0) -> None:
    """Shut the server down on a helper thread; fail (instead of hanging) if it blocks."""
    t = threading.Thread(target=lambda: srv.shutdown(grace_s=2.0), daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive() and srv.wait(0), "shutdown waited on the dead engine"


def test_txn2_engine_failure_ends_streams_and_turns_health_not_serving():
    from server.app import InferenceServer
    from server.client import NInferClient

    gate = threading.Event()
    engine = _faulty_engine(gate)
    srv = InferenceServer(lambda: engine, port=0)  # owns the engine: its shutdown closes it
    srv.start()
    srv.warm_up()
    client = NInferClient(srv.address, timeout=20)
    try:
        assert client.health() == "SERVING"
        first = client.generate_stream([1, 2, 3], sampling=LONG)
        assert next(first).token_ids  # running: the loop now waits inside its third decode
        second = client.generate_stream([4, 5, 6], sampling=LONG)
        assert wait_until(lambda: srv.servicer.active_count() == 2, 10), "both streams open"
        gate.set()  # the fault
        for stream in (first, second):
            with pytest.raises(grpc.RpcError) as info:
                list(stream)
            assert info.value.code() == grpc.StatusCode.INTERNAL, info.value
            assert "EngineFailure" in info.value.details() and "simulated device error" in info.value.details()
        assert wait_until(lambda: client.health() == "NOT_SERVING", 5)
        assert client.health("ninfer.v1.NInfer") == "NOT_SERVING"
        with pytest.raises(grpc.RpcError) as info:
            client.generate([1, 2], sampling={"max_tokens": 2}, timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE and "simulated device error" in info.value.details()
        stats = client.stats(timeout=5)  # answers from the last counters
        assert stats["failed"] == 1 and stats["requests_failed"] == 2
    finally:
        client.close()
        _bounded_shutdown(srv)


_SERVE_FAULTY = textwrap.dedent("""
    # `ninfer serve`'s serve() with the engine factory swapped for one whose decode step
    # fails: the same server life (signals, drain, exit code), a fault the CLI cannot inject.
    import sys
    import server.cli_commands as cc
    from ninfer_jax import Engine, EngineConfig
    from ninfer_jax.sim import SimProgram

    def factory(model, **settings):
        def build():
            cfg = EngineConfig(max_concurrency=2, max_context=256, chunk_size=32, progress=False)
            program = SimProgram(cfg)
            def decode(rows):
                raise RuntimeError("simulated device error")
            program.decode = decode
            return Engine(cfg, program=program)
        return build

    cc.engine_factory = factory
    sys.exit(cc.serve(model="sim", host="127.0.0.1", port=0, token=None, grace_s=60,
                      max_message_bytes=8 << 20))
""")


def test_txn2_serve_exits_on_sigterm_after_an_engine_failure():
    from server.client import NInferClient

    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-c", _SERVE_FAULTY], stderr=subprocess.PIPE, text=True,
                            env=env, cwd=os.getcwd())
    try:
        address, lines = None, []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and address is None:
            line = proc.stderr.readline()
            lines.append(line)
            m = re.search(r"serving .* on (127\.0\.0\.1:\d+)", line)
            address = m.group(1) if m else None
            if not line and proc.poll() is not None:
                break
        assert address, "".join(lines)
        with NInferClient(address, timeout=20) as client:
            with pytest.raises(grpc.RpcError) as info:
                list(client.generate_stream([1, 2, 3], sampling=LONG))
            assert info.value.code() == grpc.StatusCode.INTERNAL and "EngineFailure" in info.value.details()
            assert wait_until(lambda: client.health() == "NOT_SERVING", 5)
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 1  # exits, and reports the failure in its status
        assert time.monotonic() - start < 20  # well inside --grace_s=60: nothing to drain
        tail = proc.stderr.read()
        assert "engine failed" in tail and "stopped" in tail
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
