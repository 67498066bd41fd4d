"""A Sentinel failover mid-batch: nothing lost, no model call repeated, the budget exact.

A primary, its replica and three sentinels on loopback; ``DUET_REDIS_URL`` names the
sentinels (``sentinel://…;sentinel://…/0``), so run state goes through redis-py's Sentinel
pool and the broker through kombu's Sentinel transport. Two real worker processes run a
batch against the HTTP stand-in (the real ``openai`` SDK) with a batch budget; mid-batch
``SENTINEL FAILOVER`` promotes the replica. Until the sentinels turn the old primary into
a replica (seconds), clients still connected to it keep writing there, and those writes
are gone when it resyncs from the new one.

With ``DUET_REDIS_MIN_REPLICAS=1`` the writes that must survive (a stored answer and its
settlement, a transition, a claim, a hold) wait for the replica (``WAIT``); on the old
primary, whose replica left, they are not acknowledged and are tried again on the new
one: no call repeated, budget spent == calls made, every run final (a broker message the
failover lost, since kombu's pops and acks wait for no replica, is sent on by the sweep,
here after 45 s: the row counts them). With 0 (no wait) the row
records what happens instead (measured, not asserted). Also with the primary killed
(SIGKILL) instead: the sentinels promote the replica seconds later, and the killed server
is started again (empty) to be the new primary's replica — without one, the writes that
wait for a replica are retried until there is one.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from duet.standin.server import FakeLLM
from orchestration import Agent, Budget, Team
from orchestration.state import keys
from orchestration.state.budgets import BudgetLedger
from tests.faults.conftest import SentinelSet, serve_a_batch
from tests.reliability import CLIENTS, ENGINE, Reliability, lost_of
from tests.support import (
    assert_flower_shows_empty_queues,
    celery_worker,
    client_pointed_at,
    duet_cli,
    environment,
    stored_calls,
    swept_runs,
    wait_for,
)

pytestmark = [pytest.mark.system, pytest.mark.timeout(400)]

RUNS = 50
WORKERS, THREADS = 2, 8
#: Seconds a run may stand still before the sweep sends it on (default 600).
SWEEP_AFTER_S = 45
#: Runs finished before the failover is triggered.
BEFORE = 5
#: How long the batch may take to finish, from the failover (about 30 s on an idle
#: machine; the bar leaves room for a busy one).
FINISH_S = 180.0


@pytest.fixture
def llm() -> Iterator[FakeLLM]:
    with FakeLLM(latency_ms=1000) as server:
        yield server


@pytest.mark.parametrize(
    ("min_replicas", "kill"),
    [
        (1, False),
        (0, False),
        (1, True),
        (None, False),
    ],
    ids=["wait", "no-wait", "wait-primary-killed", "defaults"],
)
def test_sentinel_failover_mid_batch(
    sentinels: SentinelSet,
    llm: FakeLLM,
    min_replicas: int | None,
    kill: bool,
    reliability: Reliability,
) -> None:
    """``min_replicas`` None: the shipped default (``auto``: one, as a replica is there)."""
    shared = {
        **({} if min_replicas is None else {"DUET_REDIS_MIN_REPLICAS": str(min_replicas)}),
        "DUET_REDIS_WAIT_TIMEOUT_S": "1",
        "DUET_REDIS_SENTINEL_MASTER": SentinelSet.MASTER,
    }
    env = {
        **shared,
        "OPENAI_BASE_URL": llm.url,
        "OPENAI_API_KEY": "sk-test-sentinel",
        # The step lease at its default (60 s), longer than the failover stalls the calls
        # in flight: a hold whose lease runs out is charged at its worst case, and its
        # call's settlement charges the real usage as well (an over-count, by design).
        "DUET_RETRY_BASE_S": "0.2",
        "DUET_RETRY_MAX_S": "1",
        "DUET_REDIS_SOCKET_TIMEOUT_S": "6",
        "DUET_REDIS_CONNECT_TIMEOUT_S": "1",
        # A failover may lose a broker message (kombu's pops and acks wait for no replica;
        # without the wait, a run's writes too): the sweep sends such a run on.
        "DUET_SWEEP_AFTER_S": str(SWEEP_AFTER_S),
        "DUET_SWEEP_INTERVAL_S": "5",
    }
    url = sentinels.url
    with contextlib.ExitStack() as stack:
        stack.enter_context(environment(shared))
        workers = [
            stack.enter_context(
                celery_worker(url, env=env, concurrency=THREADS, name=f"sentinel{n}")
            )
            for n in range(WORKERS)
        ]
        stack.enter_context(client_pointed_at(url))
        # Shown with a failure, even one raised mid-wait: one failover or two.
        stack.callback(lambda: print("--- sentinel events ---", *sentinels.events(), sep="\n"))
        team = Team.actor_critic(
            actor=Agent("Fix.", model="openai:sim"),
            critic=Agent("Review.", model="openai:sim?scores=0.2,0.95"),
            max_rounds=2,
        )
        batch = team.submit_batch(
            [f"task {n}" for n in range(RUNS)], budget=Budget(max_calls=100_000)
        )
        wait_for(lambda: batch.progress()["done"] >= BEFORE, 120, "a few runs to finish")
        in_flight = llm.stats()["requests"]
        started = time.monotonic()
        old, new = sentinels.failover(kill=kill)
        with contextlib.suppress(AssertionError):
            wait_for(
                lambda: _progress(sentinels, batch.batch_id)["done"] >= RUNS,
                FINISH_S,
                "every run to finish",
                interval=0.5,
            )
        took = time.monotonic() - started
        progress = _progress(sentinels, batch.batch_id)
        requests = llm.stats()["requests"]
        stored = stored_calls(sentinels.primary_url(), batch.run_ids())
        with redis.Redis.from_url(sentinels.primary_url()) as primary:
            charged = int(BudgetLedger(primary).get(f"batch:{batch.batch_id}").spent.calls)
        logs = [Path(w.log_path).read_text(errors="replace") for w in workers]
        dead_logs = [log for w, log in zip(workers, logs, strict=True) if w.poll() is not None]
        exited = len(dead_logs)
        for run_id in _unfinished(batch.run_ids()):  # shown with the failure below
            lines = [line for log in logs for line in log.splitlines() if run_id in line]
            print(f"--- run {run_id} not final; its log lines ---", *lines[-15:], sep="\n")

    stranded = RUNS - progress["done"]
    twice = max(requests - stored, 0)
    uncharged = max(requests - charged, 0)
    outcomes = ", ".join(f"{n} {status}" for status, n in sorted(progress["counts"].items()))
    setting = (
        "shipped defaults (`DUET_REDIS_MIN_REPLICAS=auto`: writes wait for the replica)"
        if min_replicas is None
        else f"`DUET_REDIS_MIN_REPLICAS={min_replicas}`"
        + (" (writes wait for the replica)" if min_replicas else " (no wait)")
    )
    print(
        f"min_replicas={min_replicas} kill={kill}: failover {old}->{new} after {in_flight} requests; "
        f"{progress['done']}/{RUNS} runs finished ({outcomes}) {took:.0f}s after; "
        f"{requests} requests, {stored} stored calls, {charged} calls charged; "
        f"swept {swept_runs(logs)}; workers exited {exited}"
    )
    lost = [
        lost_of(stranded, RUNS, "runs stranded"),
        lost_of(twice, requests, "model requests beyond one per stored call"),
        lost_of(uncharged, requests, "model calls the budget did not charge"),
        lost_of(exited, WORKERS, "worker processes exited"),
    ]
    reliability.record(
        section=ENGINE,
        fault="Sentinel failover mid-batch ("
        + (
            "the primary killed, `SIGKILL`, and started again empty once the replica is "
            "promoted: it becomes the new primary's replica"
            if kill
            else "`SENTINEL FAILOVER`"
        )
        + f"): a primary, its replica and 3 sentinels on loopback, "
        f"`DUET_REDIS_URL=sentinel://…`; {setting}",
        load=f"{RUNS} runs (4 calls each, a batch budget) on {WORKERS} worker processes × "
        f"{THREADS} threads, the real `openai` SDK against the stand-in (1 s calls); the "
        f"failover after {BEFORE} runs finished; the sweep after {SWEEP_AFTER_S} s",
        lost=f"{'; '.join(x for x in lost if x != 'nothing') or 'nothing'}: "
        f"{progress['done']} of {RUNS} runs finished ({outcomes}) within {took:.0f} s of the "
        f"failover, the sweep sending on {swept_runs(logs)} run(s); the stand-in served "
        f"{requests} requests for {stored} stored calls, the budget charged {charged} calls",
        before="issue 23: `sentinel://` not served; a failover with the old primary "
        "acknowledging writes its replica never got: 98 and 86 repeated model calls in two "
        "trials, 325 calls charged for 398 made",
    )
    for log in dead_logs:  # shown with the failure below
        print(f"--- log of a worker that exited ---\n{log[-6000:]}")
    assert exited == 0
    assert progress["done"] == RUNS, progress
    assert set(progress["counts"]) <= {"approved", "max_rounds_reached"}, progress["counts"]
    if min_replicas != 0:  # without a wait a failover may repeat calls and lose charges
        assert requests == stored, (requests, stored)
        assert charged == requests, (charged, requests)


def _unfinished(run_ids: list[str]) -> list[str]:
    """Which of ``run_ids`` are not final."""
    from orchestration.core.results import FINISHED_STATUSES
    from orchestration.state import keys
    from orchestration.state.connection import get_redis

    statuses = [get_redis().hget(keys.run(run_id), "status") for run_id in run_ids]
    return [r for r, s in zip(run_ids, statuses, strict=True) if s not in FINISHED_STATUSES]


def _progress(sentinels: SentinelSet, batch_id: str) -> dict[str, Any]:
    """The batch's ``done`` and outcome counts as the primary the sentinels name now says
    (a client's pooled connection may read the old primary, demoted, for a moment: its
    writes no replica acknowledged are there and nowhere else); 0 done while it cannot
    say (mid-failover)."""
    try:
        with redis.Redis.from_url(sentinels.primary_url(), socket_timeout=2) as r:
            raw = r.hgetall(keys.batch(batch_id))
    except (redis.RedisError, OSError):
        return {"done": 0, "counts": {}}
    fields = {
        k.decode(): int(v)
        for k, v in raw.items()
        if k.decode() == "done" or k.startswith(b"status:")
    }
    return {
        "done": fields.pop("done", 0),
        "counts": {k.split(":", 1)[1]: n for k, n in fields.items() if n},
    }


def duet_ls(url: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``duet ls`` given ``DUET_REDIS_URL=url`` (and ``env``)."""
    return duet_cli(url, "ls", timeout=60, **env)


def test_worker_cli_and_flower_through_sentinel(
    sentinels: SentinelSet, tmp_path: Path, reliability: Reliability
) -> None:
    """A worker, a batch, `duet ls` and Flower's Broker page, all given the sentinels only."""
    url = sentinels.url
    served = serve_a_batch(url, tmp_path / "flower.log", 5, name="sentinel")
    statuses, listed = served.statuses, served.listed
    (lengths_status, _), (broker_status, _) = served.lengths, served.broker
    sentinels.stop()
    gone = duet_ls(url)  # every sentinel stopped: one line, exit 2
    print(
        f"sentinel: {statuses}; duet ls exit {listed.returncode}; Flower "
        f"/api/queues/length {lengths_status}, /broker {broker_status}; without sentinels "
        f"exit {gone.returncode}: {gone.stderr.strip()}"
    )
    reliability.record(
        section=CLIENTS,
        fault="`DUET_REDIS_URL=sentinel://…;sentinel://…;sentinel://…/0` (3 real sentinels, a "
        "primary and its replica): a worker, a batch, `duet ls`, Flower's Broker page and "
        "`/api/queues/length`; then `duet ls` with every sentinel down",
        load="5 one-round runs on 1 worker × 8 threads",
        lost=f"{lost_of(5 - statuses.count('approved'), 5, 'runs unfinished')}: `duet ls` exit "
        f"{listed.returncode}, Flower's Broker page {broker_status} and `/api/queues/length` "
        f"{lengths_status}; with no sentinel up `duet ls` exit {gone.returncode} in "
        f"{len(gone.stderr.strip().splitlines())} line(s)",
        before="issue 23: `sentinel://` not supported; `duet ls` printed an 84-line "
        "traceback, exit 1",
    )
    assert statuses == ["approved"] * 5, served.worker_log[-3000:]
    assert listed.returncode == 0, listed.stderr
    assert_flower_shows_empty_queues(served.lengths, served.broker)
    assert gone.returncode == 2 and len(gone.stderr.strip().splitlines()) == 1, gone.stderr
    assert "DUET_REDIS_SENTINEL_MASTER" in gone.stderr


SENTINEL_PASSWORD = "sentinel-pass-5x"


@pytest.mark.parametrize("sentinels", [SENTINEL_PASSWORD], indirect=True)
def test_sentinels_with_a_password(sentinels: SentinelSet, reliability: Reliability) -> None:
    """Sentinels with a ``requirepass`` (as managed services run them): a worker and
    ``duet ls`` given ``DUET_REDIS_SENTINEL_PASSWORD``; without it, or with a wrong one,
    one line naming the refused password, exit 2."""
    url = sentinels.url
    login = {"DUET_REDIS_SENTINEL_PASSWORD": SENTINEL_PASSWORD}
    team = Team.actor_critic(
        actor=Agent("Fix.", model="sim"),
        critic=Agent("Review.", model="sim?scores=0.95"),
        max_rounds=1,
    )
    with (
        environment(dict(login)),
        client_pointed_at(url),
        celery_worker(url, env=login, concurrency=8, name="sentinelpw") as worker,
    ):
        batch = team.submit_batch([f"task {n}" for n in range(5)])
        statuses = [r.status for r in batch.results(timeout=90)]
        listed = duet_ls(url, **login)
        worker_log = Path(worker.log_path).read_text(errors="replace")
    without = duet_ls(url)
    wrong = duet_ls(url, DUET_REDIS_SENTINEL_PASSWORD="not-it")
    print(
        f"sentinels with a password: {statuses}; duet ls exit {listed.returncode}; without "
        f"it exit {without.returncode}: {without.stderr.strip()}; wrong: {wrong.stderr.strip()}"
    )
    reliability.record(
        section=CLIENTS,
        fault="Sentinels with a `requirepass` (`DUET_REDIS_SENTINEL_PASSWORD`), then `duet ls` "
        "without it and with a wrong one",
        load="5 one-round runs on 1 worker × 8 threads",
        lost=f"{lost_of(5 - statuses.count('approved'), 5, 'runs unfinished')}: `duet ls` exit "
        f"{listed.returncode}; without the password exit {without.returncode}, with a wrong "
        f"one {wrong.returncode}, each one line naming the refused password",
        before="every command blamed 'no sentinel named a primary ... all down'; the "
        "password was never sent to sentinels",
    )
    assert statuses == ["approved"] * 5, worker_log[-3000:]
    assert listed.returncode == 0, listed.stderr
    for refused in (without, wrong):
        assert refused.returncode == 2, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        assert "refused the password" in refused.stderr
        assert SENTINEL_PASSWORD not in refused.stderr + refused.stdout
    assert SENTINEL_PASSWORD not in worker_log
