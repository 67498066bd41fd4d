"""A worker killed (SIGKILL) with runs of a ``max_in_flight`` batch in flight: their places
are not lost with it, the batch finishes, and the cap held throughout.

Two real worker processes and the real ``openai`` SDK against the stand-in (2 s calls).
The killed worker's runs keep their places (they are started and not finished); the
sweep sends them on once their claims run out, they finish, and each finish hands its
place to a waiting run. A place leaked would leave runs waiting for ever.
"""

from __future__ import annotations

import contextlib
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from duet.embedded.server import EmbeddedRedis
from duet.standin.server import FakeLLM
from orchestration import Agent, Team
from orchestration.client.handles import store
from orchestration.state import keys
from tests.reliability import ENGINE, Reliability, lost_of
from tests.support import (
    celery_worker,
    client_pointed_at,
    peak_in_flight,
    stored_calls,
    wait_for,
)

pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]

RUNS = 8
CAP = 3


@pytest.fixture
def llm() -> Iterator[FakeLLM]:
    with FakeLLM(latency_ms=2000) as server:
        yield server


def test_a_worker_killed_with_capped_runs_in_flight(llm: FakeLLM, reliability: Reliability) -> None:
    env = {
        "OPENAI_API_KEY": "sk-test-gate",
        "DUET_STEP_LEASE_S": "5",
        "DUET_SWEEP_INTERVAL_S": "1",
        "DUET_SWEEP_AFTER_S": "8",
    }
    with EmbeddedRedis() as server, contextlib.ExitStack() as stack:
        stack.enter_context(client_pointed_at(server.url))
        stack.enter_context(
            celery_worker(server.url, env=env, concurrency=8, name="survivor", queues="coordinator")
        )
        doomed = stack.enter_context(
            celery_worker(server.url, env=env, concurrency=8, name="doomed")
        )
        team = Team.actor_critic(
            actor=Agent("Fix.", model="openai:sim", base_url=llm.url),
            critic=Agent("Review.", model="openai:sim:critic?scores=0.95", base_url=llm.url),
            max_rounds=1,
            max_in_flight=CAP,
        )
        batch = team.submit_batch([f"task {n}" for n in range(RUNS)])
        # The first CAP runs' drafts are in flight on the doomed worker: kill it.
        wait_for(lambda: llm.stats()["requests"] >= CAP, 60, "the first calls to be in flight")
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(10)
        r = store().r
        held = r.scard(keys.batch_gate(batch.batch_id))
        stack.enter_context(celery_worker(server.url, env=env, concurrency=8, name="heir"))
        wait_for(lambda: batch.progress()["done"] == RUNS, 120, "every run to finish")
        counts = batch.progress()["counts"]
        peak = peak_in_flight(batch.run_ids())
        left = r.scard(keys.batch_gate(batch.batch_id))
        waiting = r.zcard(keys.batch_waiting(batch.batch_id))
        approved = counts.get("approved", 0)
        print(
            f"kill -9 with {held} capped runs in flight: {approved}/{RUNS} approved, peak "
            f"{peak} (cap {CAP}), {left} places and {waiting} waiting runs left"
        )
        reliability.record(
            section=ENGINE,
            fault=f"A worker killed (`SIGKILL`) with the {CAP} runs a `max_in_flight = {CAP}` "
            "batch may have in flight each mid-call",
            load=f"{RUNS} runs, 2 s calls; lease 5 s, sweep every 1 s after 8 s",
            lost=f"{lost_of(RUNS - approved, RUNS, 'runs not approved')}: peak {peak} runs in "
            f"flight (cap {CAP}); {left} places held and {waiting} runs waiting at the end",
            before="no max_in_flight (new in issue 26)",
        )
        assert held == CAP
        assert counts == {"approved": RUNS}
        assert peak <= CAP
        assert left == 0 and waiting == 0


GATED = 5


def _held(r: Any) -> int:
    """Messages the worker processes noted they hold (their last beats)."""
    return sum(int(r.hlen(k)) for k in r.scan_iter(keys.process_held("*")))


def test_a_gated_batch_moves_on_seconds_after_its_worker_is_killed(
    llm: FakeLLM, reliability: Reliability
) -> None:
    """Shipped defaults (a 60 s lease, a 600 s sweep): the killed worker's liveness key
    lapses, a live worker notices within seconds and sends its claimed steps on, which
    take the dead claims over. Without that, nothing moved until the sweep."""
    env = {"OPENAI_API_KEY": "sk-test-gate"}
    runs = 2 * GATED
    with EmbeddedRedis() as server, contextlib.ExitStack() as stack:
        stack.enter_context(client_pointed_at(server.url))
        survivor = stack.enter_context(
            celery_worker(server.url, env=env, concurrency=8, name="survivor", queues="coordinator")
        )
        doomed = stack.enter_context(
            celery_worker(server.url, env=env, concurrency=8, name="doomed")
        )
        team = Team.actor_critic(
            actor=Agent("Fix.", model="openai:sim", base_url=llm.url),
            critic=Agent("Review.", model="openai:sim:critic?scores=0.95", base_url=llm.url),
            max_rounds=1,
            max_in_flight=GATED,
        )
        batch = team.submit_batch([f"task {n}" for n in range(runs)])
        wait_for(lambda: llm.stats()["requests"] >= GATED, 60, "the first calls to be in flight")
        # Its next beat notes the messages it holds (one of them a second ago or so).
        wait_for(lambda: _held(store().r) >= GATED, 30, "the held messages to be noted")
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(10)
        killed = time.monotonic()
        before = llm.stats()["requests"]
        heir = stack.enter_context(celery_worker(server.url, env=env, concurrency=8, name="heir"))
        wait_for(lambda: llm.stats()["requests"] > before, 60, "a model request after the kill")
        moved = time.monotonic() - killed
        wait_for(lambda: batch.progress()["done"] == runs, 60, "every run to be final")
        final = time.monotonic() - killed
        counts = batch.progress()["counts"]
        requests = llm.stats()["requests"]
        stored = stored_calls(server.url, batch.run_ids())
        repeated = requests - stored
        logs = " ".join(Path(w.log_path).read_text(errors="replace") for w in (survivor, heir))
        put_back = sum(int(n) for n in re.findall(r"put (\d+) of \d+ message", logs))
        print(
            f"kill -9 of a max_in_flight={GATED} batch's worker, shipped defaults: first "
            f"request {moved:.1f}s after the kill, every run final after {final:.1f}s; "
            f"{requests} requests for {stored} stored calls ({repeated} repeated); "
            f"{put_back} held messages put back on their queues"
        )
        reliability.record(
            section=ENGINE,
            fault=f"A worker killed (`SIGKILL`) holding the {GATED} places of a "
            f"`max_in_flight = {GATED}` batch mid-call, a new worker started at once; "
            "shipped defaults (60 s lease, 600 s sweep)",
            load=f"{runs} runs, 2 s calls",
            lost=f"{lost_of(runs - counts.get('approved', 0), runs, 'runs not approved')}: "
            f"runs moving again {moved:.0f} s after the kill, all final after {final:.0f} s; "
            f"{repeated} calls repeated (the {GATED} the dead worker had in flight); its "
            f"{put_back} unacknowledged messages put back on their queues at once",
            before="no request for 604 s, final after 617 s (the sweep)",
        )
        assert counts == {"approved": runs}
        assert repeated <= GATED
        assert put_back == GATED  # the messages of the calls it had in flight
