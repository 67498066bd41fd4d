"""Tool-using runs through a killed tool worker and a Redis restart: no run lost, no model
call repeated, no call of a tool with effects repeated, budgets charged for exactly the
calls the vendor served.

A batch of runs whose critic calls two tools in each critique: ``record_note`` (effects:
each real execution is a line in a log file) and ``slow_check`` (pure), both taking 2 s.
One worker consumes only the ``tools`` queue; it is killed (SIGKILL) while calls run on
it. A tool with effects it was running is not run again: the model reads that the call
was lost; a pure one is run again by the heir. Then Redis is killed and started again
from its append-only file (``appendfsync always``) mid-batch.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from duet.standin.server import FakeLLM
from orchestration import Agent, Team
from orchestration.client.handles import store
from orchestration.core import events as ev
from orchestration.core.budget import Budget
from orchestration.state.budgets import BudgetLedger
from tests.faults.conftest import DurableRedis
from tests.reliability import ENGINE, Reliability, lost_of
from tests.support import celery_worker, client_pointed_at, stored_calls, wait_for

pytestmark = [pytest.mark.system, pytest.mark.timeout(400)]

RUNS = 8
SLOW_S = 2.0
#: How long Redis stays down (the fault itself, not a wait for a condition).
DOWN_S = 2.0


@pytest.fixture
def llm() -> Iterator[FakeLLM]:
    with FakeLLM(latency_ms=100) as server:
        yield server


def _lines(log: Path) -> list[list[str]]:
    return [line.split() for line in log.read_text().splitlines()] if log.exists() else []


def test_tool_worker_killed_and_redis_restarted(
    durable_redis: DurableRedis, llm: FakeLLM, tmp_path: Path, reliability: Reliability
) -> None:
    log = tmp_path / "tools.log"
    env = {
        "OPENAI_BASE_URL": llm.url,
        "OPENAI_API_KEY": "sk-test-tools-killed",
        "DUET_TOOL_MODULES": "tests.toolsets.sample",
        "DUET_TEST_TOOL_LOG": str(log),
        "DUET_TEST_TOOL_SLOW_S": str(SLOW_S),
        "DUET_STEP_LEASE_S": "6",
        "DUET_PROCESS_TTL_S": "3",
        "DUET_SWEEP_INTERVAL_S": "1",
        "DUET_SWEEP_AFTER_S": "10",
        "DUET_RETRY_BASE_S": "0.2",
        "DUET_RETRY_MAX_S": "1",
        "DUET_REDIS_SOCKET_TIMEOUT_S": "6",
        "DUET_REDIS_CONNECT_TIMEOUT_S": "1",
    }
    url = durable_redis.url
    with contextlib.ExitStack() as stack:
        stack.enter_context(
            celery_worker(
                url, env=env, concurrency=16, name="steps", queues="actor,critic,coordinator"
            )
        )
        doomed = stack.enter_context(
            celery_worker(url, env=env, concurrency=16, name="tools", queues="tools")
        )
        stack.enter_context(client_pointed_at(url))
        team = Team.actor_critic(
            actor=Agent("Fix.", model="openai:sim"),
            critic=Agent(
                'Review. Reply with JSON: {"score": 0..1, "issues": [...]}.',
                model="openai:sim?scores=0.2,0.95&call=record_note,slow_check",
                tools=["record_note", "slow_check"],
            ),
            max_rounds=2,
            persistent_subagents=False,
            budget=Budget(max_calls=100, max_tokens=10_000_000),
        )
        batch = team.submit_batch([f"task {n}" for n in range(RUNS)])
        # Calls running on the tools worker: kill it mid-call.
        wait_for(
            lambda: sum(1 for w in _lines(log) if w[1] == "start") >= 4, 120, "tool calls to run"
        )
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(10)
        killed = {(w[0], w[2], w[3]) for w in _lines(log) if w[1] == "start"} - {
            (w[0], w[2], w[3]) for w in _lines(log) if w[1] == "done"
        }
        stack.enter_context(
            celery_worker(url, env=env, concurrency=16, name="heir", queues="tools")
        )
        wait_for(lambda: batch.progress()["done"] >= 1, 120, "a run to finish")
        durable_redis.kill()
        time.sleep(DOWN_S)
        durable_redis.start()
        results = list(batch.results(timeout=240))
        served = llm.stats()
        ids = [r.run_id for r in results]
        stored = stored_calls(url, ids)
        ledger = BudgetLedger(store().r)
        spent = [ledger.get(f"run:{r.run_id}").spent for r in results]
        charged = sum(s.calls for s in spent)
        effects = Counter(
            (w[2], w[3]) for w in _lines(log) if w[0] == "record_note" and w[1] == "start"
        )
        repeated = sum(n - 1 for n in effects.values())
        lost_calls = [
            e
            for r in results
            for e in r.events
            if e.type == ev.TOOL_RESULT and not e.data.get("ok")
        ]
        finished = [r.status for r in results if r.status in ("approved", "max_rounds_reached")]
        print(
            f"{RUNS} tool-using runs, tools worker killed with {len(killed)} calls running, "
            f"Redis restarted: {len(finished)}/{RUNS} finished; {served['requests']} model "
            f"requests served, {stored} stored, {charged} charged; record_note ran "
            f"{sum(effects.values())} times for {len(effects)} calls; "
            f"{len(lost_calls)} calls ended as tool errors"
        )
        reliability.record(
            section=ENGINE,
            fault=f"The worker running {len(killed)} tool calls killed (`SIGKILL`), then Redis "
            "killed and started again from its append-only file, mid-batch of tool-using runs",
            load=f"{RUNS} runs, a critic calling a tool with effects and a pure one (2 s each) "
            "per critique",
            lost=f"{lost_of(RUNS - len(finished), RUNS, 'runs not finished')}; "
            f"{lost_of(repeated, len(effects), 'effectful calls repeated')}; "
            f"{lost_of(abs(served['requests'] - stored), served['requests'], 'model calls repeated or lost')}",
            before="a tool call was no task of its own: an agent made one model call per run",
        )
        assert len(results) == RUNS and len(finished) == RUNS, [r.status for r in results]
        assert repeated == 0, effects  # no call with effects ran twice
        assert killed, "the kill fell between calls: nothing was running on the worker"
        # Each call with effects the kill cut short ended as a tool error the model read.
        lost = {(e.run_id, e.data["call"]) for e in lost_calls}
        assert {(r, c) for tool, r, c in killed if tool == "record_note"} <= lost
        assert served["requests"] == stored  # no model call repeated, none unaccounted
        assert charged == stored  # the budgets charged exactly the calls made
