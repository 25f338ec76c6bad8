"""Fixtures of the server tests: one fake engine and one loopback server per module."""
from __future__ import annotations

import pytest

from server.testing import FakeEngine, running_server, wait_until


@pytest.fixture(scope="module")
def fake_engine():
    engine = FakeEngine(max_concurrency=8, max_context=256, step_s=0.001)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def fake_server(fake_engine):
    """(server, client, engine) on 127.0.0.1, a free port."""
    with running_server(fake_engine) as (srv, client):
        yield srv, client, fake_engine


@pytest.fixture
def settled():
    """A function asserting that nothing is left running in a server and its engine."""

    def check(srv, engine, timeout: float = 5.0):
        assert wait_until(lambda: srv.servicer.active_count() == 0, timeout), "streams still registered"
        idle = getattr(engine, "active_requests", None)
        if idle is not None:
            assert wait_until(lambda: idle() == 0, timeout), f"{idle()} requests still in the engine"
        engine.check_integrity()

    return check
