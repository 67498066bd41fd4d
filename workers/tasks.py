"""The tasks: the three steps, the coordinator, and vendor batch collect and poll. Each is
one line into a service (:mod:`orchestration.services`, and :mod:`workers.vendor_batches`
for the vendor batches) and the Celery side of its answer (:func:`workers.runtime.follow`).
Messages carry ids only; content lives in Redis.
"""

from __future__ import annotations

import logging

from celery import Task

from orchestration.services.step import Park
from orchestration.state import keys
from workers import celery_ext, metrics, tracing
from workers import sweep as _sweep  # noqa: F401 - the periodic sweep starts with the worker
from workers.app import app
from workers.runtime import (
    INFRA_ERRORS,
    claim_of,
    dispatch,
    failures_of,
    follow,
    get_coordinator,
    get_liveness,
    get_steps,
    get_store,
    infra_retry,
    permit_of,
    waited_of,
)
from workers.secrets import redact
from workers.vendor_batches import collect, park_step, poll

log = logging.getLogger(__name__)


class StepTask(Task):
    #: Acked after it ran; a lost worker gives the message back (the step is idempotent).
    acks_late = True
    reject_on_worker_lost = True
    #: Transient failures are re-scheduled by the task itself with a countdown.
    max_retries = None
    ignore_result = True
    #: Task events (exception, traceback) leave the worker with secrets redacted.
    Request = celery_ext.REQUEST


def run_step(task: Task, run_id: str, step_key: str) -> None:
    """Body of the generate / critique / refine tasks.

    The claim is this delivery's own (a redelivered or duplicated message reuses the task
    id) and names this process, whose liveness key tells others whether it still lives.
    A Redis or broker error retries the task with backoff instead of failing it (a failed
    task's message is acked: the run would be stranded).
    """
    claimant: str | None = None
    try:
        claimant = get_liveness().claimant()
        outcome = get_steps().run(
            run_id,
            step_key,
            claimant=claimant,
            previous=claim_of(task),
            failures=failures_of(task),
            waited=waited_of(task),
            permit=permit_of(task),
        )
        if isinstance(outcome, Park):  # a vendor_batch agent: the call goes in a vendor batch
            park_step(task, outcome)
        else:
            follow(task, outcome)
    except INFRA_ERRORS as exc:
        raise infra_retry(task, exc, claim=claimant or claim_of(task) or None) from None


def _step(task: Task, run_id: str, step_key: str) -> None:
    if tracing.ENABLED:  # a span per step, in the run's trace (from the message header)
        with tracing.step_span(task.request, run_id, step_key):
            run_step(task, run_id, step_key)
    else:
        run_step(task, run_id, step_key)


@app.task(bind=True, base=StepTask, name=keys.TASK_GENERATE)
def generate(self: Task, run_id: str, step_key: str) -> None:
    """The actor writes the first draft."""
    _step(self, run_id, step_key)


@app.task(bind=True, base=StepTask, name=keys.TASK_CRITIQUE)
def critique(self: Task, run_id: str, step_key: str) -> None:
    """The critic scores the current output."""
    _step(self, run_id, step_key)


@app.task(bind=True, base=StepTask, name=keys.TASK_REFINE)
def refine(self: Task, run_id: str, step_key: str) -> None:
    """The actor revises the output to address the critique."""
    _step(self, run_id, step_key)


@app.task(bind=True, base=StepTask, name=keys.TASK_COORDINATE)
def coordinate(self: Task, run_id: str, seq: int) -> None:
    """Read the run, decide the next step (or the end), record it, enqueue it."""
    if tracing.ENABLED:  # the run's root span on its first transition
        with tracing.coordinate_span(self.request, run_id, seq):
            _coordinate(self, run_id, seq)
    else:
        _coordinate(self, run_id, seq)


def _coordinate(task: Task, run_id: str, seq: int) -> None:
    try:
        step = get_coordinator().advance(run_id, seq)
    except INFRA_ERRORS as exc:
        # Redis or the broker away: try the transition again later (it is idempotent; a
        # transition made but not sent is sent by the retry, see Coordinator._redispatch).
        raise infra_retry(task, exc) from None
    except Exception as exc:  # noqa: BLE001 - a run must end, never hang on a bug
        log.exception("coordinate %s/%s failed", run_id, seq)
        ended = get_store().fail_run(run_id, redact(f"coordinator: {type(exc).__name__}: {exc}"))
        if ended and metrics.ENABLED:
            metrics.RunObserver().run_finished({}, "failed", "coordinator:error")
        if ended:  # the place it held under its batch's max_in_flight goes on
            get_coordinator().pass_places(get_store().load_run(run_id)[0])
        return
    if step is not None:
        try:
            dispatch(step)
        except INFRA_ERRORS as exc:
            raise infra_retry(task, exc) from None


@app.task(bind=True, base=StepTask, name=keys.TASK_VB_COLLECT)
def vendor_batch_collect(self: Task, group: str) -> None:
    """Submit a group's parked requests as one vendor batch, when enough have gathered."""
    collect(group)


@app.task(bind=True, base=StepTask, name=keys.TASK_VB_POLL)
def vendor_batch_poll(self: Task, vendor_batch_id: str) -> None:
    """Check a vendor batch; when it has ended, store its results and hand the runs back."""
    poll(vendor_batch_id)
