"""What a step task does: take the step, call the model once, store the result.

A step whose result is already stored is not run again (a redelivered message); a step
another delivery is working on is left to it. Transient provider failures re-schedule
the task with a countdown (``task.retry`` keeps the task id, so the retry holds the same
step claim and repeats nothing already done), so no worker thread sleeps through a
backoff. A permanent failure, or a transient one out of attempts, interrupts the agent
with reason ``provider_error:<kind>`` and the scrubbed message as the run's error.

Before the call the fleet-wide rate limit is checked and the call's worst case is reserved
in every budget scope of the run; after it the real usage is settled (a failed call
releases its hold). Waiting for a rate limit or for budget room re-schedules the step
too, but does not count as a failed attempt; a budget with no room left interrupts the
agent with reason ``budget:<scope kind>:<unit>``.

Per call: one script to take the step (it also reads the model's fleet-wide pause and,
for persistent subagents, the conversation history, and notes that the step arrived),
the rate-limit grant (models with fleet rate limits only), the reservation (budgeted runs
only), the model call, one round trip storing the result with the settlement (budgeted
runs) and the conversation turn (persistent only), one message to the coordinator.
Specs, prices and adapters are resolved once per process.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from typing import Any

from orchestration.core import events as ev
from orchestration.core.agents import AgentSpec, Price
from orchestration.core.budget import Amount, Refusal
from orchestration.core.critique import read_critique
from orchestration.core.errors import ProviderError
from orchestration.core.loop import ROLE_OF, interruption, parse_step_key, step_index
from orchestration.core.memory import turn_step
from orchestration.core.pricing import cost_usd
from orchestration.core.structured import read_structured, structured_critique
from orchestration.prices import price_for
from orchestration.settings import get_settings
from orchestration.state import keys
from orchestration.state.conversations import (
    keeps,
    messages_from,
    turn_json,
)
from orchestration.state.runs import RunStore, ScriptCall, event_json
from workers import metrics, tracing
from workers.budgeting import estimate
from workers.budgeting import step_id as budget_step_id
from workers.providers import Completion, provider_for
from workers.runtime import coordinator_send, get_budgets, get_store
from workers.secrets import redact

log = logging.getLogger(__name__)

#: Message header counting a step's failed provider attempts. Waiting for a rate limit
#: or for budget room re-schedules the step too, but is not a failure.
FAILURES_HEADER = "duet_failures"


@dataclass(frozen=True, slots=True)
class Seat:
    """One role of one loop spec, resolved once per process."""

    agent: AgentSpec
    #: USD per million tokens; None when unknown (the step then records 0 USD).
    price: Price | None
    #: Turns of persistent conversation kept; 0 when each call is just its prompt.
    turns: int
    #: About how many tokens of earlier runs' history a call carries.
    max_tokens: int
    #: Whether the model is asked for the critique's shape natively (critics only).
    structured: bool = False


_seats: dict[tuple[str, str], Seat] = {}


def seat_for(store: RunStore, spec_id: str, role: str) -> Seat:
    """The cached :class:`Seat` of ``role`` in spec ``spec_id`` (specs never change)."""
    seat = _seats.get((spec_id, role))
    if seat is None:
        spec = store.load_spec(spec_id)
        agent = spec.actor if role == "actor" else spec.critic
        turns = spec.conversation_turns if spec.persistent_subagents else 0
        structured = role == "critic" and structured_critique(agent)
        seat = _seats[(spec_id, role)] = Seat(
            agent, price_for(agent), max(turns, 0), spec.conversation_max_tokens, structured
        )
    return seat


def backoff_s(attempt: int, retry_after: float | None) -> float:
    """Exponential backoff with full jitter; a provider's Retry-After is honoured as a floor."""
    settings = get_settings()
    wait = random.uniform(0, min(settings.retry_max_s, settings.retry_base_s * 2**attempt))
    if retry_after is not None:
        wait = max(wait, retry_after)
    return wait


def _result_from(
    completion: Completion, phase: str, key: str, seat: Seat, *, batch: bool = False, **extra: Any
) -> dict:
    result: dict[str, Any] = {
        "key": key,
        "text": completion.text,
        "input_tokens": completion.input_tokens,
        "output_tokens": completion.output_tokens,
        "cached_input_tokens": completion.cached_input_tokens,
        "cache_write_tokens": completion.cache_write_tokens,
        "usd": (
            cost_usd(
                seat.price,
                completion.input_tokens,
                completion.output_tokens,
                completion.cached_input_tokens,
                completion.cache_write_tokens,
                batch=batch,
            )
            if seat.price is not None
            else 0.0
        ),
        "calls": 1,
        "stop_reason": completion.stop_reason,
        **extra,
    }
    complete = False
    if phase == "critique":
        native = read_structured(completion.structured)
        critique, complete = native if native is not None else read_critique(completion.text)
        result.update(
            score=critique.score,
            issues=critique.issues,
            summary=critique.summary,
            # read from the vendor's structured output, not searched for in the text
            structured=native is not None,
        )
    result["interrupted"] = interruption(phase, completion.stop_reason, complete)
    return result


def _completed_event(run_id: str, phase: str, round_: int, result: dict) -> str:
    if result.get("error") is not None and result.get("text") is None:
        return event_json(
            ev.STEP_FAILED,
            run_id,
            round_,
            phase=phase,
            reason=result["interrupted"],
            error=result["error"],
        )
    data: dict[str, Any] = {
        "output_tokens": result["output_tokens"],
        "interrupted": result["interrupted"],
    }
    if phase == "critique":
        data.update(score=result["score"], issues=result["issues"], summary=result["summary"])
        return event_json(ev.CRITIQUE, run_id, round_, **data)
    return event_json(ev.ACTOR_COMPLETED, run_id, round_, phase=ev.ACTOR_PHASE[phase], **data)


@dataclass(frozen=True, slots=True)
class Parking:
    """A step of a ``vendor_batch`` agent, taken and ready to be parked (no call made)."""

    run_id: str
    key: str
    seat: Seat
    spec_id: str
    messages: list[Any]
    prompt: str
    conv_key: str
    scopes: list[str]
    claimant: str
    batch_id: str | None


def run_step(task: Any, run_id: str, key: str) -> Parking | None:
    """Body of the generate / critique / refine tasks. A step of a ``vendor_batch`` agent
    makes no call: it is returned, to be parked (see :mod:`workers.vendor_batches`)."""
    store = get_store()
    settings = get_settings()
    phase, round_ = parse_step_key(key)
    started = (
        event_json(ev.CRITIC_STARTED, run_id, round_)
        if phase == "critique"
        else event_json(ev.ACTOR_STARTED, run_id, round_, phase=ev.ACTOR_PHASE[phase])
    )
    claimant = task.request.id or f"local-{run_id}-{key}"
    start = store.begin_step(run_id, key, claimant, settings.step_lease_s, started)
    if start.outcome in ("busy", "gone", "stop"):
        return None
    handover = step_index(phase, round_) + 1
    if start.outcome in ("done", "cancelled"):
        coordinator_send(run_id, handover)
        return None
    assert start.input is not None and start.spec_id is not None
    role = ROLE_OF[phase]
    seat = seat_for(store, start.spec_id, role)
    prompt: str = start.input["prompt"]
    messages: list[Any] = [{"role": "user", "content": prompt}]
    conv_key = (start.input.get("conv") or "") if seat.turns else ""
    if conv_key and start.history is not None:
        # The history the begin script read, bounded by tokens: earlier runs' oldest
        # turns go first, this run's own stay.
        messages[:0] = messages_from(start.history, max_tokens=seat.max_tokens, run_id=run_id)
    if seat.agent.execution == "vendor_batch":
        batch_id = store.r.hget(keys.run(run_id), "batch_id") or None
        return Parking(run_id, key, seat, start.spec_id, messages, prompt, conv_key,
                       list(start.scopes), claimant, batch_id)  # fmt: skip
    result, completion, settle = _call(
        task, run_id, key, seat, messages, list(start.scopes), start.paused_s
    )
    conversation = None
    # A reply cut at max_tokens is not a turn the model should build on later.
    whole = completion is not None and completion.stop_reason != "max_tokens"
    if completion is not None and whole and conv_key and keeps(seat.turns, completion.text):
        turn = turn_json(turn_step(run_id, key), prompt, completion.text)
        conversation = (conv_key, turn, seat.turns)
    # The settlement, the result and the conversation turn: one round trip.
    store.complete_step(
        run_id, key, result, _completed_event(run_id, phase, round_, result), claimant,
        conversation=conversation, conversation_max_tokens=seat.max_tokens, before=settle,
    )  # fmt: skip
    coordinator_send(run_id, handover)
    return None


# --- vendor batch execution (the rest is in workers/vendor_batches.py) --------------
def reserve_parked(task: Any, parking: Parking, hold_s: float) -> dict[str, Any] | None:
    """Reserve a parked step's worst case for as long as a vendor batch may take; the
    request to park, or None when the budget has no room (the step then ends with the
    budget interruption and the run goes back to its coordinator). Room held by calls in
    flight re-schedules the step, as for a synchronous call."""
    agent, run_id, key = parking.seat.agent, parking.run_id, parking.key
    began = time.time()
    refusal = get_budgets().reserve(
        budget_step_id(run_id, key), parking.scopes, estimate(agent, parking.messages), hold_s
    )
    if refusal is not None:
        if not refusal.exhausted:
            raise _wait(task, backoff_s(min(task.request.retries or 0, 6), None),
                        failed_attempts(task))  # fmt: skip
        phase, round_ = parse_step_key(key)
        result = _failure(key, refusal.reason, _refused(refusal), began, calls=0)
        get_store().complete_step(run_id, key, result,
                                  _completed_event(run_id, phase, round_, result), parking.claimant)  # fmt: skip
        coordinator_send(run_id, step_index(phase, round_) + 1)
        return None
    return {
        "spec_id": parking.spec_id, "role": ROLE_OF[parse_step_key(key)[0]],
        "messages": parking.messages, "prompt": parking.prompt, "conv": parking.conv_key,
        "structured": parking.seat.structured, "scopes": parking.scopes,
        "claimant": parking.claimant, "batch_id": parking.batch_id, "parked_at": began,
        "attempts": 0,
    }  # fmt: skip


def agent_of(request: dict[str, Any]) -> AgentSpec:
    """The agent of a parked request."""
    return seat_for(get_store(), request["spec_id"], request["role"]).agent


def release_parked(run_id: str, key: str, request: dict[str, Any]) -> None:
    """A parked step that will never be sent (its run was cancelled): release its hold and
    hand the run to its coordinator, which finishes it."""
    get_budgets().release(budget_step_id(run_id, key), request["scopes"])
    phase, round_ = parse_step_key(key)
    coordinator_send(run_id, step_index(phase, round_) + 1)


def store_batch_outcome(
    run_id: str, key: str, request: dict[str, Any], outcome: Completion | ProviderError,
    *, vendor_batch: str | None,
) -> None:  # fmt: skip
    """Store a parked step's result from its vendor batch (priced at the batch rate; the
    budget settled once) and hand the run to its coordinator."""
    store = get_store()
    budgets = get_budgets()
    seat = seat_for(store, request["spec_id"], request["role"])
    phase, round_ = parse_step_key(key)
    sid, scopes = budget_step_id(run_id, key), list(request["scopes"])
    began = float(request.get("parked_at") or time.time())
    conversation, settle = None, []
    if isinstance(outcome, ProviderError):
        budgets.release(sid, scopes)
        result = _failure(key, f"provider_error:{outcome.kind}", redact(str(outcome)), began)
        result["vendor_batch"] = vendor_batch
        if metrics.ENABLED:
            metrics.call_failed(seat.agent, phase, outcome.kind, retried=False)
    else:
        result = _result_from(outcome, phase, key, seat, batch=True, started_at=began,
                              finished_at=time.time(), model=seat.agent.model,
                              vendor_batch=vendor_batch)  # fmt: skip
        used = Amount(input_tokens=outcome.input_tokens, output_tokens=outcome.output_tokens,
                      usd=result["usd"], calls=1)  # fmt: skip
        settle = budgets.settle_calls(sid, scopes, used)
        if metrics.ENABLED:  # latency: from parking to the batch's result
            metrics.call_answered(seat.agent, phase, result)
        conv_key = request.get("conv") or ""
        whole = outcome.stop_reason != "max_tokens"
        if whole and conv_key and keeps(seat.turns, outcome.text):
            turn = turn_json(turn_step(run_id, key), request["prompt"], outcome.text)
            conversation = (conv_key, turn, seat.turns)
    store.complete_step(
        run_id, key, result, _completed_event(run_id, phase, round_, result), request["claimant"],
        conversation=conversation, conversation_max_tokens=seat.max_tokens, before=settle,
    )  # fmt: skip
    coordinator_send(run_id, step_index(phase, round_) + 1)


def _call(
    task: Any,
    run_id: str,
    key: str,
    seat: Seat,
    messages: list[Any],
    scopes: list[str],
    paused_s: float | None = None,
) -> tuple[dict[str, Any], Completion | None, list[ScriptCall]]:
    """Call the model within the fleet's rate limits and the run's budgets.

    Returns the step's result, the completion (when the model answered) and the budget
    settlement still to run (with the result's store, in one round trip). Raises
    Celery's ``Retry`` to re-schedule the step: for a transient failure (counted against
    ``max_attempts``), a rate-limit wait or budget room held by calls in flight (not).
    ``paused_s`` is the model's fleet-wide pause as the begin script read it (None: not
    read yet).
    """
    settings, budgets = get_settings(), get_budgets()
    agent = seat.agent
    phase, round_ = parse_step_key(key)
    failures = failed_attempts(task)
    sid = budget_step_id(run_id, key)
    worst = estimate(agent, messages)
    began = time.time()
    provider = provider_for(agent)
    # Ready the HTTP client before taking a rate permit, so the permit is spent at once.
    provider.warm()
    # Fleet-wide rate limits and pauses first (a wait holds no budget), then the budget.
    wait = budgets.rate_wait(agent, worst.tokens, paused_s)
    if wait > 0:
        if metrics.ENABLED:
            metrics.step_waits(agent, "rate_limit", wait)
        raise _wait(task, wait, failures)
    refusal = budgets.reserve(sid, scopes, worst, settings.step_lease_s)
    if refusal is not None:
        if not refusal.exhausted:  # the room is held by calls in flight; it frees soon
            wait = backoff_s(min(task.request.retries or 0, 6), None)
            if metrics.ENABLED:
                metrics.step_waits(agent, "budget", wait)
            raise _wait(task, wait, failures)
        return _failure(key, refusal.reason, _refused(refusal), began, calls=0), None, []
    try:
        completion = provider.complete(agent, messages, structured=seat.structured)
        result = _result_from(
            completion, phase, key, seat, started_at=began, finished_at=time.time(),
            model=agent.model,
        )  # fmt: skip
    except ProviderError as exc:
        budgets.release(sid, scopes)
        if exc.kind == "rate_limited" and exc.retry_after:
            budgets.pause(agent, exc.retry_after)
        retried = exc.transient and failures + 1 < settings.max_attempts
        if metrics.ENABLED:
            metrics.call_failed(agent, phase, exc.kind, retried=retried)
        if tracing.ENABLED:
            tracing.call_failed(agent, phase, exc.kind, retried=retried)
        if retried:
            wait = backoff_s(failures, exc.retry_after)
            log.info("run %s step %s: %s; retry %s in %.1fs",
                     run_id, key, exc.kind, failures + 1, wait)  # fmt: skip
            retry = event_json(
                ev.STEP_RETRY, run_id, round_, phase=phase, kind=exc.kind,
                status_code=exc.status_code, attempt=failures + 1,
                max_attempts=settings.max_attempts, wait=round(wait, 3),
            )  # fmt: skip
            get_store().r.xadd(keys.run_events(run_id), {"e": retry})
            # Not chained to the vendor's error: its traceback goes out in task events.
            raise _wait(task, wait, failures + 1, exc) from None
        return _failure(key, f"provider_error:{exc.kind}", redact(str(exc)), began), None, []
    except Exception as exc:  # noqa: BLE001 - a bug must fail the run, not strand it
        log.exception("run %s step %s failed", run_id, key)
        budgets.release(sid, scopes)
        if metrics.ENABLED:
            metrics.call_failed(agent, phase, "error", retried=False)
        if tracing.ENABLED:
            tracing.call_failed(agent, phase, "error", retried=False)
        return _failure(key, "error", redact(f"{type(exc).__name__}: {exc}"), began), None, []
    if metrics.ENABLED:
        metrics.call_answered(agent, phase, result)
    if tracing.ENABLED:
        tracing.call_answered(agent, phase, result)
    used = Amount(input_tokens=completion.input_tokens, output_tokens=completion.output_tokens,
                  usd=result["usd"], calls=1)  # fmt: skip
    return result, completion, budgets.settle_calls(sid, scopes, used)


def failed_attempts(task: Any) -> int:
    """Provider attempts of this step that failed so far (carried in a message header)."""
    return int((task.request.headers or {}).get(FAILURES_HEADER, 0))


def _wait(task: Any, seconds: float, failures: int, exc: Exception | None = None) -> Exception:
    """Re-schedule the step in ``seconds`` (no thread waits); the same task id keeps its claim.

    The worker holds a waiting message unacknowledged, so a wait is kept well inside the
    broker's visibility timeout; a longer pause (a vendor's Retry-After) is still obeyed,
    as the fleet-wide pause makes the step wait again when it comes back.
    """
    seconds = min(seconds, get_settings().visibility_timeout_s / 2)
    # The retry's headers replace the message's: keep the others (batch id, trace).
    headers = {**(task.request.headers or {}), FAILURES_HEADER: failures}
    return task.retry(countdown=seconds, exc=exc, max_retries=None, headers=headers)


def _refused(refusal: Refusal) -> str:
    return (
        f"budget {refusal.scope}: no room for this call's {refusal.unit} "
        f"(limit {refusal.limit:g}, spent {refusal.spent:g}, this call up to {refusal.requested:g})"
    )


def _failure(
    key: str, reason: str, message: str, began: float, *, calls: int = 1
) -> dict[str, Any]:
    return {
        "key": key,
        "text": None,
        "input_tokens": 0,
        "output_tokens": 0,
        "usd": 0.0,
        "calls": calls,
        "interrupted": reason,
        "error": message,
        "started_at": began,
        "finished_at": time.time(),
    }
