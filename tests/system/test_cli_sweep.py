"""``duet sweep``: the sweeper as a process of its own, on a real Redis, with a real worker.

Runs are stranded as a lost message strands them (the message deleted from its queue,
the run noted as not having moved for a long time): one before its first transition, one
at a step. ``duet sweep`` sends each on (the transition, the step again) and says so;
``duet sweep --every`` does the same for a run stranded later, until SIGTERM; a worker
started afterwards finishes all of them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest
import redis

from duet.embedded.server import EmbeddedRedis
from orchestration import Agent, Team
from orchestration.client.handles import RunHandle, store
from orchestration.state import keys
from tests.reliability import ENGINE, Reliability, lost_of
from tests.support import celery_worker, client_pointed_at, wait_for

pytestmark = [pytest.mark.system, pytest.mark.timeout(180)]

LONG_AGO = 10_000.0


def _strand(client: redis.Redis, queue: str, run_id: str) -> None:
    """Lose the run's message (its queue emptied) and note it has not moved for hours."""
    client.delete(*(keys.queue_key(queue, p) for p in keys.QUEUE_PRIORITIES))
    _long_ago(client, run_id)


def _long_ago(client: redis.Redis, run_id: str) -> None:
    """The run last moved hours ago (in the index, and in its record once a transition
    noted it there)."""
    at = time.time() - LONG_AGO
    store().touch(run_id, at)
    if client.hexists(keys.run(run_id), "moved_at"):
        client.hset(keys.run(run_id), "moved_at", repr(at))


def test_duet_sweep_sends_stranded_runs_on(reliability: Reliability) -> None:
    with EmbeddedRedis() as server, contextlib.ExitStack() as stack:
        stack.enter_context(client_pointed_at(server.url))
        client = redis.Redis.from_url(server.url, decode_responses=True)
        env = {**os.environ, "DUET_REDIS_URL": server.url, "COLUMNS": "300"}
        env.pop("DUET_BROKER_URL", None)
        team = Team.actor_critic(
            actor=Agent("Fix.", model="sim"), critic=Agent("Review.", model="sim"), max_rounds=1
        )
        queued = team.submit("stranded before its first transition")
        _strand(client, keys.QUEUE_COORDINATOR, queued.run_id)
        # A coordinator-only worker sends the step; the step's message is then lost.
        with celery_worker(server.url, queues="coordinator", name="coord"):
            at_step = team.submit("stranded at its first step")
            wait_for(
                lambda: client.llen(keys.queue_key(keys.QUEUE_ACTOR, keys.DRAFT_PRIORITY)) == 1,
                30,
                "the step to be sent",
            )
        _strand(client, keys.QUEUE_ACTOR, at_step.run_id)

        once = subprocess.run(
            [sys.executable, "-m", "duet", "sweep"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert once.returncode == 0, once.stderr
        lines = once.stdout.splitlines()
        assert f"sent on run {queued.run_id}: transition 0" in lines
        assert f"sent on run {at_step.run_id}: step r0.generate" in lines
        assert lines[-1] == "swept: 2 run(s) sent on (stale after 600 s)"
        assert (
            client.llen(keys.queue_key(keys.QUEUE_COORDINATOR)),
            client.llen(keys.queue_key(keys.QUEUE_ACTOR, keys.DRAFT_PRIORITY)),  # a draft
        ) == (1, 1)
        # Sent on, they count as moved: a second sweep leaves them alone.
        again = subprocess.run(
            [sys.executable, "-m", "duet", "sweep"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert again.stdout.splitlines() == ["swept: 0 run(s) sent on (stale after 600 s)"]

        looping = subprocess.Popen(
            [sys.executable, "-m", "duet", "sweep", "--every", "0.3", "--after", "300"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            later = team.submit("stranded while the sweeper runs")
            client.lrem(
                keys.queue_key(keys.QUEUE_COORDINATOR),
                0,
                *[
                    m
                    for m in client.lrange(keys.queue_key(keys.QUEUE_COORDINATOR), 0, -1)
                    if later.run_id in m
                ],
            )
            _long_ago(client, later.run_id)
            wait_for(
                lambda: client.llen(keys.queue_key(keys.QUEUE_COORDINATOR)) == 2,
                30,
                "the looping sweep to send the run on",
            )
            looping.send_signal(signal.SIGTERM)
            out, err = looping.communicate(timeout=20)
        finally:
            if looping.poll() is None:
                looping.kill()
                looping.wait()
        assert looping.returncode == 0, err
        assert f"sent on run {later.run_id}: transition 0" in out.splitlines()
        assert "sweeper stopped" in err

        stack.enter_context(celery_worker(server.url, name="all"))
        handles = [queued, at_step, RunHandle(later.run_id)]
        statuses = [h.result(timeout=60).status for h in handles]
        finished = sum(s in ("approved", "max_rounds_reached") for s in statuses)
        reliability.record(
            section=ENGINE,
            fault="Runs stranded by a lost message (before their first transition, at a step) "
            "with the sweeper as a process of its own: `duet sweep` once, then "
            "`duet sweep --every` until SIGTERM",
            load=f"{len(handles)} runs, each message deleted from its queue",
            lost=f"{lost_of(len(handles) - finished, len(handles), 'runs unfinished')}: each "
            "sent on once (its transition, or its step again) and finished by the worker "
            "started afterwards; `duet sweep` exit 0, `--every` exit 0 on SIGTERM",
        )
        assert finished == len(handles), statuses
        client.close()
