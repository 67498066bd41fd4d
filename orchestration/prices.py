"""Model prices from the maintained ``genai-prices`` database, as core :class:`Price` values.

The only module that imports ``genai_prices``. The database is a data package bundled
with the installed version (pinned in ``pyproject.toml``): looking a model up reads no
network, no environment and no files. It does read the clock here — a vendor's price can
change on a date, so the price in force today (UTC) is the one returned, and a process
looks each model up again when the date changes. Its auto-updater, which would fetch
prices over HTTP, is never used.

Rates read: input, output, cache read, cache write (5-minute) and, from the
``processing = batch`` variant, the vendor batch rates; long-context tiers are kept.
A model the database does not know has no listed price (``None``): a USD budget on it is
refused unless the agent gives its own ``price=``.
"""

from __future__ import annotations

import datetime
import threading
from decimal import Decimal
from functools import lru_cache
from typing import Any

from orchestration.core.agents import AgentSpec, Price, PriceTier
from orchestration.core.pricing import choose_price
from orchestration.core.pricing import require_price as _require

#: Duet's provider name -> the database's provider id.
PROVIDER_IDS = {"openai": "openai", "anthropic": "anthropic"}
#: The request context that selects vendor batch rates in the database.
BATCH_CONTEXT = {"processing": "batch"}

_lock = threading.Lock()


def listed_price(
    provider: str, model_name: str, *, on: datetime.date | None = None
) -> Price | None:
    """The database's price of ``model_name`` at ``provider`` on date ``on`` (today, UTC,
    when not given); ``None`` when it does not list the model."""
    provider_id = PROVIDER_IDS.get(provider)
    if provider_id is None:
        return None
    day = on if on is not None else datetime.datetime.now(datetime.timezone.utc).date()
    with _lock:  # the database's lookup cache is a plain dict
        return _listed(provider_id, model_name.strip().lower(), day)


@lru_cache(maxsize=512)
def _listed(provider_id: str, model_name: str, day: datetime.date) -> Price | None:
    from genai_prices import data_snapshot  # a large data module: import on first lookup

    try:
        _, model = data_snapshot.get_snapshot().find_provider_model(
            model_name, None, provider_id, None
        )
    except LookupError:
        return None
    when = datetime.datetime.combine(day, datetime.time(12), datetime.timezone.utc)
    standard = model.get_prices(when)
    batch = model.get_prices(when, BATCH_CONTEXT)  # type: ignore[arg-type]
    price = _price(standard)
    if price is None:
        return None
    batch_price = _price(batch)
    if batch_price is not None and batch_price != price:
        price = price.model_copy(update={"batch": batch_price})
    return price


def _price(model_price: Any) -> Price | None:
    """A database ``ModelPrice`` as a :class:`Price` (with its tiers); ``None`` without
    input and output token rates."""
    fields = {
        "input_per_mtok": getattr(model_price, "input_mtok", None),
        "output_per_mtok": getattr(model_price, "output_mtok", None),
        "cached_input_per_mtok": getattr(model_price, "cache_read_mtok", None),
        "cache_write_per_mtok": getattr(model_price, "cache_write_mtok", None),
    }
    if fields["input_per_mtok"] is None or fields["output_per_mtok"] is None:
        return None
    thresholds = sorted(
        {tier.start for value in fields.values() for tier in getattr(value, "tiers", None) or ()}
    )
    tiers = tuple(
        PriceTier(
            above_input_tokens=start,
            price=Price.model_validate(
                {k: _rate(v, start) for k, v in fields.items() if v is not None}
            ),
        )
        for start in thresholds
    )
    rates: dict[str, Any] = {k: _rate(v) for k, v in fields.items() if v is not None}
    return Price.model_validate({**rates, "tiers": tiers})


def _rate(value: Any, input_tokens: int | None = None) -> float:
    """A flat or tiered database rate as a float, at the tier ``input_tokens`` reaches."""
    if isinstance(value, Decimal):
        return float(value)
    rate = value.base
    for tier in value.tiers:  # sorted by start
        if input_tokens is not None and input_tokens >= tier.start:
            rate = tier.price
    return float(rate)


def price_for(agent: AgentSpec) -> Price | None:
    """The agent's price: its own ``price``, else the simulator's or the database's, else
    ``None``."""
    if agent.price is not None or agent.provider == "sim":
        return choose_price(agent, None)
    return choose_price(agent, listed_price(agent.provider, agent.model_name))


def require_price(agent: AgentSpec, *, toml_section: str | None = None) -> Price:
    """:func:`price_for`, raising :class:`~orchestration.core.errors.ConfigError` when the
    price is unknown (a USD budget cannot be counted without one). ``toml_section``
    (``"actor"``) makes the advice TOML, for agents from a config file."""
    listed = None if agent.price is not None else listed_price(agent.provider, agent.model_name)
    return _require(agent, listed, toml_section=toml_section)
