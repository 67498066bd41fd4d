"""A Redis shared with other apps and written by them: real worker processes, the test's
own redis-server.

A message on a queue that is not JSON or lacks Celery's envelope is dead-lettered with
its reason (``duet dead ls``) while the messages popped with it are delivered and the
worker stays up. Another app's keys named as Duet's queues and as kombu's bookkeeping
(``coordinator``, ``actor``, a string ``critic``, ``unacked``/``unacked_index``,
``celery``) are never read, popped or moved: the broker's keys are under Duet's prefix.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from kombu.utils.json import dumps

from duet.embedded.server import EmbeddedRedis
from orchestration import Agent, Team
from orchestration.state import deadletters, keys
from tests.faults.conftest import Monitor
from tests.reliability import CLIENTS, Reliability, lost_of
from tests.support import ROOT, celery_worker, client_pointed_at, stock_libraries, wait_for

pytestmark = [pytest.mark.system, pytest.mark.timeout(240)]

RUNS = 30
#: Not JSON; JSON without ``properties`` (Celery's envelope).
POISON = {
    "not JSON": "this is {not JSON",
    "no 'properties' object": '{"body": "W10=", "headers": {"task": "duet.coordinate"}}',
}


def _team() -> Team:
    return Team.actor_critic(
        actor=Agent("Fix.", model="sim"),
        critic=Agent("Review.", model="sim?scores=0.95"),
        max_rounds=1,
    )


def test_poison_messages_among_runs_are_dead_lettered(reliability: Reliability) -> None:
    with EmbeddedRedis() as server, contextlib.ExitStack() as stack:
        stack.enter_context(client_pointed_at(server.url))
        admin = stack.enter_context(redis.Redis.from_url(server.url, decode_responses=True))
        team = _team()
        # All queued before the worker starts: its first pops take the poison together
        # with good messages (a pop takes up to 16).
        first = team.submit_batch([f"task {n}" for n in range(RUNS // 2)])
        for text in POISON.values():
            admin.lpush(keys.queue_key(keys.QUEUE_COORDINATOR), text)
        second = team.submit_batch([f"task {n}" for n in range(RUNS // 2, RUNS)])
        started = time.monotonic()
        worker = stack.enter_context(celery_worker(server.url, concurrency=16, name="poisoned"))
        statuses = [r.status for b in (first, second) for r in b.results(timeout=90)]
        took = time.monotonic() - started
        alive = worker.poll() is None
        listed = subprocess.run(
            [sys.executable, "-m", "duet", "dead", "ls"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "DUET_REDIS_URL": server.url},
        )
        letters = deadletters.newest(admin)
        log = Path(worker.log_path).read_text(errors="replace")
        finished = statuses.count("approved")
        print(
            f"{len(POISON)} poison messages among {RUNS} runs: {finished} approved in "
            f"{took:.1f} s; worker alive: {alive}; dead letters: "
            f"{[(d.queue, d.reason) for d in letters]}"
        )
        reliability.record(
            section=CLIENTS,
            fault="A non-JSON message and a JSON message without `properties` (Celery's "
            "envelope) pushed onto the coordinator queue among a batch's messages, popped "
            "together with good ones",
            load=f"{RUNS} one-round runs queued before 1 worker × 16 threads starts",
            lost=f"{lost_of(RUNS - finished, RUNS, 'runs unfinished')}: the worker stayed up; "
            f"both poison messages are in `duet dead ls` with their reasons; {finished} of "
            f"{RUNS} runs approved {took:.0f} s after the worker was started",
            before="the non-JSON message ended the worker (`Unrecoverable error: "
            "JSONDecodeError`) and the messages popped with it were stranded until the sweep; "
            "the one without `properties` logged 'Connection to broker lost (KeyError)' and "
            "stranded its pop's runs",
        )
        assert alive, log[-3000:]
        assert statuses == ["approved"] * RUNS
        assert sorted(d.text for d in letters) == sorted(POISON.values())
        for d in letters:
            reason = next(r for r, text in POISON.items() if text == d.text)
            assert d.queue == keys.QUEUE_COORDINATOR and d.reason.startswith(reason), d
        assert listed.returncode == 0, listed.stderr
        assert "Dead letters (2)" in listed.stdout and "not JSON" in listed.stdout
        assert "Unrecoverable error" not in log and "Connection to broker lost" not in log


def _foreign_keys(client: Any) -> dict[str, bytes]:
    """Another app's keys, named as Duet's queues and kombu's own keys once were: a
    Celery-style message in its ``coordinator`` and ``actor`` lists, a string ``critic``,
    a message its kombu left unacknowledged an hour ago, its ``celery`` queue and its
    bindings. Their DUMPs."""
    message = {
        "body": "W10=",
        "content-type": "application/json",
        "headers": {"task": "theirs"},
        "properties": {
            "delivery_tag": "their-tag",
            "body_encoding": "base64",
            "delivery_info": {"exchange": "theirs", "routing_key": "theirs"},
        },
    }
    client.rpush("coordinator", dumps(message), "their second job")
    client.rpush("actor", dumps(message))
    client.set("critic", "their setting")
    client.hset("unacked", "their-tag", dumps([message, "theirs", "theirs"]))
    client.zadd("unacked_index", {"their-tag": time.time() - 3600})
    client.rpush("celery", "their celery job")
    client.sadd("_kombu.binding.coordinator", "their binding")
    names = [
        "coordinator",
        "actor",
        "critic",
        "unacked",
        "unacked_index",
        "celery",
        "_kombu.binding.coordinator",
    ]
    return {name: client.dump(name) for name in names}


def test_a_foreign_apps_keys_in_the_same_database_are_untouched(
    reliability: Reliability,
) -> None:
    runs = 20
    # A short visibility timeout: the workers scan for unacknowledged messages every
    # second (kombu's scan once moved the foreign ``unacked`` message into ``celery``).
    env = {"DUET_VISIBILITY_TIMEOUT_S": "5", "DUET_CHECK_TIMEOUTS": "false"}
    with EmbeddedRedis() as server, contextlib.ExitStack() as stack:
        stack.enter_context(client_pointed_at(server.url))
        admin = stack.enter_context(redis.Redis.from_url(server.url))
        before = _foreign_keys(admin)
        monitor = Monitor(server.port)
        stack.callback(monitor.stop)
        workers = [
            stack.enter_context(
                celery_worker(server.url, env=env, concurrency=8, name=f"sharing{n}")
            )
            for n in (1, 2)
        ]
        batch = _team().submit_batch([f"task {n}" for n in range(runs)])
        statuses = [r.status for r in batch.results(timeout=90)]
        # A restore scan after the batch (on Duet's own, prefixed, index).
        seen = len(monitor.text())
        scan = f'"ZRANGE" "{keys.BROKER_PREFIX}unacked_index"'.encode()
        wait_for(lambda: scan in monitor.text()[seen:], 30, "a restore scan after the batch")
        after = {name: admin.dump(name) for name in before}
        changed = sorted(name for name in before if after[name] != before[name])
        alive = [w.poll() is None for w in workers]
        strays = sorted(
            k.decode()
            for k in admin.scan_iter(count=1000)
            if not k.decode().startswith((f"{keys.PREFIX}:", keys.BROKER_PREFIX))
            and k.decode() not in before
        )
        finished = statuses.count("approved")
        print(
            f"shared db: {finished}/{runs} approved; foreign keys changed: {changed}; "
            f"workers alive: {alive}; keys outside Duet's prefixes: {strays}"
        )
        reliability.record(
            section=CLIENTS,
            fault="A Redis database shared with another app: its lists `coordinator` and "
            "`actor` (Celery-style messages), a string `critic`, a message its kombu left "
            "unacknowledged (`unacked`, `unacked_index`), its `celery` list and bindings",
            load=f"{runs} one-round runs on 2 workers × 8 threads; restore scans every second",
            lost=f"{lost_of(len(changed), len(before), 'foreign keys changed')} (DUMP before "
            f"and after); {finished} of {runs} runs approved; both workers up; no key written "
            "outside `duet:` and `duet.`",
            before="a worker popped and deleted the other app's `coordinator` list, the string "
            "`critic` ended the worker (`WRONGTYPE`), and kombu's restore moved the foreign "
            "`unacked` message into a `celery` list",
        )
        assert statuses == ["approved"] * runs
        assert changed == [] and all(alive) and strays == []


def test_poison_messages_on_kombus_stock_transport_do_not_end_the_worker(
    reliability: Reliability,
) -> None:
    """With ``DUET_FAST_PATHS=off`` (kombu's stock transport, one message a pop) a poison message cannot be dead-lettered, but it must not end the worker."""
    with EmbeddedRedis() as server, contextlib.ExitStack() as stack:
        env = stack.enter_context(stock_libraries())
        stack.enter_context(client_pointed_at(server.url))
        admin = stack.enter_context(redis.Redis.from_url(server.url, decode_responses=True))
        team = _team()
        first = team.submit_batch([f"task {n}" for n in range(RUNS // 2)])
        for text in POISON.values():
            admin.lpush(keys.queue_key(keys.QUEUE_COORDINATOR), text)  # prefixed on stock too
        second = team.submit_batch([f"task {n}" for n in range(RUNS // 2, RUNS)])
        started = time.monotonic()
        worker = stack.enter_context(
            celery_worker(server.url, concurrency=16, name="poisoned-stock", env=env)
        )
        statuses = [r.status for b in (first, second) for r in b.results(timeout=90)]
        took = time.monotonic() - started
        alive = worker.poll() is None
        log = Path(worker.log_path).read_text(errors="replace")
        finished = statuses.count("approved")
        left = admin.lrange(keys.queue_key(keys.QUEUE_COORDINATOR), 0, -1)
        print(
            f"stock transport: {len(POISON)} poison messages among {RUNS} runs: {finished} "
            f"approved in {took:.1f} s; worker alive: {alive}; left queued: {left}"
        )
        reliability.record(
            section=CLIENTS,
            fault="The same two poison messages among a batch's, with `DUET_FAST_PATHS=off` "
            "(kombu's stock Redis transport: no dead-letter list, it pops one message at a "
            "time)",
            load=f"{RUNS} one-round runs queued before 1 worker × 16 threads starts",
            lost=f"{lost_of(RUNS - finished, RUNS, 'runs unfinished')}: the worker stayed up "
            f"(its consumer reconnects past each poison message, which is dropped with an "
            f"error in the log); {finished} of {RUNS} runs approved {took:.0f} s after the "
            "worker was started",
            before="issue 23: the non-JSON message ended the worker",
        )
        assert alive, log[-3000:]
        assert statuses == ["approved"] * RUNS
        assert "Unrecoverable error" not in log
        assert "JSONDecodeError" in log and "KeyError" in log  # each poison message named
