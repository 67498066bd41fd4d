"""Redis out of memory, or frozen, for a few seconds mid-batch: workers stay up, every
run finishes.

Two real worker processes run a batch on a private redis-server. The test either sets
``maxmemory`` far below what Redis holds (every write refused with OOM) for a few
seconds, or stops the server with SIGSTOP for longer than the socket timeout (every
command times out), then undoes it, and waits for the batch without any manual resume.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from duet.embedded import EmbeddedRedis
from orchestration import Agent, Team
from tests.support import celery_worker, client_pointed_at, wait_for

pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]

RUNS = 40
#: How long Redis refuses writes, seconds (the fault itself, not a wait for a condition).
OOM_S = 4.0
#: How long Redis is frozen, and the socket timeout the workers use, seconds.
FROZEN_S, SOCKET_TIMEOUT_S = 10.0, 6
#: How long the batch may take to finish once Redis takes writes again.
FINISH_S = 60.0


@dataclass
class Outcome:
    alive: list[bool]
    logs: list[str]
    done: int
    counts: dict[str, int]


@contextlib.contextmanager
def out_of_memory(admin: redis.Redis) -> Iterator[None]:
    admin.config_set("maxmemory", "1")
    try:
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            admin.set("probe", "x")  # the fault is on
        yield
    finally:
        admin.config_set("maxmemory", "0")


@contextlib.contextmanager
def frozen(admin: redis.Redis) -> Iterator[None]:
    pid = int(admin.info("server")["process_id"])
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


FAULTS = {"oom": (out_of_memory, OOM_S), "frozen": (frozen, FROZEN_S)}


@pytest.fixture(scope="module", params=list(FAULTS))
def redis_fault_mid_batch(request: pytest.FixtureRequest) -> Iterator[Outcome]:
    fault, seconds = FAULTS[request.param]
    with EmbeddedRedis() as server, contextlib.ExitStack() as stack:
        admin = redis.Redis(port=server.port)
        # A blocking pop the server answers after its client gave up (a frozen server)
        # loses that message in the broker: the sweep sends its run on after 15 s.
        env = {"DUET_RETRY_BASE_S": "0.2", "DUET_RETRY_MAX_S": "1",
               "DUET_REDIS_SOCKET_TIMEOUT_S": str(SOCKET_TIMEOUT_S),
               "DUET_SWEEP_INTERVAL_S": "2", "DUET_SWEEP_AFTER_S": "15"}  # fmt: skip
        workers = [stack.enter_context(celery_worker(server.url, env=env, concurrency=16, name=n))
                   for n in ("oom1", "oom2")]  # fmt: skip
        stack.enter_context(client_pointed_at(server.url))
        team = Team.actor_critic(
            actor=Agent("Fix.", model="sim?latency_ms=100"),
            critic=Agent("Review.", model="sim?latency_ms=100&scores=0.2,0.4,0.95"),
            max_rounds=3,
        )
        batch = team.submit_batch([f"task {n}" for n in range(RUNS)])
        wait_for(lambda: batch.progress()["done"] >= 3, 60, "a few runs to finish")
        with fault(admin):
            time.sleep(seconds)
        with contextlib.suppress(AssertionError):
            wait_for(lambda: batch.progress()["done"] >= RUNS, FINISH_S, "every run to finish")
        progress = batch.progress()
        # The figures docs/RELIABILITY.md quotes (pytest -rA shows them).
        print(f"{request.param} {seconds}s: {progress['done']}/{RUNS} runs finished "
              f"{progress['counts']}, workers alive {[w.poll() is None for w in workers]}")  # fmt: skip
        yield Outcome(
            alive=[w.poll() is None for w in workers],
            logs=[Path(w.log_path).read_text(errors="replace") for w in workers],
            done=progress["done"],
            counts=progress["counts"],
        )


def test_workers_stay_up(redis_fault_mid_batch: Outcome) -> None:
    assert all(redis_fault_mid_batch.alive), redis_fault_mid_batch.logs
    for log in redis_fault_mid_batch.logs:
        assert "Unrecoverable error" not in log


def test_every_run_finishes(redis_fault_mid_batch: Outcome) -> None:
    assert redis_fault_mid_batch.done == RUNS, redis_fault_mid_batch.counts
    assert set(redis_fault_mid_batch.counts) <= {"approved", "max_rounds_reached"}
