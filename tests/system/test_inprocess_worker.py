"""The in-process worker (the embedded default's, and a library user's) runs on an event
loop of its own, whatever loop an earlier worker of the process left set."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from kombu.asynchronous import Hub, get_event_loop, set_event_loop

from orchestration import Agent, Team
from tests.support import client_pointed_at
from workers.inprocess import InProcessWorker

pytestmark = pytest.mark.system


def test_a_worker_does_not_take_a_loop_left_set_by_another(
    redis_url: str, redis_client: Any
) -> None:
    team = Team.actor_critic(
        actor=Agent("Fix.", model="sim"), critic=Agent("Review.", model="sim?scores=0.2,0.95")
    )
    # What an earlier in-process worker whose thread has not ended leaves behind: its hub,
    # still kombu's process-wide loop. Celery's worker takes a loop that is set.
    lingering = set_event_loop(Hub())
    try:
        with client_pointed_at(redis_url), InProcessWorker(redis_url, concurrency=4) as worker:
            assert worker.hub is not None
            assert worker.hub is not lingering, "the worker runs on another worker's loop"
            results = [team.submit(f"task {k}").result(timeout=60) for k in range(2)]
    finally:
        if get_event_loop() is lingering:
            set_event_loop(None)
        lingering.close()
    assert [r.status for r in results] == ["approved", "approved"]


def _liveness_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "duet-liveness"]


def test_the_last_worker_to_stop_stops_renewing_the_liveness_key(
    redis_url: str, redis_client: Any
) -> None:
    """The key names the process's claims; once no worker of it runs, its renewals stop
    (with the embedded default, Redis stops next: each renewal would be a warning)."""
    team = Team.actor_critic(actor=Agent("Fix.", model="sim"), critic=Agent("Review.", model="sim"))
    with client_pointed_at(redis_url):
        first = InProcessWorker(redis_url, concurrency=2).start()
        try:
            with InProcessWorker(redis_url, concurrency=2):
                assert team.submit("task").result(timeout=60).status == "approved"
                assert _liveness_threads(), "a worker that ran a step renews its key"
            # One worker still runs: its claims still need the key renewed.
            assert _liveness_threads()
            assert team.submit("task 2").result(timeout=60).status == "approved"
        finally:
            first.stop()
    for thread in _liveness_threads():
        thread.join(timeout=10)
    assert not _liveness_threads(), "the liveness key is still renewed after every worker stopped"
