"""System-test fixtures: a real Celery worker process on a real Redis."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from duet.standin.server import FakeLLM
from tests.support import celery_worker, client_pointed_at

ROOT = Path(__file__).resolve().parents[2]
#: System tests share one worker per session; they keep to their own db and ids.
SYSTEM_DB = int(os.environ.get("DUET_SYSTEM_REDIS_DB", "14"))


def _with_db(url: str, db: int) -> str:
    base, _, _ = url.rpartition("/")
    return f"{base}/{db}"


@pytest.fixture(scope="session")
def system_redis_url(redis_url: str) -> Iterator[str]:
    """The test Redis on the system tests' own db, emptied once at the start."""
    import redis

    url = _with_db(redis_url, SYSTEM_DB)
    client = redis.Redis.from_url(url)
    client.flushdb()
    client.close()
    yield url


@pytest.fixture(scope="session")
def fake_llm() -> Iterator[object]:
    """The local stand-in for the vendors' HTTP APIs."""
    from duet.standin.server import FakeLLM

    with FakeLLM() as server:
        yield server


@pytest.fixture(scope="module")
def stand_in() -> Iterator[FakeLLM]:
    """The vendors' HTTP stand-in, one per module (its request log that module's own)."""
    with FakeLLM() as server:
        yield server


@pytest.fixture(scope="module")
def tool_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The file the test toolset logs a module's tool calls to (one line a call)."""
    return tmp_path_factory.mktemp("tools") / "calls.log"


@pytest.fixture(scope="session")
def worker(system_redis_url: str) -> Iterator[subprocess.Popen[bytes]]:
    """One real worker process for the session, with a fake key for the stand-in."""
    with celery_worker(system_redis_url, env={"OPENAI_API_KEY": "sk-test-not-a-secret"}) as proc:
        yield proc


@pytest.fixture
def client_on(system_redis_url: str) -> Iterator[str]:
    """Point this process's client API at the system-test Redis."""
    with client_pointed_at(system_redis_url) as url:
        yield url
