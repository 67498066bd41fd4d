"""Budgets as data: limits, checks, warnings, scopes and interruption reasons."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from orchestration.core.budget import (
    CALLS,
    INPUT_TOKENS,
    OUTPUT_TOKENS,
    TOKENS,
    UNITS,
    USD,
    Amount,
    Budget,
    BudgetStatus,
    BudgetWarning,
    Refusal,
    parse_scope,
    reason_for,
    scope,
    scopes_for,
)
from orchestration.core.errors import ConfigError
from orchestration.core.usage import Usage


def amt(i: int = 0, o: int = 0, usd: float = 0.0, calls: int = 0) -> Amount:
    return Amount(input_tokens=i, output_tokens=o, usd=usd, calls=calls)


@pytest.mark.parametrize(
    ("budget", "spent", "reserved", "extra", "expected"),
    [
        # no limits: never exceeded
        (Budget(), amt(10**9, 10**9, 1e6, 10**6), amt(), amt(), None),
        # exactly at the limit is allowed, one past is not
        (Budget(max_tokens=100), amt(40, 10), amt(20, 10), amt(10, 10), None),
        (Budget(max_tokens=100), amt(40, 10), amt(20, 10), amt(10, 11), TOKENS),
        (Budget(max_input_tokens=50), amt(30), amt(10), amt(10), None),
        (Budget(max_input_tokens=50), amt(30), amt(10), amt(11), INPUT_TOKENS),
        (Budget(max_output_tokens=5), amt(0, 5), amt(), amt(0, 1), OUTPUT_TOKENS),
        (Budget(max_usd=1.0), amt(usd=0.5), amt(usd=0.25), amt(usd=0.25), None),
        (Budget(max_usd=1.0), amt(usd=0.5), amt(usd=0.25), amt(usd=0.26), USD),
        (Budget(max_calls=3), amt(calls=1), amt(calls=1), amt(calls=1), None),
        (Budget(max_calls=3), amt(calls=2), amt(calls=1), amt(calls=1), CALLS),
        # reserved counts as much as spent
        (Budget(max_tokens=10), amt(), amt(10), amt(1), TOKENS),
        # a zero limit forbids any use of that unit, but not of others
        (Budget(max_calls=0), amt(), amt(), amt(5, 5), None),
        (Budget(max_calls=0), amt(), amt(), amt(calls=1), CALLS),
        # several exceeded: the first in UNITS order is named
        (Budget(max_calls=1, max_input_tokens=1), amt(), amt(), amt(2, calls=2), INPUT_TOKENS),
        (Budget(max_usd=0.1, max_tokens=10), amt(), amt(), amt(20, usd=1), TOKENS),
    ],
)
def test_check(budget, spent, reserved, extra, expected):
    assert budget.check(spent, reserved, extra) == expected


@pytest.mark.parametrize(
    ("budget", "spent", "expected"),
    [
        (Budget(), amt(10**6), []),
        (Budget(max_tokens=100), amt(79), []),
        (Budget(max_tokens=100), amt(80), [TOKENS]),
        (Budget(max_tokens=100), amt(60, 60), [TOKENS]),
        (Budget(max_tokens=100, warn_at=0.5), amt(50), [TOKENS]),
        (Budget(max_tokens=100, warn_at=1.0), amt(99), []),
        (Budget(max_tokens=100, warn_at=1.0), amt(100), [TOKENS]),
        (Budget(max_usd=2.0, max_calls=10), amt(usd=1.6, calls=7), [USD]),
        (Budget(max_usd=2.0, max_calls=10), amt(usd=1.6, calls=8), [USD, CALLS]),
        (
            Budget(max_input_tokens=10, max_output_tokens=10, max_tokens=100),
            amt(9, 8),
            [INPUT_TOKENS, OUTPUT_TOKENS],
        ),
    ],
)
def test_warning_units(budget, spent, expected):
    assert budget.warning_units(spent) == expected


@pytest.mark.parametrize(
    ("budget", "spent", "expected"),
    [
        (Budget(), amt(10**6), None),
        (Budget(max_tokens=100), amt(99), None),
        (Budget(max_tokens=100), amt(50, 50), TOKENS),
        (Budget(max_calls=0), amt(), CALLS),
        (Budget(max_usd=1.0, max_calls=5), amt(usd=1.0, calls=5), USD),
    ],
)
def test_exhausted_unit(budget, spent, expected):
    assert budget.exhausted_unit(spent) == expected


def test_limits_lists_only_the_limits_that_are_on_in_unit_order():
    assert Budget().limits() == {}
    budget = Budget(max_calls=3, max_usd=1.5, max_input_tokens=7)
    assert budget.limits() == {INPUT_TOKENS: 7, USD: 1.5, CALLS: 3}
    assert list(budget.limits()) == [u for u in UNITS if u in budget.limits()]


def test_every_budget_field_has_a_one_line_docstring():
    for name, info in Budget.model_fields.items():
        assert info.description and "\n" not in info.description, name


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_tokens": -1},
        {"max_input_tokens": -5},
        {"max_output_tokens": -1},
        {"max_usd": -0.01},
        {"max_calls": -1},
        {"warn_at": 0},
        {"warn_at": -0.5},
        {"warn_at": 1.01},
        {"max_token": 5},  # typo: unknown fields are refused, not ignored
    ],
)
def test_budget_validation(kwargs):
    with pytest.raises(ValidationError):
        Budget(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [{"input_tokens": -1}, {"output_tokens": -1}, {"usd": -0.1}, {"calls": -1}, {"tokens": 3}],
)
def test_amount_validation(kwargs):
    with pytest.raises(ValidationError):
        Amount(**kwargs)


def test_amount_adds_up_and_is_frozen():
    total = amt(1, 2, 0.1, 1) + amt(10, 20, 0.2, 2)
    assert total == amt(11, 22, 0.3, 3)
    assert total.tokens == 33
    assert [total.value(u) for u in UNITS] == [11, 22, 33, 0.3, 3]
    with pytest.raises(ValidationError):
        total.calls = 5  # type: ignore[misc]
    with pytest.raises(ConfigError):
        total.value("bogus")


def test_amount_from_usage():
    usage = Usage(input_tokens=5, output_tokens=7, cached_input_tokens=3, calls=1, usd=0.02)
    assert Amount.from_usage(usage) == amt(5, 7, 0.02, 1)


@pytest.mark.parametrize(
    ("scope_", "unit", "expected"),
    [
        ("run:abc", TOKENS, "budget:run:tokens"),
        ("global:default", USD, "budget:global:usd"),
        ("batch:b-1", CALLS, "budget:batch:calls"),
        ("user:ann@example.com", INPUT_TOKENS, "budget:user:input_tokens"),
        ("user:u1", OUTPUT_TOKENS, "budget:user:output_tokens"),
    ],
)
def test_reason_for(scope_, unit, expected):
    assert reason_for(scope_, unit) == expected


@pytest.mark.parametrize(
    ("scope_", "unit"),
    [("run:abc", "dollars"), ("team:x", TOKENS), ("abc", TOKENS), ("run:", TOKENS)],
)
def test_reason_for_rejects_unknown_scope_or_unit(scope_, unit):
    with pytest.raises(ConfigError):
        reason_for(scope_, unit)


@pytest.mark.parametrize(
    ("kind", "name", "ok"),
    [
        ("run", "3f2a", True),
        ("batch", "nightly-2024_01", True),
        ("user", "ann@example.com", True),
        ("global", "default", True),
        ("team", "x", False),
        ("run", "", False),
        ("run", "a:b", False),
        ("run", "a,b", False),
        ("run", "a b", False),
        ("run", "{tag}", False),
    ],
)
def test_scope_names(kind, name, ok):
    if ok:
        assert scope(kind, name) == f"{kind}:{name}"
        assert parse_scope(f"{kind}:{name}") == (kind, name)
    else:
        with pytest.raises(ConfigError):
            scope(kind, name)
        with pytest.raises(ConfigError):
            parse_scope(f"{kind}:{name}")


def test_scopes_for_lists_narrowest_first_and_skips_none():
    assert scopes_for(run_id="r", batch_id="b", user_id="u") == [
        "run:r",
        "batch:b",
        "user:u",
        "global:default",
    ]
    assert scopes_for(run_id="r", global_name=None) == ["run:r"]


def test_status_and_refusal_values():
    assert BudgetStatus().blocked is None and BudgetStatus().reason is None
    status = BudgetStatus(("global:fleet", USD), [BudgetWarning("run:r", TOKENS, 0.85)])
    assert status.reason == "budget:global:usd"
    scope_, unit, fraction = status.warnings[0]
    assert (scope_, unit, fraction) == ("run:r", TOKENS, 0.85)

    contended = Refusal("global:g", TOKENS, limit=100, spent=20, reserved=70, requested=30)
    assert not contended.exhausted and contended.reason == "budget:global:tokens"
    exhausted = Refusal("run:r", CALLS, limit=3, spent=3, reserved=0, requested=1)
    assert exhausted.exhausted and exhausted.reason == "budget:run:calls"
