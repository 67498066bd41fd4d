"""A budget scope never silently loses its limit: when its hash is gone (evicted, or
deleted by hand) after a limit was set, reserving and the round check raise
:class:`LimitLost` instead of treating the scope as unlimited."""

from __future__ import annotations

from typing import Any

import pytest

from orchestration.core.budget import Amount, Budget
from orchestration.state import keys
from orchestration.state.budgets import BudgetLedger, LimitLost
from tests.reliability import CLIENTS, Reliability

SCOPE = "global:capped"
CALL = Amount(input_tokens=10, output_tokens=10)


def test_a_lost_limit_is_an_error_not_unlimited(
    redis_client: Any, reliability: Reliability
) -> None:
    reliability.record(
        section=CLIENTS,
        fault="a budget scope's hash gone (evicted, deleted) after its limit was set",
        load="a reservation and a round check in that scope",
        lost="nothing: both raise `LimitLost` naming the scope (the run fails with it); "
        "no call is made uncapped",
        before="the rebuilt hash had no limit: the scope counted as unlimited, the cap "
        "silently gone",
    )
    ledger = BudgetLedger(redis_client)
    ledger.set_limits(SCOPE, Budget(max_tokens=1000))
    assert ledger.reserve("s1", [SCOPE], CALL, lease_s=30) is None
    ledger.release("s1", [SCOPE])
    redis_client.delete(keys.budget(SCOPE))  # what an eviction does
    with pytest.raises(LimitLost, match=SCOPE):
        ledger.reserve("s2", [SCOPE], CALL, lease_s=30)
    with pytest.raises(LimitLost, match=SCOPE):
        ledger.round_status(["run:r1", SCOPE])
    assert redis_client.hlen(keys.budget_holds(SCOPE)) == 1  # only the mark: nothing held
    ledger.set_limits(SCOPE, Budget(max_tokens=1000))  # set again: capped again
    assert ledger.reserve("s2", [SCOPE], CALL, lease_s=30) is None


def test_a_scope_whose_limit_was_removed_is_unlimited(redis_client: Any) -> None:
    ledger = BudgetLedger(redis_client)
    ledger.set_limits(SCOPE, Budget(max_tokens=1000))
    ledger.set_limits(SCOPE, Budget())
    redis_client.delete(keys.budget(SCOPE))
    assert ledger.reserve("s1", [SCOPE], CALL, lease_s=30) is None
    assert ledger.round_status([SCOPE]).blocked is None


@pytest.mark.parametrize("end", ["settle", "release"])
def test_a_hold_outliving_its_budget_hash_leaves_no_negative_count(
    redis_client: Any, end: str
) -> None:
    """The budget hash evicted while a call held part of it (its holds hash kept): ending
    the hold leaves the rebuilt hash at 0 reserved, not below (which `get` refused)."""
    ledger = BudgetLedger(redis_client)
    scope = "batch:b1"
    assert ledger.reserve("s1", [scope], CALL, lease_s=30) is None
    redis_client.delete(keys.budget(scope))  # what an eviction does
    if end == "settle":
        ledger.settle("s1", [scope], Amount(input_tokens=3, output_tokens=4, calls=1))
    else:
        ledger.release("s1", [scope])
    state = ledger.get(scope)
    assert state.reserved == Amount()
    assert state.spent.calls == (1 if end == "settle" else 0)
