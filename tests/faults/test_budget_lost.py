"""A fleet-wide budget's hash gone mid-batch (evicted, or deleted by hand): the runs stop
with ``budget:limit_lost`` instead of spending on without a cap, and none is stranded."""

from __future__ import annotations

import pytest
import redis

from duet.embedded.server import EmbeddedRedis
from orchestration import Agent, Team
from orchestration.core.budget import Budget
from orchestration.state import keys
from orchestration.state.budgets import LIMIT_LOST, BudgetLedger
from tests.reliability import CLIENTS, Reliability
from tests.support import celery_worker, client_pointed_at, wait_for

pytestmark = [pytest.mark.system, pytest.mark.timeout(200)]

RUNS = 20
SCOPE = "global:lost-test"
THREADS = 2


def test_runs_stop_when_their_budget_limit_is_gone(
    private_redis: EmbeddedRedis, reliability: Reliability
) -> None:
    admin = redis.Redis(port=private_redis.port, decode_responses=True)
    BudgetLedger(admin).set_limits(SCOPE, Budget(max_calls=10_000))
    with (
        celery_worker(private_redis.url, concurrency=THREADS, name="lost"),
        client_pointed_at(private_redis.url),
    ):
        team = Team.actor_critic(
            actor=Agent("Fix.", model="sim?latency_ms=300"),
            critic=Agent("Review.", model="sim?latency_ms=300&scores=0.2,0.4,0.95"),
            max_rounds=3,
            global_budgets=["lost-test"],
        )
        batch = team.submit_batch([f"task {n}" for n in range(RUNS)])
        wait_for(lambda: batch.progress()["done"] >= 1, 60, "a run to finish")
        admin.delete(keys.budget(SCOPE))  # what an eviction does
        at_loss = batch.progress()["done"]
        wait_for(lambda: batch.progress()["done"] >= RUNS, 90, "every run to end")
        results = list(batch.results())
    stopped = [r for r in results if (r.interruption_reason or "").endswith(LIMIT_LOST)]
    spent_after = int(admin.hget(keys.budget(SCOPE), "spent:calls") or 0)
    reliability.record(
        section=CLIENTS,
        fault="a fleet-wide budget's hash deleted (as an eviction would) mid-batch",
        load=f"{RUNS} runs on 1 worker × {THREADS} threads, charged to `{SCOPE}`",
        lost=f"nothing: {len(stopped)} of {RUNS} runs stopped with `{LIMIT_LOST}`, the rest "
        f"had finished; {spent_after} calls settled after the loss (in flight then, at most "
        f"{THREADS})",
        before="the scope counted as unlimited: every run went on spending, the cap gone",
    )
    assert stopped, (at_loss, [r.status for r in results])
    assert all(r.status == "interrupted" for r in stopped)
    assert spent_after <= THREADS, spent_after  # only the calls already in flight
