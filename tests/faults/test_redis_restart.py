"""Redis killed (SIGKILL) and started again from its append-only file mid-batch: every run
finishes within a minute of the kill without a manual resume, and (``appendfsync
always``) no step calls the model twice.

Two real worker processes run a batch against the HTTP stand-in (the real ``openai`` SDK)
on a private redis-server with ``appendfsync always`` or ``everysec`` (the default, which
may lose the last second of writes). Mid-batch the server is killed and, after a moment,
started again on the same port and file. Tasks whose own Redis commands fail are retried
with backoff (not acked away); a step that has its answer keeps trying to store it;
messages the broker lost with the server (a delivery it had not yet noted as
unacknowledged) are sent again by the sweep each worker runs when it sees a new server
(``run_id``), not after ``DUET_SWEEP_AFTER_S`` (left at its 10 min default here).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from duet.standin.server import FakeLLM
from orchestration import Agent, Team
from tests.faults.conftest import DurableRedis
from tests.reliability import ENGINE, Reliability, lost_of
from tests.support import celery_worker, client_pointed_at, stored_calls, swept_runs, wait_for

pytestmark = [pytest.mark.system, pytest.mark.timeout(400)]

RUNS = 60
WORKERS, THREADS = 2, 16
#: How long Redis stays down (the fault itself, not a wait for a condition).
DOWN_S = 3.0
#: How long the batch may take to finish, from the kill.
FINISH_S = 180.0  # the sweep (the failure) is 600 s; loaded machines need room


@pytest.fixture
def llm() -> Iterator[FakeLLM]:
    with FakeLLM(latency_ms=300) as server:
        yield server


@pytest.mark.parametrize("durable_redis", ["always", "everysec"], indirect=True)
def test_redis_killed_and_restarted_mid_batch(
    durable_redis: DurableRedis, llm: FakeLLM, reliability: Reliability
) -> None:
    fsync = durable_redis.appendfsync
    env = {
        "OPENAI_BASE_URL": llm.url,
        "OPENAI_API_KEY": "sk-test-restart",
        "DUET_STEP_LEASE_S": "6",
        "DUET_RETRY_BASE_S": "0.2",
        "DUET_RETRY_MAX_S": "1",
        "DUET_REDIS_SOCKET_TIMEOUT_S": "6",
        "DUET_REDIS_CONNECT_TIMEOUT_S": "1",
    }
    with contextlib.ExitStack() as stack:
        workers = [
            stack.enter_context(
                celery_worker(durable_redis.url, env=env, concurrency=THREADS, name=f"aof{n}")
            )
            for n in range(WORKERS)
        ]
        stack.enter_context(client_pointed_at(durable_redis.url))
        team = Team.actor_critic(
            actor=Agent("Fix.", model="openai:sim"),
            critic=Agent("Review.", model="openai:sim?scores=0.2,0.95"),
            max_rounds=2,
        )
        batch = team.submit_batch([f"task {n}" for n in range(RUNS)])
        wait_for(lambda: batch.progress()["done"] >= 5, 120, "a few runs to finish")
        durable_redis.kill()
        killed = time.monotonic()
        time.sleep(DOWN_S)
        durable_redis.start()
        with contextlib.suppress(AssertionError):
            wait_for(
                lambda: batch.progress()["done"] >= RUNS,
                FINISH_S - (time.monotonic() - killed),
                "every run to finish",
                interval=0.5,
            )
        took = time.monotonic() - killed
        progress = batch.progress()
        requests = llm.stats()["requests"]
        stored = stored_calls(durable_redis.url, batch.run_ids())
        # The figures docs/RELIABILITY.md quotes (pytest -rA shows them).
        print(
            f"{fsync}: killed {DOWN_S}s: {progress['done']}/{RUNS} runs finished "
            f"{progress['counts']} {took:.0f}s after the kill; "
            f"{requests} model requests for {stored} stored calls; "
            f"workers alive {[w.poll() is None for w in workers]}"
        )
        logs = [Path(w.log_path).read_text(errors="replace") for w in workers]
        exited = [w.poll() is not None for w in workers].count(True)
        stranded = RUNS - progress["done"]
        outcomes = ", ".join(f"{n} {status}" for status, n in sorted(progress["counts"].items()))
        twice = max(requests - stored, 0)
        lost = [
            lost_of(stranded, RUNS, "runs stranded"),
            lost_of(twice, requests, "requests beyond one per stored call"),
            lost_of(exited, WORKERS, "worker processes exited"),
        ]
        reliability.record(
            section=ENGINE,
            fault=f"Redis killed (`SIGKILL`) mid-batch and started again {DOWN_S:g} s later from "
            f"its append-only file (`appendfsync {fsync}`)",
            load=f"{RUNS} runs (4 calls each) on {WORKERS} worker processes × {THREADS} threads, "
            "the real `openai` SDK against the stand-in (300 ms calls); lease 6 s, sweep after "
            "the default 10 min",
            lost=f"{'; '.join(x for x in lost if x != 'nothing') or 'nothing'}: {progress['done']} "
            f"of {RUNS} runs finished ({outcomes}) within {took:.0f} s of the kill (bar "
            f"{FINISH_S:g} s) without a resume, the sweep after the restart sending on "
            f"{swept_runs(logs)} run(s); the stand-in served {requests} requests for {stored} "
            f"stored calls; {exited} of {WORKERS} worker processes exited",
            before="issue 23: 59/60 final within 180 s, the last waiting for the sweep "
            "(`DUET_SWEEP_AFTER_S`, 10 min); issue 9 (150 runs): 16 runs stuck in `running` "
            "for ~15 min; a worker process exited in about one run in six",
        )
        dead = [log[-6000:] for w, log in zip(workers, logs, strict=True) if w.poll() is not None]
        for log in dead:  # shown with the failure below
            print(f"--- log of a worker that exited ---\n{log}")
        # A worker waits for Redis and reconnects; one that exited fails the test (before
        # the fix: about one run in six, kombu's "'NoneType' object has no attribute
        # 'hostname'" closing a channel of the lost connection, orchestration/state/broker.py).
        assert not dead, f"{len(dead)} of {WORKERS} worker processes exited after the restart"
        assert progress["done"] == RUNS, progress
        assert took <= FINISH_S, took
        assert set(progress["counts"]) <= {"approved", "max_rounds_reached"}, progress["counts"]
        if fsync == "always":  # everysec may lose a stored answer's last second: called again
            assert requests <= stored, (requests, stored)


def test_a_lost_broker_connection_closes_without_ending_the_worker(
    durable_redis: DurableRedis, reliability: Reliability
) -> None:
    """What a worker's consumer does when Redis dies under it, with the real kombu on a real
    server: its connection holds a delivered, unacknowledged message on the default channel,
    that channel waits in BRPOP, and a second channel consumes a fanout queue deleted on
    close (Celery's pidbox). Redis is killed; Celery's consumer then *collects* the
    connection and closes it (``Consumer.on_connection_error_after_connected``), and a task
    that was running acks its message late, on the lost channel.

    Before the fix the close raised ``AttributeError: 'NoneType' object has no attribute
    'hostname'`` (kombu rebuilding the channel's pool from the collected connection), which
    Celery does not catch: the worker exited (the rare exit of the restart test above).
    """
    from kombu import Consumer, Exchange, Producer, Queue
    from kombu.common import ignore_errors

    from orchestration.state import broker, connection

    conn = broker.Connection(
        durable_redis.url, transport=broker.TRANSPORT, transport_options=connection.socket_options()
    )
    channel = conn.default_channel
    tasks = Queue("restart-tasks", routing_key="restart-tasks")
    Producer(channel).publish({"step": 1}, routing_key="restart-tasks", declare=[tasks])
    delivered: list[Any] = []
    Consumer(channel, [tasks], callbacks=[lambda _body, m: delivered.append(m)]).consume()
    conn.drain_events(timeout=5)
    box = conn.channel()
    Consumer(
        box, [Queue("restart-box", Exchange("restart-box", type="fanout"), auto_delete=True)]
    ).consume()
    with contextlib.suppress(TimeoutError):  # nothing more to read: a BRPOP is left waiting
        conn.drain_events(timeout=0.2)
    assert len(delivered) == 1

    durable_redis.kill()
    errors: list[str] = []
    try:
        conn.collect(socket_timeout=1)  # (Celery ignores any error of this one)
    except Exception as exc:  # noqa: BLE001 - as Celery does
        errors.append(f"collect: {exc!r}")
    for what, call in [
        ("close", lambda: ignore_errors(conn, conn.close)),
        (
            "late ack",
            lambda: delivered[0].ack_log_error(logging.getLogger(__name__), conn.connection_errors),
        ),
    ]:
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - what would have ended the worker
            errors.append(f"{what}: {exc!r}")

    durable_redis.start()  # from its append-only file: the message is still there
    client = redis.Redis.from_url(durable_redis.url)
    # Back in its queue, or noted as unacknowledged (Duet's way, or kombu's): redelivered.
    kept = (
        client.llen("restart-tasks")
        + client.zcard(f"unacked_index{broker.UNACKED_SUFFIX}")
        + client.hlen("unacked")
    )
    client.close()
    reliability.record(
        section=ENGINE,
        fault="Redis killed (`SIGKILL`) under a worker's broker connection: Celery's consumer "
        "collects and closes the lost connection (its default channel waiting in BRPOP, a "
        "second channel with a fanout queue deleted on close), then a running task acks late",
        load="1 delivered, unacknowledged message; the real kombu Redis transport (Duet's)",
        lost=f"{lost_of(len(errors), 3, 'steps raised what ends a worker')}: "
        f"{'; '.join(errors) or 'no error escaped'}; the message kept {kept} time(s) for "
        "redelivery",
        before="the close raised `AttributeError: 'NoneType' object has no attribute "
        "'hostname'` and the worker exited",
    )
    assert errors == []
    assert kept == 1
