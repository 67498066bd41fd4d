"""Redis restarted under a worker (with Celery's gossip, mingle and heartbeat on, as a
worker runs by default): the expected reconnect is logged in a line or two, not as
tracebacks ("Error on restarting Gossip", kombu's connection collect).

A real worker process on a private redis-server with an append-only file; the server is
killed and started again mid-batch; the batch finishes; the worker's log is read.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from duet.standin.server import FakeLLM
from orchestration import Agent, Team
from tests.faults.conftest import DurableRedis
from tests.reliability import ENGINE, Reliability, lost_of
from tests.support import celery_worker, client_pointed_at, wait_for

pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]

#: How long Redis stays down (the fault itself, not a wait for a condition).
DOWN_S = 3.0


@pytest.fixture
def llm() -> Iterator[FakeLLM]:
    with FakeLLM(latency_ms=500) as server:
        yield server


def test_a_redis_restart_logs_no_traceback(
    durable_redis: DurableRedis, llm: FakeLLM, reliability: Reliability
) -> None:
    env = {
        "OPENAI_BASE_URL": llm.url,
        "OPENAI_API_KEY": "sk-test-quiet",
        "DUET_REDIS_SOCKET_TIMEOUT_S": "6",
        "DUET_REDIS_CONNECT_TIMEOUT_S": "1",
    }
    with contextlib.ExitStack() as stack:
        worker = stack.enter_context(
            celery_worker(durable_redis.url, env=env, concurrency=8, name="quiet", gossip=True)
        )
        stack.enter_context(client_pointed_at(durable_redis.url))
        team = Team.actor_critic(
            actor=Agent("Fix.", model="openai:sim"),
            critic=Agent("Review.", model="openai:sim?scores=0.2,0.95"),
            max_rounds=2,
        )
        batch = team.submit_batch([f"task {n}" for n in range(20)])
        wait_for(lambda: batch.progress()["done"] >= 2, 60, "a few runs to finish")
        durable_redis.kill()
        time.sleep(DOWN_S)
        durable_redis.start()
        try:
            wait_for(lambda: batch.progress()["done"] >= 20, 180, "every run", interval=0.5)
        except AssertionError as exc:
            tail = Path(worker.log_path).read_text(errors="replace")[-6000:]
            alive = worker.poll() is None
            raise AssertionError(
                f"{exc}; {batch.progress()}; worker alive {alive}:\n{tail}"
            ) from None
        log = Path(worker.log_path).read_text(errors="replace")
    lines = log.splitlines()
    # A log record with a traceback: its line, then the traceback's first line.
    with_traceback = [
        line
        for line, after in zip(lines, lines[1:], strict=False)
        if line.startswith("[") and after.startswith("Traceback (most recent call last)")
    ]
    print(f"{len(with_traceback)} log records with a traceback after a Redis restart")
    print(*with_traceback, sep="\n")
    reliability.record(
        section=ENGINE,
        fault="Redis killed (`SIGKILL`) and started again from its AOF under a worker with "
        "Celery's gossip, mingle and heartbeat on",
        load="20 runs, 1 worker process",
        lost=f"{lost_of(len(with_traceback), 1, 'log records with a traceback')}: the "
        "expected reconnect logged in one line each",
        before="4 records with tracebacks (Error on restarting Gossip, kombu's collect, an "
        "ack flush on close, a reject)",
    )
    assert with_traceback == []
