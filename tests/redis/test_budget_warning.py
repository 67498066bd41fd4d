"""A budget warning is emitted exactly once, by a transition that happened.

Two real coordinators race for the same transition on a real Redis. The budget check
reads which warnings are due but marks none; the transition's own script sets the
warning's flag and emits it with the transition. So the coordinator that loses the
compare-and-set emits nothing and uses nothing up, and the winner emits the warning —
whichever of them checked first. (Before, the check set the flag itself: a lost race or a
crash between the check and the transition lost the warning for good.)
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from orchestration.core import events as ev
from orchestration.core.agents import Agent
from orchestration.core.architecture import ActorCritic
from orchestration.core.budget import Amount, Budget
from orchestration.services.budgeting import Budgets
from orchestration.services.coordinator import Coordinator
from orchestration.state import keys
from orchestration.state.budgets import BudgetLedger
from orchestration.state.runs import RunRecord, RunStore

pytestmark = pytest.mark.redis

SCOPES = ("global:fleet", "run:r1")


@pytest.fixture
def r(decoding_client: Any) -> Any:
    return decoding_client


def _new_run(store: RunStore, run_id: str = "r1") -> None:
    loop = ActorCritic(actor=Agent("a", model="sim"), critic=Agent("c", model="sim"))
    spec_id = store.save_spec(loop.to_spec())
    pipe = store.r.pipeline(transaction=False)
    store.create_runs([RunRecord(run_id, spec_id, "Fix it.", budget_scopes=SCOPES)], pipe)
    pipe.execute()


def _warnings(store: RunStore, run_id: str = "r1") -> list[Any]:
    return [e for _, e in store.events(run_id) if e.type == ev.BUDGET_WARNING]


def _past_the_warning(r: Any) -> None:
    ledger = BudgetLedger(r)
    ledger.set_limits("global:fleet", Budget(max_tokens=100, warn_at=0.5))
    ledger.settle("s0", ["global:fleet"], Amount(input_tokens=60))


@pytest.mark.parametrize("first", ["a", "b"])
def test_the_warning_survives_a_lost_compare_and_set(r: Any, first: str) -> None:
    """Coordinators A and B (a redelivered message) both check the budget, then ``first``
    records the transition and the other loses the compare-and-set."""
    store = RunStore(r)
    _new_run(store)
    _past_the_warning(r)
    budgets = Budgets(r)
    checked = {name: threading.Event() for name in "ab"}
    go = {name: threading.Event() for name in "ab"}

    def racing_check(name: str) -> Any:
        def check(run: Any, scopes: list[str]) -> Any:
            result = budgets.round_check(run, scopes)
            checked[name].set()
            assert go[name].wait(10), f"{name} was never let go"
            return result

        return check

    made: dict[str, Any] = {}
    threads = {}
    for name in "ab":
        coordinator = Coordinator(store, budget_check=racing_check(name))
        threads[name] = threading.Thread(
            target=lambda n=name, c=coordinator: made.__setitem__(n, c.advance("r1", 0))
        )
        threads[name].start()
    assert checked["a"].wait(10) and checked["b"].wait(10)  # both checked, neither recorded
    second = "b" if first == "a" else "a"
    for name in (first, second):
        go[name].set()
        threads[name].join(10)
        assert not threads[name].is_alive()
    assert made[first] is not None and made[second] is None  # the second lost the CAS
    [warning] = _warnings(store)
    assert (warning.data["scope"], warning.data["unit"]) == ("global:fleet", "tokens")
    assert warning.data["fraction"] == 0.6
    assert r.hget(keys.run("r1"), "seq") == "1"


def test_a_check_that_never_records_uses_nothing_up(r: Any) -> None:
    """A coordinator that dies between its check and its transition: the next one warns."""
    store = RunStore(r)
    _new_run(store)
    _past_the_warning(r)
    budgets = Budgets(r)
    _, due = budgets.round_check({"run_id": "r1"}, list(SCOPES))
    assert len(due) == 1  # ...and then that coordinator is gone
    assert Coordinator(store, budget_check=budgets.round_check).advance("r1", 0) is not None
    assert len(_warnings(store)) == 1


def test_one_warning_per_scope_fleet_wide_across_runs(r: Any) -> None:
    """Runs sharing a scope each see the warning due; only one transition emits it."""
    store = RunStore(r)
    for run_id in ("r1", "r2", "r3"):
        _new_run(store, run_id)
    _past_the_warning(r)
    budgets = Budgets(r)
    checks = [budgets.round_check({"run_id": rid}, list(SCOPES)) for rid in ("r1", "r2", "r3")]
    assert all(len(due) == 1 for _, due in checks)  # all three were told it is due
    coordinator = Coordinator(store, budget_check=budgets.round_check)
    for run_id in ("r1", "r2", "r3"):
        assert coordinator.advance(run_id, 0) is not None
    assert [len(_warnings(store, rid)) for rid in ("r1", "r2", "r3")] == [1, 0, 0]
