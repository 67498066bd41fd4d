"""Per-process wiring of a worker: one Redis pool, and the services the tasks call.

The services are Celery-free (:mod:`orchestration.services`); this module builds them
once per process with this process's settings, provider adapters and Redis client, and
sends the messages they ask for.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import kombu.exceptions
import redis
from celery import current_task
from celery.exceptions import Reject, Retry
from celery.signals import worker_ready

from orchestration.backoff import IN_PLACE, INFRA
from orchestration.defaults import PUBLISH_PATIENCE_S
from orchestration.services.budgeting import Budgets
from orchestration.services.callcaching import CallCache
from orchestration.services.coordinator import Coordinator, Dispatch
from orchestration.services.liveness import Liveness
from orchestration.services.runcaching import ResultKeeper
from orchestration.services.step import Handover, RetryLater, StepOutcome, StepService
from orchestration.services.toolcaching import ToolResultCache
from orchestration.services.tools import ToolService
from orchestration.settings import get_settings
from orchestration.state import keypolicies
from orchestration.state.callcache import RedisCallStore, open_call_store
from orchestration.state.connection import INFRA_ERRORS as REDIS_INFRA_ERRORS
from orchestration.state.connection import get_redis
from orchestration.state.keys import TASK_COORDINATE
from orchestration.state.runs import Outgoing, RunStore
from workers import metrics, publish, spec_keys, tracing
from workers.app import SEND_OPTIONS, app, direct_push
from workers.celery_ext import Waiting
from workers.logs import BATCH_HEADER
from workers.providers import provider_for
from workers.secrets import redact, scrub_output

log = logging.getLogger(__name__)
_lock = threading.RLock()
_store: RunStore | None = None
_coordinator: Coordinator | None = None
_steps: StepService | None = None
_liveness: Liveness | None = None
_tools: ToolService | None = None


def yield_cache() -> int:
    """Run state met ``OOM``: the model-call cache gives its room back (entries evicted;
    0 when the cache is not in this Redis)."""
    if not get_settings().redis_url:  # the embedded default's cache is a disk file
        return 0
    try:
        evicted = RedisCallStore(get_store().r).make_room()
    except REDIS_INFRA_ERRORS as exc:
        log.warning("the model-call cache could not give room back: %s", exc)
        return 0
    if evicted:
        log.warning("Redis is full: %d model-call cache entries evicted for run state", evicted)
    return evicted


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
            budgets = Budgets(
                store.r,
                settled_ttl_s=store.finished_ttl_s,
                pause_recheck_s=get_settings().pause_recheck_s,
            )
            # What the services tell of runs and calls: metrics and traces, when on.
            watchers = [m for m in (metrics, tracing) if m.ENABLED]
            calls = open_call_store(
                store.r, get_settings().redis_url, get_settings().fleet_key_value()
            )
            _coordinator = Coordinator(
                store,
                results=ResultKeeper(calls),
                budget_check=budgets.round_check,
                observers=tuple(m.RunObserver() for m in watchers),
                dispatch_message=dispatch_message,
                send_transition=coordinator_send,
                give_room=yield_cache,
            )
            _steps = StepService(
                store,
                budgets,
                provider_for,
                get_settings(),
                redact,
                observers=tuple(m.StepObserver() for m in watchers),
                scrub_output=scrub_output,
                spec_seen=spec_keys.register,
                handover_message=handover_message,
                list_mcp=_list_mcp,
                cache=CallCache(
                    calls,
                    tuple(m.StepObserver() for m in watchers),
                ),
                give_room=yield_cache,
            )
        return _coordinator, _steps


def _list_mcp(server: Any) -> Any:
    """The tools of an MCP server (the MCP SDK is imported on the first listing)."""
    from workers.tools.runner import list_mcp

    return list_mcp(server)


def get_coordinator() -> Coordinator:
    return _coordinator if _coordinator is not None else _build()[0]


def get_steps() -> StepService:
    return _steps if _steps is not None else _build()[1]


def get_tools() -> ToolService:
    """This process's tool service (loads the toolset modules and says which tools it knows
    on first use)."""
    global _tools
    if _tools is None:
        with _lock:
            if _tools is None:
                from workers.tools import registry, runner

                store = get_store()
                runner.load_configured()
                runner.publish(store.r)
                watchers = [m for m in (metrics, tracing) if m.ENABLED]
                observers = tuple(m.ToolObserver() for m in watchers)
                calls = open_call_store(
                    store.r, get_settings().redis_url, get_settings().fleet_key_value()
                )
                _tools = ToolService(
                    store,
                    runner.run_tool,
                    scrub_output,
                    observers=observers,
                    cache=ToolResultCache(calls, registry.identify, observers),
                )
    return _tools


def get_liveness() -> Liveness:
    """This process's liveness key (see :mod:`orchestration.services.liveness`)."""
    global _liveness
    if _liveness is None:
        with _lock:
            if _liveness is None:
                _liveness = Liveness(
                    get_store().r,
                    get_settings().process_ttl_s,
                    also=publish_key_policy,
                    held=held_messages,
                )
    return _liveness


def held_messages() -> dict[str, str]:
    """The broker messages this worker process holds (received, not yet acknowledged:
    waiting, running or scheduled for later), delivery tag -> run id."""
    from celery.worker import state

    held = {}
    for request in list(state.requests.values()):
        tag = getattr(request.message, "delivery_tag", None)
        args = request.args
        if tag and args:
            held[str(tag)] = str(args[0])
    return held


def publish_key_policy(client: Any, ttl_s: int) -> None:
    """Publish this worker's key policy beside its liveness (clients check it at submit)."""
    keypolicies.publish(client, get_settings().key_policy().to_json(), ttl_s)


def stop_liveness() -> None:
    """Stop renewing this process's liveness key (its last worker stopped: nothing of it
    claims a step any more); a later claim starts a new one, under a new id."""
    global _liveness
    with _lock:
        if _liveness is not None:
            _liveness.stop()
        _liveness = None


def reset() -> None:
    """Forget per-process state (after the Redis URL changed, or in a forked child)."""
    global _store, _coordinator, _steps, _liveness, _tools
    with _lock:
        if _liveness is not None:
            _liveness.stop()
        _store = None
        _coordinator = None
        _steps = None
        _liveness = None
        _tools = None


def _headers(batch_id: str | None) -> dict[str, Any]:
    """A message's own headers: the run's batch id (for the logs of the task that gets
    it: given, or forwarded from the task sending this one) and the trace context."""
    if batch_id is None:
        task = current_task
        batch_id = getattr(task.request, BATCH_HEADER, None) if task else None
    headers = {BATCH_HEADER: batch_id} if batch_id else {}
    if tracing.ENABLED:  # the run's trace context (workers.tracing)
        parent = tracing.traceparent()
        if parent:
            headers[tracing.TRACE_HEADER] = parent
    return headers


def outgoing(
    name: str, args: tuple[str, str | int], batch_id: str | None = None
) -> Outgoing | None:
    """Task ``name``'s message with ``args``, for a state script to push with the change
    that calls for it — when the broker is the run-state Redis; else None (:func:`send`
    sends it after the change)."""
    if not (direct_push() and publish.shares_state_redis()):
        return None
    queue, text = publish.message(app, name, args, _headers(batch_id))
    return Outgoing(publish.list_key(name, queue), text)


def handover_message(run_id: str, seq: int) -> Outgoing | None:
    """The message handing ``run_id`` to its coordinator for transition ``seq``, pushed
    with the step's store (``StepService``)."""
    return outgoing(TASK_COORDINATE, (run_id, seq))


def dispatch_message(step: Dispatch) -> Outgoing | None:
    """The message of a step the coordinator decided on, pushed with the transition."""
    return outgoing(step.task, (step.run_id, step.step_key), step.batch_id)


def send(name: str, args: tuple[str, str | int], batch_id: str | None = None) -> None:
    """Send task ``name`` with ``args`` (ids only).

    On Duet's Redis transport the message is pushed by :mod:`workers.publish` (the same
    message, without ``send_task``'s ~0.3 ms of CPU). Otherwise the arguments' repr for
    Flower is written here (ids are short: it is what Celery's ``saferepr`` would make,
    without its ~20 us), and :data:`app.SEND_OPTIONS` applies. Headers: :func:`_headers`.
    """
    headers = _headers(batch_id)
    if direct_push():
        publish.push(app, name, args, headers)
        return
    priority = publish.priority(name)
    if priority:  # a draft under depth-first scheduling (kombu's own priority lists)
        options = {
            **SEND_OPTIONS,
            "priority": priority,
            **({"headers": headers} if headers else {}),
        }
        app.send_task(name, args=args, argsrepr=repr(args), kwargsrepr="{}", **options)
    elif headers:
        options = {**SEND_OPTIONS, "headers": headers}
        app.send_task(name, args=args, argsrepr=repr(args), kwargsrepr="{}", **options)
    else:
        app.send_task(name, args=args, argsrepr=repr(args), kwargsrepr="{}", **SEND_OPTIONS)


def send_later(name: str, args: tuple[str, ...], countdown: float) -> None:
    """Send task ``name`` with ``args`` (ids only) to run in ``countdown`` seconds."""
    app.send_task(
        name,
        args=args,
        argsrepr=repr(args),
        kwargsrepr="{}",
        countdown=max(0.0, countdown),
        **SEND_OPTIONS,
    )


def coordinator_send(run_id: str, seq: int) -> None:
    """Hand the run to the coordinator for transition ``seq``."""
    send(TASK_COORDINATE, (run_id, seq))


def dispatch(step: Dispatch) -> None:
    """Enqueue a step the coordinator decided on (unless its transition pushed it).

    Nothing is written after the send: the step's begin script notes that it arrived
    (``dispatched``), which is what a redelivered coordinator message checks.
    """
    if not step.sent:
        send(step.task, (step.run_id, step.step_key), step.batch_id)


#: Message header counting a step's failed provider attempts. Waiting for a rate limit
#: or for budget room re-schedules the step too, but is not a failure.
FAILURES_HEADER = "duet_failures"
#: Message header with the step claim a re-scheduled delivery held: its retry takes it over.
CLAIM_HEADER = "duet_claim"
#: Message header counting a task's retries after Redis or broker errors in a row.
INFRA_HEADER = "duet_infra"
#: Message header with the seconds a step has waited for rate limits so far.
WAITED_HEADER = "duet_waited"
#: Message header with the rate slot a re-scheduled step booked: ``[limit name, permit]``.
PERMIT_HEADER = "duet_permit"
#: Errors of the broker and of Redis that mean "not now": the task is retried, not dropped.
INFRA_ERRORS: tuple[type[BaseException], ...] = (
    *REDIS_INFRA_ERRORS,
    kombu.exceptions.OperationalError,
)
PUBLISH_RETRY = {
    "max_retries": 40,
    "interval_start": 0.2,
    "interval_step": 0.5,
    "interval_max": 2.0,
}


class StepRetry(Exception):
    """A step re-scheduled; the message says why, scrubbed of secrets (Flower shows it)."""


class StepWait(StepRetry, Waiting):
    """A step re-scheduled to wait (a rate limit, budget room, a busy step), not after a
    failure: its RETRY shows what it waits for, without a traceback."""


def failures_of(task: Any) -> int:
    """The step's failed provider attempts so far (carried in a message header)."""
    return int((task.request.headers or {}).get(FAILURES_HEADER, 0))


def waited_of(task: Any) -> float:
    """The step's seconds of rate-limit waits so far (carried in a message header)."""
    return float((task.request.headers or {}).get(WAITED_HEADER) or 0.0)


def permit_of(task: Any) -> tuple[str, str] | None:
    """The rate slot the delivery that re-scheduled this one booked for it, or None."""
    value = (task.request.headers or {}).get(PERMIT_HEADER)
    if isinstance(value, list | tuple) and len(value) == 2:
        return str(value[0]), str(value[1])
    return None


def claim_of(task: Any) -> str:
    """The step claim the delivery that re-scheduled this one held ('' for none)."""
    return str((task.request.headers or {}).get(CLAIM_HEADER) or "")


def retry(task: Any, countdown: float, exc: Exception, headers: dict[str, Any]) -> Exception:
    """``task.retry`` (same task id, a new message in ``countdown`` s), or — when even
    that cannot be published — the message given back to the broker, never acked away.

    Returns the exception to raise (``raise retry(...)``).
    """
    # The retry's headers replace the message's: keep the others (batch id, trace).
    merged = {**(task.request.headers or {}), **headers}
    merged = {k: v for k, v in merged.items() if v is not None}

    def publish() -> Exception:
        try:
            return task.retry(  # type: ignore[no-any-return]
                countdown=countdown,
                exc=exc,
                max_retries=None,
                headers=merged,
                retry_policy=PUBLISH_RETRY,
            )
        except Retry as signal:
            return signal
        except Reject as failed:
            # Celery turns a failed publish into Reject(requeue=False): the message would
            # be acked away. A full Redis refuses at once (kombu retries lost connections
            # only). Either way: try again, then give the message back.
            if isinstance(failed.reason, INFRA_ERRORS):
                raise failed.reason from None
            raise

    try:
        return IN_PLACE.retrying(INFRA_ERRORS, PUBLISH_PATIENCE_S, lambda *_: None)(publish)
    except INFRA_ERRORS as error:
        log.warning("could not re-schedule %s (%s); giving its message back", task.name, error)
        return Reject(f"broker unavailable: {type(error).__name__}", requeue=True)


def infra_retry(task: Any, error: BaseException, claim: str | None = None) -> Exception:
    """The retry of a task that met a Redis or broker error (:data:`~orchestration.backoff.INFRA`),
    not counted as a failed attempt; a step hands its claim on."""
    attempt = int((task.request.headers or {}).get(INFRA_HEADER, 0))
    wait = INFRA.delay(attempt)
    if isinstance(error, redis.exceptions.OutOfMemoryError):
        yield_cache()
    log.warning(
        "%s %s: %s: %s; retry in %.1fs",
        task.name,
        task.request.id,
        type(error).__name__,
        str(error)[:200],
        wait,
    )
    headers: dict[str, Any] = {INFRA_HEADER: attempt + 1}
    if claim is not None:
        headers[CLAIM_HEADER] = claim
    return retry(task, wait, StepRetry(f"{type(error).__name__}: retrying"), headers)


def follow(task: Any, outcome: StepOutcome | Handover | RetryLater | None) -> None:
    """Do what the step service answered: hand the run to its coordinator, or re-schedule
    the step (``task.retry`` keeps the task id, so the retry holds the same step claim)."""
    if isinstance(outcome, Handover):
        if not outcome.sent:  # else it went with the step's store
            coordinator_send(outcome.run_id, outcome.seq)
    elif isinstance(outcome, RetryLater):
        headers = {
            FAILURES_HEADER: outcome.failures,
            CLAIM_HEADER: outcome.claim,
            INFRA_HEADER: None,
            WAITED_HEADER: round(outcome.waited, 3) or None,
            PERMIT_HEADER: list(outcome.permit) if outcome.permit else None,
        }
        why = StepRetry if outcome.failed else StepWait
        raise retry(task, outcome.delay_s, why(outcome.reason or "waiting"), headers)


@worker_ready.connect(weak=False)
def _say_alive(**_: object) -> None:
    """Every worker process renews its liveness key from its start (coordinator-only ones
    too: the fleet's unbroken signs of life are what let a dead process's claims go)."""
    try:
        get_liveness().start()
    except INFRA_ERRORS as exc:  # Redis away: the first step says it
        log.warning("liveness key not written at start: %s: %s", type(exc).__name__, exc)
    publish_tools()


def publish_tools() -> None:
    """Say which tools this worker knows (a submit naming another is refused): at start,
    and again when Redis comes back as a new server (which may have lost them)."""
    from workers.tools import runner

    try:
        get_tools()  # loads the toolsets (and publishes them the first time)
        runner.publish(get_store().r)
    except INFRA_ERRORS as exc:
        log.warning("tools not published: %s: %s", type(exc).__name__, exc)
