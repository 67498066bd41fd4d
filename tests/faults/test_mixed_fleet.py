"""A mixed fleet (one worker on Duet's transport, one on kombu's stock one): the worker
killed (SIGKILL) mid-batch leaves its messages unacknowledged, and the other puts them back
after the visibility timeout, whichever way each runs. The unacknowledged format does not
depend on ``DUET_FAST_PATHS``, so a rolling upgrade that turns a path off on one machine
strands nothing."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator

import pytest
import redis

from duet.embedded.server import EmbeddedRedis
from duet.standin.server import FakeLLM
from orchestration import Agent, Team
from orchestration.client.handles import store
from orchestration.state.broker import UNACKED_SUFFIX
from orchestration.state.keys import ALL_QUEUES, BROKER_PREFIX, QUEUE_PRIORITIES, queue_key
from tests.reliability import ENGINE, Reliability, lost_of
from tests.support import celery_worker, client_pointed_at, stored_calls, wait_for

pytestmark = [pytest.mark.system, pytest.mark.timeout(240)]

RUNS = 8
#: Longer than the doomed worker takes to pop and start every first call (its own restore
#: would put back live messages past it), short enough to wait for.
VISIBILITY_S = 12
#: The switch of each kind of worker: Duet's transport alone, or the stock libraries.
SWITCHES = {"fast": "auto", "stock": "off"}


@pytest.fixture
def llm() -> Iterator[FakeLLM]:
    # Calls that last until the kill (the other worker starts meanwhile), short after it.
    with FakeLLM(latency_ms=60_000) as server:
        yield server


def _stranded(r: redis.Redis) -> int:
    """Messages noted as unacknowledged (Duet's set, or kombu's index), or still queued."""
    noted = r.zcard(f"{BROKER_PREFIX}unacked_index{UNACKED_SUFFIX}")
    noted += r.zcard(f"{BROKER_PREFIX}unacked_index")
    queued = sum(r.llen(queue_key(q, p)) for q in ALL_QUEUES for p in QUEUE_PRIORITIES)
    return int(noted + queued)


@pytest.mark.parametrize("killed", ["fast", "stock"])
def test_a_mixed_fleet_restores_what_either_worker_held(
    llm: FakeLLM, reliability: Reliability, killed: str
) -> None:
    survivor_kind = "stock" if killed == "fast" else "fast"
    env = {
        "OPENAI_API_KEY": "sk-test-mixed",
        "DUET_VISIBILITY_TIMEOUT_S": str(VISIBILITY_S),
        "DUET_CHECK_TIMEOUTS": "false",
        # No sweep: only the broker's restore can move the dead worker's runs on.
        "DUET_SWEEP_IN_WORKER": "false",
        # A redelivered step sees the dead delivery's process gone and takes it over.
        "DUET_PROCESS_TTL_S": "3",
    }
    with EmbeddedRedis() as server, contextlib.ExitStack() as stack:
        stack.enter_context(client_pointed_at(server.url))
        admin = store().r
        # The survivor takes only coordinator work until the kill (so the doomed worker
        # holds every first call); an heir of its kind takes the steps after it.
        survivor_env = {**env, "DUET_FAST_PATHS": SWITCHES[survivor_kind]}
        stack.enter_context(
            celery_worker(
                server.url,
                env=survivor_env,
                concurrency=RUNS,
                name=f"survivor-{survivor_kind}",
                queues="coordinator",
            )
        )
        doomed = stack.enter_context(
            celery_worker(
                server.url,
                env={**env, "DUET_FAST_PATHS": SWITCHES[killed]},
                concurrency=RUNS,
                name=f"doomed-{killed}",
            )
        )
        team = Team.actor_critic(
            actor=Agent("Fix.", model="openai:sim", base_url=llm.url),
            critic=Agent("Review.", model="openai:sim:critic?scores=0.95", base_url=llm.url),
            max_rounds=1,
        )
        batch = team.submit_batch([f"task {n}" for n in range(RUNS)])
        wait_for(lambda: llm.stats()["requests"] >= RUNS, 60, "the calls to be in flight")
        held = _stranded(admin)
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(10)
        llm.set_faults(latency_ms=50)
        killed_at = time.monotonic()
        # Without a restore the runs never finish (no sweep): the wait fails.
        stack.enter_context(
            celery_worker(server.url, env=survivor_env, concurrency=RUNS, name="heir")
        )
        with contextlib.suppress(AssertionError):
            wait_for(
                lambda: batch.progress()["done"] == RUNS and _stranded(admin) == 0,
                VISIBILITY_S * 6,
                "every run to finish",
            )
        took = time.monotonic() - killed_at
        counts = batch.progress()["counts"]
        stranded = _stranded(admin)
        requests = llm.stats()["requests"]
        stored = stored_calls(server.url, batch.run_ids())
        approved = counts.get("approved", 0)
        print(
            f"mixed fleet, {killed} worker killed holding {held} messages: {counts}, "
            f"{stranded} stranded, {took:.1f} s after the kill; {requests} requests, "
            f"{stored} stored"
        )
        reliability.record(
            section=ENGINE,
            fault=f"A mixed fleet (one worker on Duet's transport, one on kombu's stock one): "
            f"the {killed} one killed (`SIGKILL`) holding every run's first call; no sweep, "
            f"visibility timeout {VISIBILITY_S} s",
            load=f"{RUNS} one-round runs, calls held until the kill, 2 workers x {RUNS} threads",
            lost=f"{lost_of(RUNS - approved, RUNS, 'runs unfinished')}; "
            f"{lost_of(stranded, max(held, 1), 'messages stranded')}: the {survivor_kind} "
            f"worker put back the {held} held messages; every run finished {took:.0f} s after "
            "the kill",
            before="the unacknowledged format depended on `DUET_FAST_PATHS`: a stock worker "
            "never restored a message a fast-path worker died holding",
        )
        assert held > 0, "the doomed worker held nothing when killed (no fault met)"
        assert counts == {"approved": RUNS}
        assert stranded == 0
        # The dead calls, then each run's calls once.
        assert requests == stored + RUNS
