"""Prices: the database lookup (genai-prices), the choice of a price, the cost arithmetic."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys

import pytest

from orchestration.core.agents import Agent, Price, PriceTier
from orchestration.core.errors import ConfigError
from orchestration.core.pricing import SIM_PRICE, choose_price, cost_usd, rates_for
from orchestration.prices import listed_price, price_for, require_price

DAY = datetime.date(2026, 11, 30)


@pytest.mark.parametrize(
    ("provider", "name", "rates"),
    [
        # (input, output, cache read, cache write) USD per million tokens
        ("openai", "gpt-4o", (2.50, 10.00, 1.25, None)),
        ("openai", "gpt-4o-2024-08-06", (2.50, 10.00, 1.25, None)),
        ("openai", "gpt-4.1-mini", (0.40, 1.60, 0.10, None)),
        ("openai", "o3", (2.00, 8.00, 0.50, None)),
        ("anthropic", "claude-haiku-4-5", (1.00, 5.00, 0.10, 1.25)),
        ("anthropic", "claude-sonnet-4-5-20250929", (3.00, 15.00, 0.30, 3.75)),
        ("anthropic", "claude-opus-4-1", (15.00, 75.00, 1.50, 18.75)),
    ],
)
def test_database_prices_known_models(provider: str, name: str, rates: tuple) -> None:
    price = listed_price(provider, name, on=DAY)
    assert price is not None
    got = (
        price.input_per_mtok,
        price.output_per_mtok,
        price.cached_input_per_mtok,
        price.cache_write_per_mtok,
    )
    assert got == pytest.approx(rates)


@pytest.mark.parametrize(
    ("provider", "name", "batch_in", "batch_out"),
    [("openai", "gpt-4o", 1.25, 5.00), ("anthropic", "claude-haiku-4-5", 0.50, 2.50)],
)
def test_database_batch_rates_are_half(
    provider: str, name: str, batch_in: float, batch_out: float
) -> None:
    price = listed_price(provider, name, on=DAY)
    assert price is not None and price.batch is not None
    assert (price.batch.input_per_mtok, price.batch.output_per_mtok) == (batch_in, batch_out)
    assert cost_usd(price, 1000, 1000, batch=True) == pytest.approx(cost_usd(price, 1000, 1000) / 2)


def test_database_long_context_tier_is_kept() -> None:
    price = listed_price("anthropic", "claude-sonnet-4-5", on=DAY)
    assert price is not None and price.tiers
    tier = price.tiers[0]
    assert tier.above_input_tokens == 200_000
    assert tier.price.input_per_mtok > price.input_per_mtok
    assert cost_usd(price, 200_001, 0) == pytest.approx(200_001 * tier.price.input_per_mtok / 1e6)


@pytest.mark.parametrize(
    ("provider", "name"),
    [
        ("openai", "gpt-4ox"),
        ("openai", "llama3"),
        ("openai", "o35"),
        ("anthropic", "claude-opus-9"),
        ("sim", "sim"),
    ],
)
def test_unknown_models_have_no_listed_price(provider: str, name: str) -> None:
    assert listed_price(provider, name, on=DAY) is None


def test_lookup_is_pure_data() -> None:
    """The database is looked up with no network, environment or files: here in a process
    whose sockets, environment reads and file opens after import all raise."""
    code = """
import builtins, os, socket, datetime, json
import genai_prices.data_snapshot, genai_prices.data, genai_prices.types, genai_prices.units
from orchestration import prices
def refuse(*a, **k): raise AssertionError(f"I/O during a price lookup: {a[:1]}")
socket.socket = refuse; socket.create_connection = refuse; builtins.open = refuse
os.environ = None; os.getenv = refuse
p = prices.listed_price("anthropic", "claude-haiku-4-5", on=datetime.date(2026, 11, 30))
print(json.dumps(p.model_dump()))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["input_per_mtok"] == 1.0


def test_sim_price_is_small_and_nonzero() -> None:
    assert 0 < SIM_PRICE.input_per_mtok < 1 and 0 < SIM_PRICE.output_per_mtok < 1
    assert price_for(Agent("x", model="sim:critic?scores=0.5").spec) is SIM_PRICE


def test_price_for_agent() -> None:
    assert price_for(Agent("x", model="gpt-4o").spec) == listed_price("openai", "gpt-4o")
    assert price_for(Agent("x", model="anthropic:claude-sonnet-4-5-20250929").spec) == listed_price(
        "anthropic", "claude-sonnet-4-5"
    )
    assert price_for(Agent("x", model="openai:llama3", base_url="http://h/v1").spec) is None


def test_agent_price_wins() -> None:
    own = {"input_per_mtok": 9.0, "output_per_mtok": 99.0}
    assert price_for(Agent("x", model="gpt-4o", price=own).spec) == Price(**own)
    agent = Agent("x", model="openai:llama3", base_url="http://h/v1", price=own)
    assert require_price(agent.spec) == Price(**own)
    assert choose_price(agent.spec, SIM_PRICE) == Price(**own)


def test_require_price_explains_in_python_or_toml() -> None:
    spec = Agent("x", model="openai:llama3", base_url="http://h/v1").spec
    with pytest.raises(ConfigError, match=r"no known price for model 'openai:llama3'.*price=\{"):
        require_price(spec)
    with pytest.raises(ConfigError, match=r"add \[critic\] price = \{ input_per_mtok = \.\.\."):
        require_price(spec, toml_section="critic")


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


def test_cache_writes_at_their_rate() -> None:
    price = Price(
        input_per_mtok=3.0,
        output_per_mtok=15.0,
        cached_input_per_mtok=0.3,
        cache_write_per_mtok=3.75,
    )
    # 1000 input: 200 read, 300 written, 500 plain
    assert cost_usd(price, 1000, 0, 200, 300) == pytest.approx(
        (500 * 3 + 200 * 0.3 + 300 * 3.75) / 1e6
    )
    # no write rate: writes at the input rate
    plain = Price(input_per_mtok=3.0, output_per_mtok=15.0)
    assert cost_usd(plain, 1000, 0, 0, 300) == cost_usd(plain, 1000, 0)


def test_cached_without_cached_rate_bills_input_rate() -> None:
    price = Price(input_per_mtok=3.0, output_per_mtok=15.0)
    assert cost_usd(price, 1000, 0, cached_input_tokens=400) == cost_usd(price, 1000, 0)


def test_cached_never_exceeds_input() -> None:
    price = Price(input_per_mtok=2.0, output_per_mtok=8.0, cached_input_per_mtok=0.5)
    assert cost_usd(price, 100, 0, cached_input_tokens=500) == pytest.approx(100 * 0.5 / 1e6)
    assert cost_usd(price, 100, 0, 60, 500) == pytest.approx((60 * 0.5 + 40 * 2.0) / 1e6)


def test_batch_without_batch_rates_bills_standard() -> None:
    price = Price(input_per_mtok=2.0, output_per_mtok=8.0)
    assert cost_usd(price, 1000, 100, batch=True) == cost_usd(price, 1000, 100)
    assert rates_for(price, 10, batch=True) is price


def test_tiers_apply_to_all_tokens_above_threshold() -> None:
    high = Price(input_per_mtok=6.0, output_per_mtok=22.5)
    price = Price(
        input_per_mtok=3.0,
        output_per_mtok=15.0,
        tiers=(PriceTier(above_input_tokens=200_000, price=high),),
    )
    assert rates_for(price, 200_000) is price
    assert rates_for(price, 200_001) is high
    assert cost_usd(price, 300_000, 1000) == pytest.approx((300_000 * 6 + 1000 * 22.5) / 1e6)


def test_agent_price_from_a_dict_is_checked() -> None:
    with pytest.raises(ConfigError, match=r"price\.output_per_mtok: required key is missing"):
        Agent("x", model="gpt-4o", price={"input_per_mtok": 1})
