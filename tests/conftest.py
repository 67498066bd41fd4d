"""Shared fixtures: a Redis server of the test session's own, fakeredis for logic tests."""

from __future__ import annotations

import json
import os
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

#: The key variables the tests send to the stand-in server on loopback, over plain HTTP.
#: Workers send a variable only where their operator allowed it (issue 33): this is the
#: test fleet's allowlist (``DUET_KEY_HOSTS``), set before any worker or client reads its
#: settings; workers started by the tests inherit it.
TEST_KEY_VARIABLES = (
    "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
    "DUET_TEST_VENDOR_KEY",
    "DUET_TEST_VENDOR_CRED",
    "DUET_TEST_GATEWAY_KEY",
    "DUET_TEST_OWN_KEY_VAR",
    "DUET_TEST_CRITIC_TOKEN",
    "DUET_TEST_GW_PASSWORD",
    "DUET_TEST_GW_UNSET_PASSWORD",
    "DUET_TEST_GW_PASS",
    "DUET_TEST_STORED_GW_PASS",
    "DUET_TEST_RERUN_KEY",
    "DUET_TEST_UC_KEY",
    "DUET_TEST_UC_EMBEDDED",
    "DUET_TEST_UC_PASSWORD",
    "DUET_TEST_UC_UNSET",
    "DUET_TEST_UC_ADAPTER_PASS",
    "DUET_TEST_UNSET_KEY",
    "TENANT_B_KEY",
    "DUET_TEST_LATE_CRITIC_A",
    "DUET_TEST_LATE_CRITIC_B",
)
#: The stand-in's hosts, and the vendors' (an agent with no base_url is checked as calling
#: its vendor; the tests' workers point OPENAI_BASE_URL / ANTHROPIC_BASE_URL at the stand-in).
TEST_KEY_HOSTS = [
    "http://127.0.0.1",
    "http://localhost",
    "https://api.openai.com",
    "https://api.anthropic.com",
]
os.environ.setdefault(
    "DUET_KEY_HOSTS", json.dumps({name: TEST_KEY_HOSTS for name in TEST_KEY_VARIABLES})
)

#: Tests keep their data apart from anything else on the server: their own db number.
TEST_DB = int(os.environ.get("DUET_TEST_REDIS_DB", "13"))


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """URL of a Redis server this test session started itself, on a free loopback port.

    ``DUET_TEST_REDIS_URL`` wins (a server the caller owns and lets tests flush); otherwise
    the tests never touch a server they did not start, so a user's Redis on 6379 is safe and
    two suites on one machine (or pytest-xdist workers) do not share data.
    """
    explicit = os.environ.get("DUET_TEST_REDIS_URL")
    if explicit:
        yield explicit
        return
    from duet.embedded.server import EmbeddedRedis

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
def decoding_client(redis_url: str) -> Iterator[object]:
    """A client decoding replies (as the workers use one) on the test db, emptied before
    and after the test."""
    import redis

    client = redis.Redis.from_url(redis_url, decode_responses=True)
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


@pytest.fixture(autouse=True)
def _own_call_cache(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each test its own model-call cache file (never the user's ~/.cache/duet), so one
    test's cached answers are never served to another (DUET_CACHE_DIR)."""
    monkeypatch.setenv("DUET_CACHE_DIR", str(tmp_path_factory.mktemp("call-cache")))
