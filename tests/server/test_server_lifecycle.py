"""Health across warm-up and shutdown, reflection, the bearer token, graceful shutdown and signals."""
from __future__ import annotations

import signal
import threading
import time

import grpc
import pytest
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from server.app import InferenceServer
from server.client import NInferClient
from server.proto import ninfer_pb2 as pb
from fakes import FakeEngine, running_server, spawn_serve, wait_until

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


def _code(call):
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code()


def test_health_not_serving_then_serving_then_not_serving(settled):
    gate = threading.Event()
    engine = FakeEngine(step_s=0.005, min_len=200, max_len=200)

    def factory():
        assert gate.wait(10)
        return engine

    srv = InferenceServer(factory, port=0)
    assert srv.host == "127.0.0.1"  # loopback unless told otherwise
    srv.start()
    warm = threading.Thread(target=srv.warm_up)
    warm.start()
    client = NInferClient(srv.address, timeout=10)
    try:
        assert client.health() == "NOT_SERVING"
        assert client.health("ninfer.v1.NInfer") == "NOT_SERVING"
        assert _code(lambda: client.generate("x")) == UNAVAILABLE
        assert _code(lambda: client.model_info()) == UNAVAILABLE
        gate.set()
        warm.join(10)
        assert client.health() == "SERVING" and client.health("ninfer.v1.NInfer") == "SERVING"
        assert client.generate("x", sampling={"max_tokens": 2}).finish_reason == "length"
        stream = client.generate_stream([5, 6], sampling={"max_tokens": 200})
        next(stream)
        seen = []
        stopper = threading.Thread(target=lambda: srv.shutdown(grace_s=0.5))
        stopper.start()
        assert wait_until(lambda: srv.servicer.draining)
        seen.append(client.health())
        assert _code(lambda: client.generate("x")) == UNAVAILABLE  # draining: no new work
        rest = list(stream)  # cut at the end of the grace period: a final CANCELLED message
        assert rest[-1].finish_reason == pb.FINISH_REASON_CANCELLED
        stopper.join(15)
        assert seen == ["NOT_SERVING"]
        assert engine._closed  # the server owned the engine and closed it
    finally:
        client.close()
        srv.shutdown(0)


def test_shutdown_lets_running_streams_finish_within_grace():
    engine = FakeEngine(step_s=0.005, min_len=40, max_len=40)
    srv = InferenceServer(lambda: engine, port=0, grace_s=10)
    srv.start()
    srv.warm_up()
    client = NInferClient(srv.address, timeout=10)
    try:
        stream = client.generate_stream([1, 2], sampling={"temperature": 0, "max_tokens": 40})
        first = next(stream)
        stopper = threading.Thread(target=srv.shutdown)
        stopper.start()
        rest = list(stream)
        ids = list(first.token_ids) + [t for m in rest for t in m.token_ids]
        assert len(ids) == 40 and rest[-1].finish_reason == pb.FINISH_REASON_STOP
        stopper.join(15)
        assert srv.wait(0)
    finally:
        client.close()


def test_reflection_lists_the_services(fake_server):
    srv, _, _ = fake_server
    with grpc.insecure_channel(srv.address) as channel:
        db = ProtoReflectionDescriptorDatabase(channel)
        services = set(db.get_services())
        assert {"ninfer.v1.NInfer", "grpc.health.v1.Health"} <= services
        desc = db.FindFileContainingSymbol("ninfer.v1.NInfer")
        assert desc.package == "ninfer.v1"
        assert [m.name for m in desc.service[0].method] == ["Generate", "Chat", "Tokenize", "GetModelInfo", "GetStats"]


def test_bearer_token_required_when_configured():
    engine = FakeEngine()
    try:
        with running_server(engine, token="s3cret") as (srv, good):
            assert good.generate("x", sampling={"max_tokens": 2}).finish_reason == "length"
            assert good.tokenize("x")
            for token in (None, "wrong", "s3cret-and-more"):
                with NInferClient(srv.address, token=token, timeout=10) as bad:
                    assert _code(lambda: bad.generate("x")) == grpc.StatusCode.UNAUTHENTICATED
                    assert _code(lambda: bad.chat([{"role": "user", "content": "x"}])) == \
                        grpc.StatusCode.UNAUTHENTICATED
                    assert _code(lambda: bad.model_info()) == grpc.StatusCode.UNAUTHENTICATED
                    assert bad.health() == "SERVING"  # probes stay open
            with grpc.insecure_channel(srv.address) as channel:  # reflection is behind the token too
                with pytest.raises(grpc.RpcError):
                    ProtoReflectionDescriptorDatabase(channel).get_services()
            assert engine.stats()["requests_submitted"] == 1  # refused calls never reached the engine
    finally:
        engine.close()


def test_port_in_use_is_an_error(fake_server):
    srv, _, _ = fake_server
    other = InferenceServer(lambda: None, port=srv.port)
    with pytest.raises(OSError):
        other.start()


def test_ninfer_serve_shuts_down_gracefully_on_sigterm():
    """(SIGINT takes the same path: the second-signal test below sends one.)"""
    sig = signal.SIGTERM
    with spawn_serve("--model=fake:tiny", "--port=0", "--grace_s=5") as (proc, address):
        with NInferClient(address, timeout=20) as client:
            assert client.health() == "SERVING"
            stream = client.generate_stream("a long-ish answer", sampling={"temperature": 0, "max_tokens": 20})
            next(stream)
            proc.send_signal(sig)
            rest = list(stream)  # the running stream finishes inside the grace period
            assert rest[-1].finish_reason in (pb.FINISH_REASON_STOP, pb.FINISH_REASON_LENGTH)
        assert proc.wait(20) == 0
        tail = proc.stderr.read()
        assert "shutting down" in tail and "stopped" in tail


def test_second_signal_cancels_running_streams_at_once():
    with spawn_serve("--model=fake:slow,step_s=0.02,len=200", "--port=0", "--grace_s=60") as (proc, address):
        with NInferClient(address, timeout=30) as client:
            stream = client.generate_stream([1, 2], sampling={"temperature": 0, "max_tokens": 200})  # ~4 s
            next(stream)
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.5)
            start = time.monotonic()
            proc.send_signal(signal.SIGINT)
            rest = list(stream)
            assert rest[-1].finish_reason == pb.FINISH_REASON_CANCELLED
            assert time.monotonic() - start < 3
        assert proc.wait(20) == 0
