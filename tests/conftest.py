"""Shared fixtures: a Redis for tests (the machine's, on its own db, else an embedded one)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

# The rows of docs/RELIABILITY.md: the `reliability` fixture and the hooks that keep each
# row's outcome and write them at the end of the session (tests/reliability.py).
from tests.reliability import (  # noqa: F401
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_runtest_makereport,
    pytest_sessionfinish,
    reliability,
)

#: Tests keep their data apart from anything else on the server: their own db number.
TEST_DB = int(os.environ.get("DUET_TEST_REDIS_DB", "13"))


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.3):
            return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """URL of a real Redis for this test session.

    ``DUET_TEST_REDIS_URL`` wins; else 127.0.0.1:6379 on db 13 when it answers; else an
    embedded server started for the session.
    """
    explicit = os.environ.get("DUET_TEST_REDIS_URL")
    if explicit:
        yield explicit
        return
    if _reachable("127.0.0.1", 6379):
        yield f"redis://127.0.0.1:6379/{TEST_DB}"
        return
    from duet.embedded import EmbeddedRedis

    with EmbeddedRedis() as server:
        yield f"redis://127.0.0.1:{server.port}/{TEST_DB}"


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[object]:
    """A client on the test db, emptied before and after the test."""
    import redis

    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture
def fake_redis() -> Iterator[object]:
    """An in-memory fakeredis with Lua support, for fast unit tests of Redis logic."""
    import fakeredis

    client = fakeredis.FakeRedis()
    yield client
    client.flushall()
