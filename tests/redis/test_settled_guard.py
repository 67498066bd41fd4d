"""A model call is charged once however often its store is tried, also when Redis may
evict keys with a TTL (``volatile-lru``, ElastiCache's default): the guard is a field of
the run's settled hash, which keeps no TTL while the run is open."""

from __future__ import annotations

from typing import Any

from orchestration.core.budget import Amount
from orchestration.state import keys
from orchestration.state.budgets import BudgetLedger

HOLD = "run-1:r0.generate:p.host.1.abc:def"


def test_the_settled_guard_has_no_ttl_while_the_run_is_open(decoding_client: Any) -> None:
    r = decoding_client
    r.delete(keys.run("run-1"), keys.run_settled("run-1"), keys.budget("run:run-1"))
    r.hset(keys.run("run-1"), "status", "running")
    ledger = BudgetLedger(r)
    assert ledger.settle(HOLD, ["run:run-1"], Amount(calls=1, input_tokens=10)) is True
    assert r.ttl(keys.budget_settled(HOLD)) == -1  # nothing a volatile-* policy evicts
    assert ledger.settle(HOLD, ["run:run-1"], Amount(calls=1, input_tokens=10)) is False
    assert ledger.get("run:run-1").spent.calls == 1
    # A finished run's keys expire: a late settle keeps its guard as long as the run.
    r.expire(keys.run("run-1"), 600)
    late = "run-1:r1.critique:p.host.1.abc:fed"
    assert ledger.settle(late, ["run:run-1"], Amount(calls=1)) is True
    assert 0 < r.ttl(keys.budget_settled(late)) <= 600
    r.delete(keys.run("run-1"), keys.run_settled("run-1"), keys.budget("run:run-1"))
