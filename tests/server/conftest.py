"""Fixtures of the server tests: one fake engine and one loopback server per module."""
from __future__ import annotations

import pytest

from fakes import FakeEngine, running_server, wait_until


@pytest.fixture(scope="module")
def fake_engine():
    engine = FakeEngine(max_concurrency=8, max_context=512, step_s=0.001)  # a chat with one tool is ~270 tokens
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def fake_server(fake_engine):
    """(server, client, engine) on 127.0.0.1, a free port."""
    with running_server(fake_engine) as (srv, client):
        yield srv, client, fake_engine


def engine_requests(engine) -> int:
    """Requests the engine still holds: the fake counts them; the real engine reports residents
    (admitted, holding resources) and queued ones in stats()."""
    if hasattr(engine, "active_requests"):
        return engine.active_requests()
    stats = engine.stats()
    return stats["residents"] + stats["queued"]


@pytest.fixture
def settled():
    """A function asserting that nothing is left running in a server and its engine."""

    def check(srv, engine, timeout: float = 5.0):
        assert wait_until(lambda: srv.servicer.active_count() == 0, timeout), "streams still registered"
        assert wait_until(lambda: engine_requests(engine) == 0, timeout), \
            f"{engine_requests(engine)} requests still in the engine"
        engine.check_integrity()

    return check
