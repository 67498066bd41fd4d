"""Price table lookup and cost arithmetic."""

from __future__ import annotations

import datetime

import pytest

from orchestration.core.agents import Agent, Price
from orchestration.core.errors import ConfigError
from orchestration.core.pricing import (
    PRICES,
    PRICES_CHECKED,
    SIM_PRICE,
    cost_usd,
    lookup_price,
    price_for,
    require_price,
)


def test_checked_date_is_a_date() -> None:
    datetime.date.fromisoformat(PRICES_CHECKED)


@pytest.mark.parametrize(
    "name",
    [
        "gpt-4o",
        "gpt-4o-mini",
        "gpt-4.1",
        "gpt-4.1-mini",
        "o3",
        "o4-mini",
        "claude-sonnet-4-5",
        "claude-haiku-4-5",
        "claude-opus-4-1",
    ],
)
def test_exact_names_known(name: str) -> None:
    assert lookup_price(name) is PRICES[name]


@pytest.mark.parametrize(
    ("name", "family"),
    [
        ("claude-sonnet-4-5-20250929", "claude-sonnet-4-5"),
        ("claude-sonnet-4-20250514", "claude-sonnet-4"),
        ("claude-sonnet-4-6", "claude-sonnet-4"),
        ("claude-haiku-4-5-20251001", "claude-haiku-4-5"),
        ("claude-opus-4-5-20251101", "claude-opus-4-5"),
        ("claude-sonnet-4-5@20250929", "claude-sonnet-4-5"),
        ("gpt-4o-2024-08-06", "gpt-4o"),
        ("gpt-4o-mini-2024-07-18", "gpt-4o-mini"),
        ("gpt-4.1-mini-2025-04-14", "gpt-4.1-mini"),
        ("o3-2025-04-16", "o3"),
        ("o3-mini-2025-01-31", "o3-mini"),
    ],
)
def test_longest_prefix(name: str, family: str) -> None:
    assert lookup_price(name) is PRICES[family]


@pytest.mark.parametrize("name", ["gpt-4", "gpt-4ox", "llama3", "o35", "claude-2", "mistral-large"])
def test_unknown_names(name: str) -> None:
    assert lookup_price(name) is None


def test_dearer_model_costs_more() -> None:
    assert PRICES["gpt-4o"].input_per_mtok > PRICES["gpt-4o-mini"].input_per_mtok
    assert PRICES["claude-opus-4-1"].output_per_mtok > PRICES["claude-haiku-4-5"].output_per_mtok


def test_sim_price_is_small_and_nonzero() -> None:
    assert 0 < SIM_PRICE.input_per_mtok < 1 and 0 < SIM_PRICE.output_per_mtok < 1
    assert price_for(Agent("x", model="sim:critic?scores=0.5").spec) is SIM_PRICE
    assert lookup_price("sim?latency_ms=3") is SIM_PRICE


def test_price_for_agent() -> None:
    assert price_for(Agent("x", model="gpt-4o").spec) is PRICES["gpt-4o"]
    assert (
        price_for(Agent("x", model="anthropic:claude-sonnet-4-5-20250929").spec)
        is PRICES["claude-sonnet-4-5"]
    )
    assert price_for(Agent("x", model="openai:llama3", base_url="http://h/v1").spec) is None


def test_agent_price_wins() -> None:
    own = {"input_per_mtok": 9.0, "output_per_mtok": 99.0}
    assert price_for(Agent("x", model="gpt-4o", price=own).spec) == Price(**own)
    agent = Agent("x", model="openai:llama3", base_url="http://h/v1", price=own)
    assert require_price(agent.spec) == Price(**own)


def test_require_price_explains() -> None:
    with pytest.raises(ConfigError, match=r"no known price for model 'openai:llama3'.*price="):
        require_price(Agent("x", model="openai:llama3", base_url="http://h/v1").spec)


def test_cost_arithmetic() -> None:
    price = Price(input_per_mtok=2.0, output_per_mtok=8.0, cached_input_per_mtok=0.5)
    assert cost_usd(price, 1_000_000, 0) == 2.0
    assert cost_usd(price, 0, 1_000_000) == 8.0
    assert cost_usd(price, 1000, 500) == pytest.approx(0.002 + 0.004)
    # 400 of the 1000 input tokens were cache reads: 600 at 2.0 + 400 at 0.5
    assert cost_usd(price, 1000, 0, cached_input_tokens=400) == pytest.approx(
        (600 * 2.0 + 400 * 0.5) / 1e6
    )
    assert cost_usd(price, 0, 0) == 0.0


def test_cached_without_cached_rate_bills_input_rate() -> None:
    price = Price(input_per_mtok=3.0, output_per_mtok=15.0)
    assert cost_usd(price, 1000, 0, cached_input_tokens=400) == cost_usd(price, 1000, 0)


def test_cached_never_exceeds_input() -> None:
    price = Price(input_per_mtok=2.0, output_per_mtok=8.0, cached_input_per_mtok=0.5)
    assert cost_usd(price, 100, 0, cached_input_tokens=500) == pytest.approx(100 * 0.5 / 1e6)
