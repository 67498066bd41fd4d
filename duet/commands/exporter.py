"""``duet metrics``: one Prometheus scrape target for the figures the fleet shares in
Redis — queue depth, runs and batches in flight, budgets (limit, spent, reserved,
remaining per scope). Workers serve their own per-process figures (model calls, tokens,
latency, errors: :mod:`workers.metrics`).

Everything is read when Prometheus scrapes (a few Redis round trips), nothing is kept.
Budget scopes exported: the ``global:`` and ``user:`` scopes given limits (with
``set_budgets`` or ``duet budget set``) and the ``batch:`` scopes of batches in flight;
``run:`` scopes are left out (one per run: too many series).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from orchestration.core.budget import UNITS
from orchestration.state import fleet, keys
from orchestration.state.budgets import BudgetLedger

#: Budget unit -> (metric name suffix, extra label value for ``direction`` or None).
_UNIT_NAMES = {
    "usd": ("usd", None),
    "calls": ("calls", None),
    "tokens": ("tokens", "total"),
    "input_tokens": ("tokens", "input"),
    "output_tokens": ("tokens", "output"),
}
assert set(_UNIT_NAMES) == set(UNITS), "a budget unit has no metric name"


class FleetCollector(Collector):
    """Reads the fleet's figures from Redis on each scrape.

    Args:
        client: the run-state Redis client.
        broker: the broker's Redis client (None when the broker is not Redis).
    """

    def __init__(self, client: Any, broker: Any | None, recent_batches: int = 1000) -> None:
        self.client, self.broker, self.recent = client, broker, recent_batches
        self.ledger = BudgetLedger(client)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if self.broker is not None:
            depth = GaugeMetricFamily(
                "duet_queue_messages",
                "Messages waiting in each queue (not yet taken).",
                labels=["queue"],
            )
            for name, n in fleet.queue_depths(self.broker, keys.ALL_QUEUES).items():
                depth.add_metric([name], n)
            yield depth
        count, oldest = fleet.open_runs(self.client)
        yield GaugeMetricFamily(
            "duet_runs_in_flight",
            "Runs submitted and not finished (queued or running).",
            value=count,
        )
        yield GaugeMetricFamily(
            "duet_oldest_run_in_flight_age_seconds",
            "Seconds since the oldest unfinished run was submitted (0 when none): a run "
            "stuck far longer than its rounds take shows here.",
            value=max(0.0, time.time() - oldest) if oldest is not None else 0.0,
        )
        batches = [b for b in fleet.recent_batches(self.client, self.recent) if b.in_flight]
        yield GaugeMetricFamily(
            "duet_batches_in_flight", "Batches with runs not finished yet.", value=len(batches)
        )
        runs = GaugeMetricFamily(
            "duet_batch_runs",
            "Runs of each unfinished batch: total and done.",
            labels=["batch", "state"],
        )
        spent_usd = GaugeMetricFamily(
            "duet_batch_cost_usd",
            "USD spent by each unfinished batch's finished runs.",
            labels=["batch"],
        )
        for b in batches:
            runs.add_metric([b.batch_id, "total"], b.total)
            runs.add_metric([b.batch_id, "done"], b.done)
            spent_usd.add_metric([b.batch_id], b.usd)
        yield runs
        yield spent_usd
        scopes = [*fleet.scopes_with_limits(self.ledger), *(f"batch:{b.batch_id}" for b in batches)]
        yield from self._budgets(fleet.budget_states(self.ledger, scopes))

    def _budgets(self, states: list[Any]) -> Iterator[GaugeMetricFamily]:
        families: dict[str, GaugeMetricFamily] = {}

        def add(what: str, unit: str, scope: str, value: float) -> None:
            suffix, direction = _UNIT_NAMES[unit]
            name = f"duet_budget_{what}_{suffix}"
            family = families.get(name)
            if family is None:
                labels = ["scope", "direction"] if direction else ["scope"]
                family = families[name] = GaugeMetricFamily(
                    name, f"Budget {what} per scope, in {suffix}.", labels=labels
                )
            family.add_metric([scope, direction] if direction else [scope], value)

        for state in states:
            for unit in UNITS:
                add("spent", unit, state.scope, state.spent.value(unit))
                add("reserved", unit, state.scope, state.reserved.value(unit))
            for unit, limit in state.limits.items():
                add("limit", unit, state.scope, limit)
                add("remaining", unit, state.scope, state.remaining[unit])
        yield from families.values()
