"""Memory: once a batch's runs have finished, every key they wrote expires (the finished
TTL), their budget scopes included; only the few fleet-wide keys stay.

Runs go through the store as the coordinator and the steps drive them (create, a step
transition, begin, a budget reservation and settlement with the stored result, finish),
on a real server.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from orchestration.core.budget import Amount, Budget
from orchestration.services.budgeting import Budgets
from orchestration.state import keys
from orchestration.state.budgets import BudgetLedger
from orchestration.state.runs import RunRecord, RunStore
from tests.reliability import ENGINE, Reliability, lost_of

TTL = 600
#: Keys shared by the whole fleet, not by a run or batch (they hold a few entries each,
#: or one per *open* run).
#: (The fleet scope's holds hash keeps the mark that it has a limit: see budget_common.lua.)
FLEET_KEYS = {
    keys.batches_index(),
    keys.budget_index(),
    keys.budget("global:fleet"),
    keys.budget_holds("global:fleet"),
}


@pytest.fixture
def client(redis_client: Any, redis_url: str) -> Iterator[Any]:
    decoded = redis.Redis.from_url(redis_url, decode_responses=True)
    yield decoded
    decoded.close()


def _finish_run(store: RunStore, budgets: Budgets, run_id: str, scopes: list[str]) -> None:
    run = store.r.hgetall(keys.run(run_id))
    assert store.record_step(run, 0, "r0.generate", {"prompt": "p", "pause": "x"}, []) == 1
    start = store.begin_step(run_id, "r0.generate", "c1", 30, '{"e":1}')
    assert start.outcome == "go"
    sid = f"{run_id}:r0.generate:c1"
    assert budgets.reserve(sid, scopes, Amount(input_tokens=10, output_tokens=10), 30) is None
    settle = budgets.settle_calls(sid, scopes, Amount(input_tokens=3, output_tokens=4, calls=1))
    result = {"key": "r0.generate", "text": "t", "calls": 1, "interrupted": None}
    assert store.complete_step(run_id, "r0.generate", result, '{"e":2}', "c1", before=settle)
    run = store.r.hgetall(keys.run(run_id))
    made = store.record_finish(
        run, 1, "approved", reason=None, error=None, usage={}, events=['{"e":3}']
    )
    assert made == 1


def _without_ttl(client: Any) -> set[str]:
    return {k for k in client.scan_iter("*") if client.ttl(k) == -1}


def test_a_finished_batch_leaves_only_fleet_keys_without_a_ttl(
    client: Any, reliability: Reliability
) -> None:
    store = RunStore(client, finished_ttl_s=TTL)
    budgets = Budgets(client, settled_ttl_s=TTL)
    BudgetLedger(client).set_limits("global:fleet", Budget(max_tokens=10_000))
    batch_id = "b1"
    client.hset(keys.batch(batch_id), mapping={"batch_id": batch_id, "total": 2, "done": 0})
    client.zadd(keys.batches_index(), {batch_id: 1.0})
    client.rpush(keys.batch_runs(batch_id), "r1", "r2")
    client.rpush(keys.batch_rejected(batch_id), '{"index": 2}')
    scopes = {r: [f"run:{r}", f"batch:{batch_id}", "global:fleet"] for r in ("r1", "r2")}
    pipe = client.pipeline()
    store.create_runs(
        [
            RunRecord(r, "spec", "p", batch_id=batch_id, budget_scopes=tuple(scopes[r]))
            for r in ("r1", "r2")
        ],
        pipe,
    )
    pipe.execute()

    _finish_run(store, budgets, "r1", scopes["r1"])
    left = _without_ttl(client)
    # r1's keys and its own budget scope expire; the batch waits for its last run.
    assert not {k for k in left if "{r1}" in k or k.endswith(":run:r1")}, left
    assert keys.batch(batch_id) in left
    assert keys.budget_keys(f"batch:{batch_id}")[0] in left

    _finish_run(store, budgets, "r2", scopes["r2"])
    every = set(client.scan_iter("*"))
    kept = _without_ttl(client) - FLEET_KEYS
    reliability.record(
        section=ENGINE,
        fault="Memory: keys left behind by finished runs and batches",
        load="a 2-run batch through the store as the coordinator and steps drive it (step, "
        "budget reservation and settlement in `run:`, `batch:` and `global:` scopes, stored "
        f"result, finish) on a real server: {len(every)} keys",
        lost=f"{lost_of(len(kept), len(every), 'keys kept for ever')}: once the batch's last "
        f"run finished, every key has the finished TTL (`DUET_FINISHED_TTL_S`) but the "
        f"{len(every & FLEET_KEYS)} fleet-wide ones (batch index, budget index, the `global:` "
        "scope's counters); the batch's keys waited for its last run",
        before="issue 9: run and batch keys, and `run:`/`batch:` budget scopes, never expired",
    )
    assert kept == set(), kept
    for key in every:
        assert client.ttl(key) == -1 or 0 < client.ttl(key) <= TTL, key


def test_an_agents_own_budget_scope_expires_with_its_run(client: Any) -> None:
    """``actor:<run id>`` and ``critic:<run id>`` (an agent's ``budget=``) get the finished
    TTL with the run's own keys."""
    store = RunStore(client, finished_ttl_s=TTL)
    budgets = Budgets(client, settled_ttl_s=TTL)
    ledger = BudgetLedger(client)
    scopes = ["actor:r3", "critic:r3"]
    for name in scopes:
        ledger.set_limits(name, Budget(max_calls=5))
    pipe = client.pipeline()
    store.create_runs([RunRecord("r3", "spec", "p", budget_scopes=tuple(scopes))], pipe)
    pipe.execute()
    _finish_run(store, budgets, "r3", scopes[:1])
    assert ledger.get("actor:r3").spent.calls == 1
    assert _without_ttl(client) - FLEET_KEYS == set()
    for name in scopes:
        assert 0 < client.ttl(keys.budget(name)) <= TTL
