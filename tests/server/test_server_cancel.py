"""Client cancel, disconnect and deadline cancel the request in the engine and free it at once;
200 concurrent streams with random cancels and disconnects all end cleanly (fake engine)."""
from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
import time

import grpc
import pytest

from ninfer_jax.engine.types import SamplingParams
from server.client import sampling_to_proto
from server.proto import ninfer_pb2 as pb
from server.proto import ninfer_pb2_grpc as pb_grpc
from fakes import FakeEngine, cut_streams, running_server, wait_until

LONG = {"temperature": 0.0, "max_tokens": 200}


@pytest.fixture(scope="module")
def slow_server():
    """Requests of 200 tokens at ~5 ms a step: they are always mid-stream when cut."""
    engine = FakeEngine(max_concurrency=4, max_context=256, step_s=0.005, min_len=200, max_len=200)
    with running_server(engine) as (srv, client):
        yield srv, client, engine
    engine.close()


def test_cancel_mid_stream_frees_everything(slow_server, settled):
    srv, client, engine = slow_server
    before = engine.stats().get("finished_cancelled", 0)
    stream = client.generate_stream([1, 2, 3], sampling=LONG)
    for _ in range(3):
        next(stream)
    assert engine.active_requests() == 1
    stream.cancel()
    with pytest.raises(grpc.RpcError) as info:
        next(stream)
    assert info.value.code() == grpc.StatusCode.CANCELLED
    settled(srv, engine, timeout=2.0)
    assert engine.stats()["finished_cancelled"] == before + 1


def test_channel_close_frees_everything(slow_server, settled):
    srv, _, engine = slow_server
    channel = grpc.insecure_channel(srv.address)
    stream = pb_grpc.NInferStub(channel).Generate(pb.GenerateRequest(text="bye", sampling=sampling_to_proto(LONG)))
    next(stream)
    channel.close()
    settled(srv, engine, timeout=2.0)


def test_client_process_killed_frees_everything(slow_server, settled):
    """A real disconnect: the client process dies mid-stream (os._exit, no goodbye)."""
    srv, _, engine = slow_server
    code = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {os.getcwd()!r})
        from server.client import NInferClient
        stream = NInferClient({srv.address!r}).generate_stream([4, 5, 6], sampling={LONG!r})
        next(stream); next(stream)
        print("streaming", flush=True)
        os._exit(0)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "streaming" in proc.stdout, proc.stderr
    settled(srv, engine, timeout=5.0)


def test_deadline_exceeded_frees_everything(slow_server, settled):
    srv, client, engine = slow_server
    start = time.monotonic()
    with pytest.raises(grpc.RpcError) as info:
        client.generate([7, 7, 7], sampling=LONG, timeout=0.2)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - start < 2.0
    settled(srv, engine, timeout=2.0)


def test_deadline_while_queued_frees_the_queue_slot(slow_server, settled):
    srv, client, engine = slow_server
    busy = [client.generate_stream([i + 1], sampling=LONG) for i in range(4)]
    for s in busy:
        next(s)
    with pytest.raises(grpc.RpcError) as info:
        client.generate([9], sampling=LONG, timeout=0.2)  # waits behind four running requests
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert wait_until(lambda: engine.stats()["waiting"] == 0, 2.0)
    for s in busy:
        s.cancel()
    settled(srv, engine, timeout=2.0)


def test_200_streams_with_random_cancels_and_disconnects(settled):
    """200 concurrent streams on one asyncio client thread: about a third run to the end, a third
    are cancelled after a few messages, a third lose their channel. Every survivor completes with
    exactly the engine's tokens; nothing leaks."""
    engine = FakeEngine(max_concurrency=32, max_context=256, step_s=0.002, min_len=8, max_len=40)
    rng = random.Random(8)
    plan = [rng.choice(("finish", "cancel", "disconnect")) for _ in range(200)]
    prompts = [[rng.randrange(1, 1000) for _ in range(rng.randrange(1, 20))] for _ in range(200)]
    sampling = {"temperature": 0.0, "max_tokens": 40}
    try:
        with running_server(engine) as (srv, _):
            results = cut_streams(srv.address, prompts, plan, sampling, timeout=60)
            settled(srv, engine, timeout=10.0)
            survivors = [i for i in range(200) if plan[i] == "finish"]
            assert len(survivors) > 40
            for i in survivors:
                ids, final = results[i]
                assert final is not None and final.finish_reason in (pb.FINISH_REASON_STOP, pb.FINISH_REASON_LENGTH)
                assert ids == list(engine.generate(prompts[i], SamplingParams(**sampling)).token_ids), i
            stats = engine.stats()
            assert stats["requests_submitted"] >= 200
            assert stats.get("finished_cancelled", 0) >= 1
    finally:
        engine.close()
