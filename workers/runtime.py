"""Per-process wiring of a worker: one Redis pool, and the services the tasks call.

The services are Celery-free (:mod:`orchestration.services`); this module builds them
once per process with this process's settings, provider adapters and Redis client, and
sends the messages they ask for.
"""

from __future__ import annotations

import threading
from typing import Any

from celery import current_task

from orchestration.services.budgeting import Budgets
from orchestration.services.coordinator import Coordinator, Dispatch
from orchestration.services.step import Handover, RetryLater, StepOutcome, StepService
from orchestration.settings import get_settings
from orchestration.state.connection import get_redis
from orchestration.state.keys import TASK_COORDINATE
from orchestration.state.runs import RunStore
from workers import metrics, tracing
from workers.app import SEND_OPTIONS, app
from workers.logs import BATCH_HEADER
from workers.providers import provider_for
from workers.secrets import redact

_lock = threading.RLock()
_store: RunStore | None = None
_coordinator: Coordinator | None = None
_steps: StepService | None = None


def get_store() -> RunStore:
    global _store
    if _store is None:
        with _lock:
            if _store is None:
                _store = RunStore(get_redis(), finished_ttl_s=get_settings().finished_ttl_s)
    return _store


def _build() -> tuple[Coordinator, StepService]:
    global _coordinator, _steps
    with _lock:
        if _coordinator is None or _steps is None:
            store = get_store()
            budgets = Budgets(store.r)
            # What the services tell of runs and calls: metrics and traces, when on.
            watchers = [m for m in (metrics, tracing) if m.ENABLED]
            _coordinator = Coordinator(
                store,
                budget_check=budgets.round_check,
                observers=tuple(m.RunObserver() for m in watchers),
            )
            _steps = StepService(
                store, budgets, provider_for, get_settings(), redact,
                observers=tuple(m.StepObserver() for m in watchers),
            )  # fmt: skip
        return _coordinator, _steps


def get_coordinator() -> Coordinator:
    return _coordinator if _coordinator is not None else _build()[0]


def get_steps() -> StepService:
    return _steps if _steps is not None else _build()[1]


def reset() -> None:
    """Forget per-process state (after the Redis URL changed, or in a forked child)."""
    global _store, _coordinator, _steps
    with _lock:
        _store = None
        _coordinator = None
        _steps = None


def send(name: str, args: tuple[str, str | int], batch_id: str | None = None) -> None:
    """Send task ``name`` with ``args`` (ids only).

    The arguments' repr for Flower is written here (ids are short: it is what Celery's
    ``saferepr`` would make, without its ~20 us), and :data:`app.SEND_OPTIONS` applies.
    The run's batch id rides in a header (for the logs of the task that gets it): given,
    or forwarded from the task sending this one.
    """
    if batch_id is None:
        task = current_task
        batch_id = getattr(task.request, BATCH_HEADER, None) if task else None
    headers = {BATCH_HEADER: batch_id} if batch_id else {}
    if tracing.ENABLED:  # the run's trace context (workers.tracing)
        parent = tracing.traceparent()
        if parent:
            headers[tracing.TRACE_HEADER] = parent
    if headers:
        options = {**SEND_OPTIONS, "headers": headers}
        app.send_task(name, args=args, argsrepr=repr(args), kwargsrepr="{}", **options)
    else:
        app.send_task(name, args=args, argsrepr=repr(args), kwargsrepr="{}", **SEND_OPTIONS)


def send_later(name: str, args: tuple[str, ...], countdown: float) -> None:
    """Send task ``name`` with ``args`` (ids only) to run in ``countdown`` seconds."""
    app.send_task(name, args=args, argsrepr=repr(args), kwargsrepr="{}",
                  countdown=max(0.0, countdown), **SEND_OPTIONS)  # fmt: skip


def coordinator_send(run_id: str, seq: int) -> None:
    """Hand the run to the coordinator for transition ``seq``."""
    send(TASK_COORDINATE, (run_id, seq))


def dispatch(step: Dispatch) -> None:
    """Enqueue a step the coordinator decided on.

    Nothing is written after the send: the step's begin script notes that it arrived
    (``dispatched``), which is what a redelivered coordinator message checks.
    """
    send(step.task, (step.run_id, step.step_key), step.batch_id)


#: Message header counting a step's failed provider attempts. Waiting for a rate limit
#: or for budget room re-schedules the step too, but is not a failure.
FAILURES_HEADER = "duet_failures"


class StepRetry(Exception):
    """A step re-scheduled; the message says why, scrubbed of secrets (Flower shows it)."""


def failures_of(task: Any) -> int:
    """The step's failed provider attempts so far (carried in a message header)."""
    return int((task.request.headers or {}).get(FAILURES_HEADER, 0))


def follow(task: Any, outcome: StepOutcome | Handover | RetryLater | None) -> None:
    """Do what the step service answered: hand the run to its coordinator, or re-schedule
    the step (``task.retry`` keeps the task id, so the retry holds the same step claim)."""
    if isinstance(outcome, Handover):
        coordinator_send(outcome.run_id, outcome.seq)
    elif isinstance(outcome, RetryLater):
        # The retry's headers replace the message's: keep the others (batch id, trace).
        headers = {**(task.request.headers or {}), FAILURES_HEADER: outcome.failures}
        raise task.retry(
            countdown=outcome.delay_s,
            exc=StepRetry(outcome.reason or "waiting"),
            max_retries=None,
            headers=headers,
        )
