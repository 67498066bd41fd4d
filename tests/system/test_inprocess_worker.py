"""The in-process worker (the embedded default's, and a library user's) runs on an event
loop of its own, whatever loop an earlier worker of the process left set."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kombu.asynchronous import Hub, get_event_loop, set_event_loop

from orchestration import Agent, Team
from tests.support import client_pointed_at
from workers.inprocess import InProcessWorker

pytestmark = pytest.mark.system
ROOT = Path(__file__).resolve().parents[2]


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


#: Run in a process of its own: in the test process, another test's embedded worker may
#: still run (the embedded default's lasts until exit), and then the key must be renewed.
_LAST_WORKER_STOPS = """
import json, sys, threading
from orchestration import Agent, Team
from tests.support import client_pointed_at
from workers.inprocess import InProcessWorker

def renewing():
    return sum(t.name == "duet-liveness" and t.is_alive() for t in threading.enumerate())

seen = {}
team = Team.actor_critic(actor=Agent("Fix.", model="sim"), critic=Agent("Review.", model="sim"))
with client_pointed_at(sys.argv[1]):
    first = InProcessWorker(sys.argv[1], concurrency=2).start()
    with InProcessWorker(sys.argv[1], concurrency=2):
        seen["first run"] = team.submit("task").result(timeout=60).status
        seen["while both run"] = renewing()
    seen["while one runs"] = renewing()
    seen["second run"] = team.submit("task 2").result(timeout=60).status
    first.stop()
for thread in threading.enumerate():
    if thread.name == "duet-liveness":
        thread.join(timeout=10)
seen["after both stopped"] = renewing()
print(json.dumps(seen))
"""


def test_the_last_worker_to_stop_stops_renewing_the_liveness_key(
    redis_url: str, redis_client: Any
) -> None:
    """The key names the process's claims; once no worker of it runs, its renewals stop
    (with the embedded default, Redis stops next: each renewal would be a warning)."""
    out = subprocess.run(
        [sys.executable, "-c", _LAST_WORKER_STOPS, redis_url],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {
        "first run": "approved",
        "while both run": 1,
        "while one runs": 1,
        "second run": "approved",
        "after both stopped": 0,
    }
