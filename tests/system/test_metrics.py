"""Prometheus metrics on a real fleet: a worker's ``/metrics`` and ``duet metrics``, scraped
over HTTP and parsed with ``prometheus_client.parser``, move by exactly what a batch did."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from duet.embedded.server import free_port
from orchestration import Agent, Budget, Team, set_budgets
from orchestration.core.ratelimit import limit_name
from orchestration.state.ratelimits import RateLimiter
from tests.support import ROOT, celery_worker, client_pointed_at, wait_for

pytestmark = pytest.mark.system

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int) -> Samples:
    """Every sample at ``http://127.0.0.1:port/metrics``, by (name, labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def _finished(samples: Samples) -> float:
    """Runs counted finished, whatever their status and reason."""
    return sum(v for (name, _), v in samples.items() if name == "duet_runs_finished_total")


def answers(port: int) -> Samples | None:
    try:
        return scrape(port)
    except OSError:
        return None


@contextlib.contextmanager
def exporter(redis_url: str) -> Iterator[int]:
    """``duet metrics`` on a free port, once it answers."""
    port = free_port()
    env = {**os.environ, "DUET_REDIS_URL": redis_url}
    env.pop("DUET_BROKER_URL", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "duet", "metrics", "--port", str(port), "--host", "127.0.0.1"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(lambda: proc.poll() is not None or answers(port) is not None, 30, "duet metrics")
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        yield port
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stderr:
            proc.stderr.close()


@pytest.mark.parametrize("processes", ["one", "multiprocess-dir"])
def test_a_batch_moves_each_metric_by_what_it_did(
    redis_url: str, redis_client: Any, processes: str, tmp_path: Path
) -> None:
    """Also with PROMETHEUS_MULTIPROC_DIR (several processes summed behind one port)."""
    port = free_port()
    critic = Agent("Review.", model="sim?scores=0.2,0.95&latency_ms=20")
    approved = Team.actor_critic(  # generate, critique 0.2, refine, critique 0.95: approved
        actor=Agent("Fix.", model="sim?latency_ms=20"),
        critic=critic,
        global_budgets=["metrics-test"],
    )
    failing = Team.actor_critic(  # a transient error on every attempt: 2 attempts, 1 retry
        actor=Agent("Fix.", model="sim?fail_at=0&fail=server_error"), critic=critic
    )
    truncated = Team.actor_critic(  # cut at max_tokens on the first draft
        actor=Agent("Fix.", model="sim?truncate_at=0"), critic=critic
    )
    paused = Team.actor_critic(  # approved in round 1 after one fleet-wide pause
        actor=Agent("Fix.", model="sim?latency_ms=1"),
        critic=Agent("Review.", model="sim?scores=0.95"),
    )
    env = {"DUET_METRICS_PORT": str(port), "DUET_MAX_ATTEMPTS": "2", "DUET_RETRY_BASE_S": "0.05"}
    if processes == "multiprocess-dir":
        env["PROMETHEUS_MULTIPROC_DIR"] = str(tmp_path)
    with client_pointed_at(redis_url), exporter(redis_url) as fleet_port:
        set_budgets({"global:metrics-test": Budget(max_usd=100)})
        with celery_worker(redis_url, env=env, name="metrics"):
            before = scrape(port)
            batch = approved.submit_batch([f"snippet {i}" for i in range(4)])
            others = [failing.submit("f"), truncated.submit("t")]
            name = limit_name("sim", paused.spec.actor.model_name)
            RateLimiter(redis_client).pause(name, 1.0)
            others.append(paused.submit("p"))
            results = [*batch.results(timeout=60), *(h.result(timeout=60) for h in others)]
            # A run's result is in Redis a moment before its worker counts it finished.
            after = wait_for(
                lambda: (
                    (now := scrape(port))
                    and _finished(now) - _finished(before) >= len(results)
                    and now
                ),
                10,
                "every finished run counted",
            )
        if processes == "multiprocess-dir":
            assert any(tmp_path.glob("counter_*.db")), "figures written to the shared directory"

        assert [(r.status, r.interruption_reason) for r in results] == [
            *[("approved", None)] * 4,
            ("interrupted", "actor:round_0:provider_error:server_error"),
            ("interrupted", "actor:round_0:max_tokens"),
            ("approved", None),
        ]

        def moved(name: str, **labels: str) -> float:
            return value(after, name, **labels) - value(before, name, **labels)

        # The simulator's model names carry their role (``sim:actor``) but not options.
        actor = {"provider": "sim", "model": "sim:actor"}
        critic = {"provider": "sim", "model": "sim:critic"}
        assert moved("duet_runs_started_total") == 7
        assert moved("duet_runs_finished_total", status="approved", reason="") == 5
        assert (
            moved(
                "duet_runs_finished_total",
                status="interrupted",
                reason="actor:provider_error:server_error",
            )
            == 1
        )
        assert (
            moved("duet_runs_finished_total", status="interrupted", reason="actor:max_tokens") == 1
        )
        assert moved("duet_run_duration_seconds_count", status="approved") == 5
        assert moved("duet_model_calls_total", **actor, role="actor", outcome="ok") == 4 * 2 + 1 + 1
        assert moved("duet_model_calls_total", **critic, role="critic", outcome="ok") == 4 * 2 + 1
        assert moved("duet_model_calls_total", **actor, role="actor", outcome="error") == 2
        assert moved("duet_model_calls_total", **critic, role="critic", outcome="error") == 0
        assert moved("duet_provider_errors_total", **actor, kind="server_error") == 2
        assert moved("duet_step_retries_total", **actor, kind="server_error") == 1
        assert moved("duet_step_waits_total", **actor, reason="rate_limit") == 1
        # the 1 s pause, stretched by up to half so that waiting calls come back spread
        assert 0 < moved("duet_step_wait_seconds_total", **actor, reason="rate_limit") <= 1.5
        for phase, model, calls in (
            ("generate", "sim:actor", 4 + 1 + 1),
            ("critique", "sim:critic", 4 * 2 + 1),
            ("refine", "sim:actor", 4),
        ):
            assert moved("duet_step_duration_seconds_count", phase=phase, model=model) == calls
        assert moved("duet_step_duration_seconds_sum", phase="refine", model="sim:actor") >= 0.08
        for role, sim in (("actor", actor), ("critic", critic)):
            usage = [r.usage.by_role[role] for r in results if role in r.usage.by_role]
            for metric, field in (
                ("duet_model_input_tokens_total", "input_tokens"),
                ("duet_model_output_tokens_total", "output_tokens"),
                ("duet_model_cached_input_tokens_total", "cached_input_tokens"),
            ):
                expected = sum(getattr(u, field) for u in usage)
                assert moved(metric, **sim, role=role) == expected, (metric, role)
            usd = sum(u.usd for u in usage)
            assert usd > 0
            assert moved("duet_model_cost_usd_total", **sim, role=role) == pytest.approx(usd)

        # The exporter: budgets from Redis, then a backlog with no worker to take it.
        spent = sum(r.usage.total.usd for r in results[:4])
        fleet = scrape(fleet_port)
        scope = {"scope": "global:metrics-test"}
        # The ledger charges each call rounded up to the micro-dollar.
        charged = value(fleet, "duet_budget_spent_usd", **scope)
        assert spent <= charged <= spent + 16e-6
        assert value(fleet, "duet_budget_limit_usd", **scope) == 100
        assert value(fleet, "duet_budget_remaining_usd", **scope) == pytest.approx(100 - charged)
        assert value(fleet, "duet_budget_spent_calls", **scope) == 4 * 4
        assert value(fleet, "duet_runs_in_flight") == 0
        assert value(fleet, "duet_oldest_run_in_flight_age_seconds") == 0
        waiting = approved.submit_batch(["a", "b", "c"])
        single = approved.submit("d")  # a run outside any batch counts too
        fleet = scrape(fleet_port)
        assert value(fleet, "duet_queue_messages", queue="coordinator") == 4
        assert value(fleet, "duet_queue_messages", queue="actor") == 0
        assert value(fleet, "duet_runs_in_flight") == 4
        assert value(fleet, "duet_oldest_run_in_flight_age_seconds") > 0
        assert single.status() == "queued"
        assert value(fleet, "duet_batches_in_flight") == 1
        assert value(fleet, "duet_batch_runs", batch=waiting.batch_id, state="total") == 3
        assert value(fleet, "duet_batch_runs", batch=waiting.batch_id, state="done") == 0


def test_vendor_batch_calls_are_counted_when_their_results_are_stored(
    redis_url: str, redis_client: Any
) -> None:
    """Steps of ``execution="vendor_batch"`` agents make no call themselves: the poller
    stores their results, and that is where they are counted (USD at the batch rate)."""
    from duet.standin.server import FakeLLM

    port = free_port()
    with FakeLLM() as openai, client_pointed_at(redis_url):
        env = {
            "DUET_METRICS_PORT": str(port),
            "OPENAI_BASE_URL": openai.url,
            "OPENAI_API_KEY": "sk-test-metrics",
            "DUET_VENDOR_BATCH_GATHER_S": "0.3",
            "DUET_VENDOR_BATCH_POLL_MAX_S": "0.3",
        }
        team = Team.actor_critic(
            actor=Agent("Fix.", model="gpt-4o", execution="vendor_batch"),
            critic=Agent("Review. JSON please.", model="gpt-4o", execution="vendor_batch"),
            max_rounds=1,
            persistent_subagents=False,
        )
        with celery_worker(redis_url, env=env, name="metrics-vb"):
            before = scrape(port)
            results = list(team.submit_batch([f"task {i}" for i in range(3)]).results(timeout=120))
            after = scrape(port)
        assert openai.stats()["batches"]["batch_requests"] > 0
    gpt = {"provider": "openai", "model": "gpt-4o"}
    for role in ("actor", "critic"):
        usage = [r.usage.by_role[role] for r in results if role in r.usage.by_role]
        calls = value(after, "duet_model_calls_total", **gpt, role=role, outcome="ok") - value(
            before, "duet_model_calls_total", **gpt, role=role, outcome="ok"
        )
        assert calls == sum(u.calls for u in usage) > 0
        usd = value(after, "duet_model_cost_usd_total", **gpt, role=role) - value(
            before, "duet_model_cost_usd_total", **gpt, role=role
        )
        assert usd == pytest.approx(sum(u.usd for u in usage))
