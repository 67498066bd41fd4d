"""What a step task does: take the step, call the model once, store the result.

A step whose result is already stored is not run again (a redelivered message); a step
another delivery is working on is left to it. Transient provider failures re-schedule
the task with a countdown (``task.retry`` keeps the task id, so the retry holds the same
step claim and repeats nothing already done), so no worker thread sleeps through a
backoff. A permanent failure, or a transient one out of attempts, interrupts the agent
with reason ``provider_error:<kind>`` and the scrubbed message as the run's error.

Per call: one script to take the step, one read of the conversation history (persistent
subagents only), the model call, one script to store the result, one pipelined append of
the turn (persistent only), one message to the coordinator. Specs, prices and adapters
are resolved once per process.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from typing import Any

from orchestration import events as ev
from orchestration import keys
from orchestration.agents import AgentSpec, Price
from orchestration.conversations import ConversationStore, conversation_scope
from orchestration.critique import parse_critique
from orchestration.errors import ProviderError
from orchestration.loop import ROLE_OF, parse_step_key, step_index
from orchestration.pricing import cost_usd, price_for
from orchestration.settings import get_settings
from orchestration.store import RunStore, event_json

from .providers import Completion, provider_for
from .providers.errors import scrub
from .runtime import coordinator_send, get_store

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Seat:
    """One role of one loop spec, resolved once per process."""

    agent: AgentSpec
    #: USD per million tokens; None when unknown (the step then records 0 USD).
    price: Price | None
    #: Turns of persistent conversation kept; 0 when each call is just its prompt.
    turns: int


_seats: dict[tuple[str, str], Seat] = {}
_conversations: ConversationStore | None = None


def seat_for(store: RunStore, spec_id: str, role: str) -> Seat:
    """The cached :class:`Seat` of ``role`` in spec ``spec_id`` (specs never change)."""
    seat = _seats.get((spec_id, role))
    if seat is None:
        spec = store.load_spec(spec_id)
        agent = spec.actor if role == "actor" else spec.critic
        turns = spec.conversation_turns if spec.persistent_subagents else 0
        seat = _seats[(spec_id, role)] = Seat(agent, price_for(agent), max(turns, 0))
    return seat


def conversations(store: RunStore) -> ConversationStore:
    """The process's conversation store, on the same client as ``store``."""
    global _conversations
    found = _conversations
    if found is None or found.r is not store.r:
        found = _conversations = ConversationStore(store.r, ttl_s=store.finished_ttl_s)
    return found


def backoff_s(attempt: int, retry_after: float | None) -> float:
    """Exponential backoff with full jitter; a provider's Retry-After is honoured as a floor."""
    settings = get_settings()
    wait = random.uniform(0, min(settings.retry_max_s, settings.retry_base_s * 2**attempt))
    if retry_after is not None:
        wait = max(wait, retry_after)
    return wait


def _result_from(completion: Completion, phase: str, key: str, seat: Seat, **extra: Any) -> dict:
    result: dict[str, Any] = {
        "key": key,
        "text": completion.text,
        "input_tokens": completion.input_tokens,
        "output_tokens": completion.output_tokens,
        "cached_input_tokens": completion.cached_input_tokens,
        "usd": (
            cost_usd(
                seat.price,
                completion.input_tokens,
                completion.output_tokens,
                completion.cached_input_tokens,
            )
            if seat.price is not None
            else 0.0
        ),
        "calls": 1,
        "stop_reason": completion.stop_reason,
        "interrupted": "max_tokens" if completion.stop_reason == "max_tokens" else None,
        **extra,
    }
    if phase == "critique":
        critique = parse_critique(completion.text)
        result.update(score=critique.score, issues=critique.issues, summary=critique.summary)
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


def run_step(task: Any, run_id: str, key: str) -> None:
    """Body of the generate / critique / refine tasks."""
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
        return
    handover = step_index(phase, round_) + 1
    if start.outcome in ("done", "cancelled"):
        coordinator_send(run_id, handover)
        return
    assert start.input is not None and start.spec_id is not None
    role = ROLE_OF[phase]
    seat = seat_for(store, start.spec_id, role)
    prompt: str = start.input["prompt"]
    messages: list[Any] = [{"role": "user", "content": prompt}]
    if seat.turns:
        convs = conversations(store)
        scope = conversation_scope(start.user_id, run_id)
        messages[:0] = convs.history(role, scope, seat.turns)
    began = time.time()
    completion: Completion | None = None
    try:
        completion = provider_for(seat.agent).complete(seat.agent, messages)
        result = _result_from(
            completion,
            phase,
            key,
            seat,
            started_at=began,
            finished_at=time.time(),
            model=seat.agent.model,
        )
    except ProviderError as exc:
        attempt = task.request.retries or 0
        if exc.transient and attempt + 1 < settings.max_attempts:
            wait = backoff_s(attempt, exc.retry_after)
            log.info(
                "run %s step %s: %s; retry %s in %.1fs", run_id, key, exc.kind, attempt + 1, wait
            )
            retry = event_json(
                ev.STEP_RETRY,
                run_id,
                round_,
                phase=phase,
                kind=exc.kind,
                status_code=exc.status_code,
                attempt=attempt + 1,
                max_attempts=settings.max_attempts,
                wait=round(wait, 3),
            )
            store.r.xadd(keys.run_events(run_id), {"e": retry})
            raise task.retry(countdown=wait, exc=exc, max_retries=settings.max_attempts) from exc
        result = _failure(key, f"provider_error:{exc.kind}", str(exc), began)
    except Exception as exc:  # noqa: BLE001 - a bug must fail the run, not strand it
        log.exception("run %s step %s failed", run_id, key)
        result = _failure(key, "error", scrub(f"{type(exc).__name__}: {exc}"), began)
    stored = store.complete_step(
        run_id, key, result, _completed_event(run_id, phase, round_, result), claimant
    )
    if stored and completion is not None and seat.turns:
        convs.append(
            role, scope, seat.turns, step_id=f"{run_id}/{key}", prompt=prompt, reply=completion.text
        )
    coordinator_send(run_id, handover)


def _failure(key: str, reason: str, message: str, began: float) -> dict[str, Any]:
    return {
        "key": key,
        "text": None,
        "input_tokens": 0,
        "output_tokens": 0,
        "usd": 0.0,
        "calls": 1,
        "interrupted": reason,
        "error": message,
        "started_at": began,
        "finished_at": time.time(),
    }
