"""What model calls cost: a built-in price table and the arithmetic. Pure, no I/O.

Figures are USD per million tokens from the vendors' public price lists as of
:data:`PRICES_CHECKED` (standard tier, no batch discount). Cached input is the price of a
prompt-cache *read*; Anthropic cache writes are billed here at the plain input price.
Newer models than the table knows fall back to their family by longest prefix (e.g.
``claude-opus-4-6`` -> ``claude-opus-4``), which errs on the expensive side. An
:class:`~orchestration.core.agents.Agent`'s own ``price=`` always wins over the table.
"""

from __future__ import annotations

from orchestration.core.agents import AgentSpec, Price
from orchestration.core.errors import ConfigError

#: When the figures below were last compared with the vendors' price pages.
PRICES_CHECKED = "2025-11-30"


def _p(inp: float, out: float, cached: float | None = None) -> Price:
    return Price(input_per_mtok=inp, output_per_mtok=out, cached_input_per_mtok=cached)


#: Model name (or family prefix) -> price.
PRICES: dict[str, Price] = {
    # OpenAI
    "gpt-4o": _p(2.50, 10.00, 1.25),
    "gpt-4o-mini": _p(0.15, 0.60, 0.075),
    "gpt-4.1": _p(2.00, 8.00, 0.50),
    "gpt-4.1-mini": _p(0.40, 1.60, 0.10),
    "gpt-4.1-nano": _p(0.10, 0.40, 0.025),
    "gpt-5": _p(1.25, 10.00, 0.125),
    "gpt-5-mini": _p(0.25, 2.00, 0.025),
    "gpt-5-nano": _p(0.05, 0.40, 0.005),
    "o1": _p(15.00, 60.00, 7.50),
    "o3": _p(2.00, 8.00, 0.50),
    "o3-mini": _p(1.10, 4.40, 0.55),
    "o3-pro": _p(20.00, 80.00),
    "o4-mini": _p(1.10, 4.40, 0.275),
    # Anthropic (cached = cache read, 10% of input)
    "claude-opus-4": _p(15.00, 75.00, 1.50),
    "claude-opus-4-1": _p(15.00, 75.00, 1.50),
    "claude-opus-4-5": _p(5.00, 25.00, 0.50),
    "claude-sonnet-4": _p(3.00, 15.00, 0.30),
    "claude-sonnet-4-5": _p(3.00, 15.00, 0.30),
    "claude-3-7-sonnet": _p(3.00, 15.00, 0.30),
    "claude-haiku-4-5": _p(1.00, 5.00, 0.10),
    "claude-3-5-haiku": _p(0.80, 4.00, 0.08),
    "claude-3-haiku": _p(0.25, 1.25, 0.03),
}

#: The offline simulator's price: made up, small and nonzero so USD budgets can be
#: exercised without a vendor. Not any real model's price.
SIM_PRICE = _p(0.10, 0.40, 0.05)

#: What may follow a known name for a prefix match: a dated snapshot or version suffix
#: (``-20250929``, ``-2024-08-06``, ``@20250929``), never more letters (``gpt-4`` is not
#: ``gpt-4o``).
_SEPARATORS = ("-", "@")


def lookup_price(model_name: str) -> Price | None:
    """The table's price for ``model_name``: exact name, else the longest known prefix."""
    name = model_name.strip().lower()
    if name == "sim" or name.startswith(("sim:", "sim?")):
        return SIM_PRICE
    if name in PRICES:
        return PRICES[name]
    best: str | None = None
    for known in PRICES:
        if (
            name.startswith(known)
            and name[len(known)] in _SEPARATORS
            and (best is None or len(known) > len(best))
        ):
            best = known
    return PRICES[best] if best is not None else None


def price_for(agent: AgentSpec) -> Price | None:
    """The agent's price: its own ``price`` when given, else the table's, else ``None``."""
    if agent.price is not None:
        return agent.price
    if agent.provider == "sim":
        return SIM_PRICE
    return lookup_price(agent.model_name)


def require_price(agent: AgentSpec) -> Price:
    """:func:`price_for`, raising :class:`ConfigError` when the price is unknown.

    Use it when a USD budget applies: spending cannot be counted without a price.
    """
    price = price_for(agent)
    if price is None:
        raise ConfigError(
            f"no known price for model {agent.model!r}, so a USD budget cannot be enforced: "
            "pass price={'input_per_mtok': ..., 'output_per_mtok': ...} to its Agent, "
            "or budget it in tokens instead"
        )
    return price


def cost_usd(
    price: Price, input_tokens: int, output_tokens: int, cached_input_tokens: int = 0
) -> float:
    """USD for one call. ``cached_input_tokens`` are part of ``input_tokens`` and billed at
    the cached rate when the price has one (else at the input rate)."""
    cached = min(max(cached_input_tokens, 0), max(input_tokens, 0))
    uncached = max(input_tokens, 0) - cached
    cached_rate = (
        price.cached_input_per_mtok
        if price.cached_input_per_mtok is not None
        else price.input_per_mtok
    )
    total = (
        uncached * price.input_per_mtok
        + cached * cached_rate
        + max(output_tokens, 0) * price.output_per_mtok
    ) / 1_000_000
    return round(total, 10)
