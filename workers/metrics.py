"""Prometheus metrics of a worker process: what a model call and a run's end record, and
the HTTP endpoint that serves them (``duet worker --metrics-port``, ``DUET_METRICS_PORT``).

Recorded where the facts are: a model call that answered or failed (tokens, USD, latency,
error kind), a step re-scheduled (a retry, a rate-limit or budget wait), a run's first and
last transition. A record is a dict look-up and a few counter increments in memory (no
Redis, no I/O); the labelled children are made once per (provider, model, role).

Names follow Prometheus conventions: ``duet_`` prefix, base units (seconds, tokens, USD),
``_total`` on counters. Model labels drop the ``sim`` options (``sim?scores=...`` is
``sim``), and an interruption reason drops its round (``actor:round_2:max_tokens`` is
``actor:max_tokens``), so the number of series stays bounded.

Fleet-wide figures held in Redis (budgets, queue depth, batches, runs in flight) are not
per worker: ``duet metrics`` exports them (:mod:`duet.commands.exporter`).

Several worker processes behind one port (a prefork pool, ``celery multi``): set
``PROMETHEUS_MULTIPROC_DIR`` to an empty directory before the processes start; each
writes its figures there and the port serves their sum.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Mapping
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    start_http_server,
)

from orchestration.core.errors import ConfigError
from orchestration.core.loop import ROLE_OF

log = logging.getLogger(__name__)

#: Model-call latency buckets, seconds: from a cached reply to a long reasoning call.
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120, 300)
#: Whole-run buckets, seconds.
RUN_BUCKETS = (0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)

_CALL = ("provider", "model", "role")

RUNS_STARTED = Counter("duet_runs_started_total", "Runs that made their first transition.")
RUNS_FINISHED = Counter(
    "duet_runs_finished_total",
    "Runs finished, by status and interruption reason (round dropped; empty when none).",
    ["status", "reason"],
)
RUN_DURATION = Histogram(
    "duet_run_duration_seconds",
    "From submit to the run's end, by status.",
    ["status"],
    buckets=RUN_BUCKETS,
)
MODEL_CALLS = Counter(
    "duet_model_calls_total",
    "Model calls made (answered or failed), by provider, model, role and outcome.",
    [*_CALL, "outcome"],
)
CACHE_HITS = Counter(
    "duet_model_cache_hits_total",
    "Model calls served from Duet's model-call cache.",
    ["provider", "model"],
)
CACHE_MISSES = Counter(
    "duet_model_cache_misses_total",
    "Model-call cache lookups that found nothing.",
    ["provider", "model"],
)
TOOL_CALLS = Counter(
    "duet_tool_calls_total",
    "Tool calls run by tool tasks, by tool and outcome (ok, error).",
    ["tool", "outcome"],
)
TOOL_CACHE = Counter(
    "duet_tool_cache_lookups_total",
    "Tool-result cache lookups of pure tools' calls, by tool and outcome (hit, miss).",
    ["tool", "outcome"],
)
TOOL_SECONDS = Histogram(
    "duet_tool_call_seconds",
    "Seconds one tool call ran, by tool.",
    ["tool"],
    buckets=LATENCY_BUCKETS,
)
INPUT_TOKENS = Counter(
    "duet_model_input_tokens_total", "Input tokens billed (cached ones included).", _CALL
)
CACHED_TOKENS = Counter(
    "duet_model_cached_input_tokens_total", "Input tokens served from the vendor's cache.", _CALL
)
OUTPUT_TOKENS = Counter("duet_model_output_tokens_total", "Output tokens billed.", _CALL)
COST_USD = Counter(
    "duet_model_cost_usd_total", "USD of model calls (0 for a model with no known price).", _CALL
)
STEP_LATENCY = Histogram(
    "duet_step_duration_seconds",
    "A step's model call, from its budget check to the stored answer, by phase and model.",
    ["phase", "model"],
    buckets=LATENCY_BUCKETS,
)
PROVIDER_ERRORS = Counter(
    "duet_provider_errors_total",
    "Failed model calls, by provider, model and kind (rate_limited, server_error, auth, ...).",
    ["provider", "model", "kind"],
)
RETRIES = Counter(
    "duet_step_retries_total",
    "Steps re-scheduled after a transient provider error, by provider, model and kind.",
    ["provider", "model", "kind"],
)
WAITS = Counter(
    "duet_step_waits_total",
    "Steps re-scheduled to wait (no failure): reason rate_limit or budget.",
    ["provider", "model", "reason"],
)
WAIT_SECONDS = Counter(
    "duet_step_wait_seconds_total",
    "Seconds steps were told to wait, by provider, model and reason.",
    ["provider", "model", "reason"],
)

REDIS_REFUSED = Gauge(
    "duet_redis_refused",
    "1 while this worker has stopped new work: its Redis would evict keys (or is a "
    "cluster node); 0 otherwise.",
)

_ROUND = re.compile(r":round_\d+")

#: Whether this process records metrics (set by :func:`enable`); the hooks check it first,
#: so a worker without a metrics port pays one attribute read per call.
ENABLED = False


def enable() -> None:
    """Record from now on (a worker with a metrics port, or a test)."""
    global ENABLED
    ENABLED = True


def model_label(model_name: str) -> str:
    """The ``model`` label: the model name without ``sim`` options."""
    return model_name.partition("?")[0]


def reason_label(reason: str | None) -> str:
    """The ``reason`` label: the interruption reason without its round."""
    return _ROUND.sub("", reason) if reason else ""


class _Call:
    """The labelled children of one (provider, model, role): made once, reused."""

    __slots__ = ("ok", "error", "input", "cached", "output", "usd", "latency", "provider", "model")

    def __init__(self, provider: str, model: str, phase: str) -> None:
        self.provider, self.model = provider, model
        role = ROLE_OF[phase]
        self.ok = MODEL_CALLS.labels(provider, model, role, "ok")
        self.error = MODEL_CALLS.labels(provider, model, role, "error")
        self.input = INPUT_TOKENS.labels(provider, model, role)
        self.cached = CACHED_TOKENS.labels(provider, model, role)
        self.output = OUTPUT_TOKENS.labels(provider, model, role)
        self.usd = COST_USD.labels(provider, model, role)
        self.latency = STEP_LATENCY.labels(phase, model)


_calls: dict[tuple[str, str, str], _Call] = {}


def _call(agent: Any, phase: str) -> _Call:
    key = (agent.provider, agent.model_name, phase)
    found = _calls.get(key)
    if found is None:
        found = _calls[key] = _Call(agent.provider, model_label(agent.model_name), phase)
    return found


def call_answered(agent: Any, phase: str, result: Mapping[str, Any]) -> None:
    """A model call answered: ``result`` is the step's stored result."""
    c = _call(agent, phase)
    c.ok.inc()
    c.input.inc(result["input_tokens"])
    c.output.inc(result["output_tokens"])
    if result.get("cached_input_tokens"):
        c.cached.inc(result["cached_input_tokens"])
    if result["usd"]:
        c.usd.inc(result["usd"])
    c.latency.observe(max(0.0, result["finished_at"] - result["started_at"]))


def call_failed(agent: Any, phase: str, kind: str, *, retried: bool) -> None:
    """A model call failed with error ``kind``; ``retried``: the step is re-scheduled."""
    c = _call(agent, phase)
    c.error.inc()
    PROVIDER_ERRORS.labels(c.provider, c.model, kind).inc()
    if retried:
        RETRIES.labels(c.provider, c.model, kind).inc()


def call_cached(agent: Any, hit: bool) -> None:
    """A model-call cache lookup: ``hit`` served the answer (no call made), else a miss."""
    (CACHE_HITS if hit else CACHE_MISSES).labels(
        agent.provider, model_label(agent.model_name)
    ).inc()


def step_waits(agent: Any, reason: str, seconds: float) -> None:
    """A step is re-scheduled to wait ``seconds`` for a rate limit or budget room."""
    model = model_label(agent.model_name)
    WAITS.labels(agent.provider, model, reason).inc()
    WAIT_SECONDS.labels(agent.provider, model, reason).inc(seconds)


class StepObserver:
    """The step service's observer (``orchestration.services.step.StepObserver``)."""

    def step_waits(self, agent: Any, reason: str, seconds: float) -> None:
        step_waits(agent, reason, seconds)

    def call_failed(self, agent: Any, phase: str, kind: str, *, retried: bool) -> None:
        call_failed(agent, phase, kind, retried=retried)

    def call_answered(self, agent: Any, phase: str, result: Mapping[str, Any]) -> None:
        call_answered(agent, phase, result)

    def call_cached(self, agent: Any, hit: bool) -> None:
        call_cached(agent, hit)


class ToolObserver:
    """The tool service's observer (``orchestration.services.tools.ToolObserver``)."""

    def tool_called(self, name: str, seconds: float, ok: bool) -> None:
        TOOL_CALLS.labels(name, "ok" if ok else "error").inc()
        TOOL_SECONDS.labels(name).observe(seconds)

    def tool_cached(self, name: str, hit: bool) -> None:
        """A tool-result cache lookup: ``hit`` served the result (no tool ran)."""
        TOOL_CACHE.labels(name, "hit" if hit else "miss").inc()


class RunObserver:
    """Counts runs started and finished (a coordinator observer; see
    :class:`orchestration.services.coordinator.RunObserver`)."""

    def run_started(self, run: Mapping[str, str]) -> None:
        RUNS_STARTED.inc()

    def run_finished(self, run: Mapping[str, str], status: str, reason: str | None) -> None:
        RUNS_FINISHED.labels(status, reason_label(reason)).inc()
        created = run.get("created_at")
        if created:
            RUN_DURATION.labels(status).observe(max(0.0, time.time() - float(created)))


def serve(port: int, addr: str = "0.0.0.0") -> None:  # noqa: S104 - scraped from outside
    """Serve this process's metrics (or, with ``PROMETHEUS_MULTIPROC_DIR``, the sum over
    the processes writing there) on ``port`` from a daemon thread."""
    registry = None
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
    enable()
    disable_created_metrics()  # a ``_created`` series per child: a third more to scrape
    try:
        if registry is None:
            start_http_server(port, addr)
        else:
            start_http_server(port, addr, registry=registry)
    except OSError as exc:
        raise ConfigError(f"DUET_METRICS_PORT {port}: cannot listen on {addr}: {exc}") from exc
    log.info("metrics on http://%s:%s/metrics", addr, port)


def process_exited(pid: int) -> None:
    """A worker child process ended: drop its live gauges (multiprocess mode only)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)
