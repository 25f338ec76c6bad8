"""`ninfer generate|chat --server=HOST:PORT` against a loopback server, and `ninfer bench serve`."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ninfer_jax.engine.types import SamplingParams
from fakes import FakeEngine, running_server


@pytest.fixture(scope="module")
def guarded():
    engine = FakeEngine()
    with running_server(engine, token="tok") as (srv, client):
        yield srv, engine
    engine.close()


def _ninfer(*args, env_extra=None):
    env = dict(os.environ, **(env_extra or {}))
    env.pop("NINFER_TOKEN", None) if not env_extra else None
    return subprocess.run([sys.executable, "-m", "server.cli", *args], capture_output=True, text=True,
                          timeout=60, env=env, cwd=os.getcwd())


def test_generate_and_chat_through_the_server(guarded):
    srv, engine = guarded
    out = _ninfer("generate", f"--server={srv.address}", "--prompt=Tell me", "--max_tokens=5", "--token=tok")
    assert out.returncode == 0, out.stderr
    want = engine.generate("Tell me", SamplingParams(temperature=0.0, seed=0, max_tokens=5))
    assert out.stdout == want.text + "\n"
    assert "finish_reason=length" in out.stderr and "completion_tokens=5" in out.stderr

    out = _ninfer("chat", f"--server={srv.address}", '--messages=[{"role": "user", "content": "hey"}]',
                  "--max_tokens=6", env_extra={"NINFER_TOKEN": "tok"})
    assert out.returncode == 0, out.stderr
    want = engine.chat([{"role": "user", "content": "hey"}], sampling=SamplingParams(temperature=0.0, max_tokens=6))
    assert out.stdout == want.text + "\n"


def test_remote_errors_are_reported(guarded):
    srv, _ = guarded
    out = _ninfer("generate", f"--server={srv.address}", "--token_ids=5000", "--token=tok")
    assert out.returncode == 1 and "INVALID_ARGUMENT" in out.stderr and "vocabulary" in out.stderr


def test_bench_serve_reports_ratios_on_the_fake_engine():
    from ninfer_jax.bench import load
    from server.cli import BENCHES

    assert BENCHES["serve"] == "server.serve_bench"
    figures = load("serve", BENCHES).run(["--fake", "--requests=12", "--concurrency=4", "--max_tokens=4", "--http"])
    for key in ("inprocess_requests_per_s", "served_requests_per_s", "requests_per_s_ratio",
                "inprocess_ttft_p50_ms", "served_ttft_p99_ms", "ttft_p50_ratio", "ttft_p99_ratio",
                "http_requests_per_s", "http_ttft_p99_ms", "http_vs_inprocess_requests_per_s_ratio",
                "http_vs_grpc_requests_per_s_ratio", "http_vs_grpc_ttft_p50_ratio"):
        assert figures[key] > 0, key
    assert figures["engine"] == "fake"


def test_client_imports_without_jax():
    """A client (and `ninfer generate --server`) never pays for JAX or the engine."""
    code = "import sys, server.client, server.cli_commands; print(sorted(m for m in ('jax', 'ninfer_jax.engine') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=os.getcwd())
    assert out.stdout.strip() == "[]", out.stderr
