"""What model calls cost: the arithmetic and the choice of a price. Pure, no I/O.

Prices are USD per million tokens (:class:`~orchestration.core.agents.Price`). Where they
come from is not decided here: the maintained price database is read by
:mod:`orchestration.prices` (outside the core, as it is a package with its own imports)
and handed in as the *listed* price. An agent's own ``price=`` always wins over the list;
the offline simulator has a made-up price of its own.

A call's input tokens include the tokens read from a prompt cache (billed at the cached
rate) and the tokens written to it (billed at the cache-write rate); the rest is billed at
the input rate. A call made through a vendor's batch API is billed at the price's batch
rates when it has them, else at the standard ones (never less than the vendor bills).
"""

from __future__ import annotations

from orchestration.core.agents import AgentSpec, Price
from orchestration.core.errors import ConfigError

#: The offline simulator's price: made up, small and nonzero so USD budgets can be
#: exercised without a vendor. Not any real model's price.
SIM_PRICE = Price(
    input_per_mtok=0.10,
    output_per_mtok=0.40,
    cached_input_per_mtok=0.05,
    cache_write_per_mtok=0.125,
    batch=Price(input_per_mtok=0.05, output_per_mtok=0.20, cached_input_per_mtok=0.025),
)


def choose_price(agent: AgentSpec, listed: Price | None) -> Price | None:
    """The agent's price: its own ``price`` when given, the simulator's for ``sim``, else
    ``listed`` (the price database's, ``None`` when it does not know the model)."""
    if agent.price is not None:
        return agent.price
    if agent.provider == "sim":
        return SIM_PRICE
    return listed


def require_price(
    agent: AgentSpec, listed: Price | None, *, toml_section: str | None = None
) -> Price:
    """:func:`choose_price`, raising :class:`ConfigError` when the price is unknown.

    Use it when a USD budget applies: spending cannot be counted without a price.
    ``toml_section`` (``"actor"``) makes the advice TOML, for agents from a config file.
    """
    price = choose_price(agent, listed)
    if price is None:
        if toml_section is not None:
            fix = f"add [{toml_section}] price = {{ input_per_mtok = ..., output_per_mtok = ... }}"
        else:
            fix = "pass price={'input_per_mtok': ..., 'output_per_mtok': ...} to its Agent"
        raise ConfigError(
            f"no known price for model {agent.model!r}, so a USD budget cannot be enforced: "
            f"{fix}, or budget it in tokens instead"
        )
    return price


def rates_for(price: Price, input_tokens: int, *, batch: bool = False) -> Price:
    """The rates one call pays: the batch rates for a vendor batch call (when known),
    then the long-context tier its input size reaches (the tier's rates apply to all
    of the call's tokens, as the vendors bill)."""
    if batch and price.batch is not None:
        price = price.batch
    chosen = price
    for tier in price.tiers:
        if input_tokens > tier.above_input_tokens:
            chosen = tier.price
    return chosen


def cost_usd(
    price: Price,
    input_tokens: int,
    output_tokens: int,
    cached_input_tokens: int = 0,
    cache_write_tokens: int = 0,
    *,
    batch: bool = False,
) -> float:
    """USD for one call.

    ``cached_input_tokens`` (cache reads) and ``cache_write_tokens`` are parts of
    ``input_tokens``, billed at the cached and cache-write rates when the price has them
    (else at the input rate); ``batch`` bills at the batch rates (see :func:`rates_for`).
    """
    total_in = max(input_tokens, 0)
    rates = rates_for(price, total_in, batch=batch)
    cached = min(max(cached_input_tokens, 0), total_in)
    written = min(max(cache_write_tokens, 0), total_in - cached)
    uncached = total_in - cached - written
    cached_rate = _or(rates.cached_input_per_mtok, rates.input_per_mtok)
    write_rate = _or(rates.cache_write_per_mtok, rates.input_per_mtok)
    total = (
        uncached * rates.input_per_mtok
        + cached * cached_rate
        + written * write_rate
        + max(output_tokens, 0) * rates.output_per_mtok
    ) / 1_000_000
    return round(total, 10)


def _or(rate: float | None, default: float) -> float:
    return default if rate is None else rate
