"""Per-process state of a worker: one Redis pool, one store, one coordinator."""

from __future__ import annotations

import threading

from celery import current_task

from orchestration.services.coordinator import Coordinator, Dispatch, RunObserver
from orchestration.settings import get_settings
from orchestration.state.connection import get_redis
from orchestration.state.keys import TASK_COORDINATE
from orchestration.state.runs import RunStore
from workers import metrics, tracing
from workers.app import SEND_OPTIONS, app
from workers.budgeting import Budgets
from workers.logs import BATCH_HEADER

_lock = threading.RLock()
_store: RunStore | None = None
_coordinator: Coordinator | None = None
_budgets: Budgets | None = None


def get_store() -> RunStore:
    global _store
    if _store is None:
        with _lock:
            if _store is None:
                _store = RunStore(get_redis(), finished_ttl_s=get_settings().finished_ttl_s)
    return _store


def get_coordinator() -> Coordinator:
    global _coordinator
    if _coordinator is None:
        with _lock:
            if _coordinator is None:
                _coordinator = Coordinator(
                    get_store(), budget_check=get_budgets().round_check, observers=_observers()
                )
    return _coordinator


def _observers() -> tuple[RunObserver, ...]:
    """What the coordinator tells of run starts and ends: metrics and traces, when on."""
    found: list[RunObserver] = []
    if metrics.ENABLED:
        found.append(metrics.RunObserver())
    if tracing.ENABLED:
        found.append(tracing.RunObserver())
    return tuple(found)


def get_budgets() -> Budgets:
    global _budgets
    if _budgets is None:
        with _lock:
            if _budgets is None:
                _budgets = Budgets(get_redis())
    return _budgets


def reset() -> None:
    """Forget per-process state (after the Redis URL changed, or in a forked child)."""
    global _store, _coordinator, _budgets
    with _lock:
        _store = None
        _coordinator = None
        _budgets = None


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
