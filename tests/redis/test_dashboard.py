"""The Grafana dashboard in deploy/ is built on metrics Duet really exposes: every series
its queries name is one a worker (workers.metrics) or ``duet metrics`` (the exporter, run
here on fakeredis with a budget and a batch in flight) serves."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

import workers.metrics  # noqa: F401 - registers the worker metrics
from duet.commands.exporter import FleetCollector
from orchestration.core.budget import Budget
from orchestration.state import keys
from orchestration.state.budgets import BudgetLedger

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "duet.json"
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def exposed(fake_redis: Any) -> set[str]:
    names = {
        family.name + suffix
        for family in REGISTRY.collect()
        if family.name.startswith("duet_")
        for suffix in SUFFIXES[family.type]
    }
    BudgetLedger(fake_redis).set_limits(
        "global:team", Budget(max_usd=5, max_tokens=1000, max_calls=10)
    )
    fake_redis.zadd(keys.open_runs(), {"r1": time.time() - 120, "r2": time.time()})
    fake_redis.zadd(keys.batches_index(), {"b1": 1.0})
    fake_redis.hset(keys.batch("b1"), mapping={"total": 3, "done": 1, "usd": 0.5})
    registry = CollectorRegistry()
    registry.register(FleetCollector(fake_redis, fake_redis))
    text = generate_latest(registry).decode()
    names |= set(re.findall(r"^(duet_\w+)", text, re.M))
    return names


def test_every_dashboard_query_names_an_exposed_series(fake_redis: Any) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 20
    used = {name for e in exprs for name in re.findall(r"\bduet_\w+", e)}
    missing = used - exposed(fake_redis)
    assert not missing, f"the dashboard queries series nobody serves: {sorted(missing)}"
    # The dashboard covers what an operator watches first.
    for needed in (
        "duet_model_cost_usd_total",
        "duet_runs_finished_total",
        "duet_budget_remaining_usd",
        "duet_queue_messages",
        "duet_step_duration_seconds_bucket",
        "duet_provider_errors_total",
        "duet_step_waits_total",
        "duet_runs_in_flight",
    ):
        assert needed in used, needed


def test_the_exporter_reads_budgets_and_batches(fake_redis: Any) -> None:
    """What ``duet metrics`` answers for a known state (fakeredis)."""
    assert {"duet_budget_limit_usd", "duet_budget_remaining_calls", "duet_queue_messages"} <= (
        exposed(fake_redis)
    )
    registry = CollectorRegistry()
    registry.register(FleetCollector(fake_redis, fake_redis))
    assert registry.get_sample_value("duet_runs_in_flight") == 2
    age = registry.get_sample_value("duet_oldest_run_in_flight_age_seconds")
    assert age is not None and 120 <= age < 180
    assert registry.get_sample_value("duet_batch_runs", {"batch": "b1", "state": "done"}) == 1
    assert registry.get_sample_value("duet_budget_limit_usd", {"scope": "global:team"}) == 5
    assert (
        registry.get_sample_value(
            "duet_budget_remaining_tokens", {"scope": "global:team", "direction": "total"}
        )
        == 1000
    )
    assert registry.get_sample_value("duet_queue_messages", {"queue": "actor"}) == 0
