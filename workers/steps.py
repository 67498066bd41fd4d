"""What a step task does: take the step, call the model once, store the result.

A step whose result is already stored is not run again (a redelivered message); a step
another delivery is working on is left to it. Transient provider failures re-schedule
the task with a countdown, so no worker thread sleeps through a backoff.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any

from orchestration import events as ev
from orchestration.critique import parse_critique
from orchestration.errors import ProviderError
from orchestration.loop import ROLE_OF, parse_step_key, step_index
from orchestration.settings import get_settings
from orchestration.store import event_json

from .providers import Completion, provider_for
from .runtime import coordinator_send, get_store

log = logging.getLogger(__name__)


def backoff_s(attempt: int, retry_after: float | None) -> float:
    """Exponential backoff with full jitter; a provider's Retry-After is honoured as a floor."""
    settings = get_settings()
    wait = random.uniform(0, min(settings.retry_max_s, settings.retry_base_s * 2**attempt))
    if retry_after is not None:
        wait = max(wait, retry_after)
    return wait


def _result_from(completion: Completion, phase: str, round_: int, key: str, **extra: Any) -> dict:
    result: dict[str, Any] = {
        "key": key,
        "text": completion.text,
        "input_tokens": completion.input_tokens,
        "output_tokens": completion.output_tokens,
        "cached_input_tokens": completion.cached_input_tokens,
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
        return event_json(ev.STEP_FAILED, run_id, round_, phase=phase,
                          reason=result["interrupted"], error=result["error"])
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
    spec = store.load_spec(start.spec_id)
    agent = spec.actor if ROLE_OF[phase] == "actor" else spec.critic
    messages = [{"role": "user", "content": start.input["prompt"]}]
    began = time.time()
    try:
        completion = provider_for(agent).complete(agent, messages)  # type: ignore[arg-type]
        result = _result_from(completion, phase, round_, key, started_at=began,
                              finished_at=time.time(), model=agent.model)
    except ProviderError as exc:
        attempt = task.request.retries or 0
        if exc.transient and attempt + 1 < settings.max_attempts:
            wait = backoff_s(attempt, exc.retry_after)
            log.info("run %s step %s: %s; retry %s in %.1fs", run_id, key, exc.kind, attempt + 1, wait)
            raise task.retry(countdown=wait, exc=exc, max_retries=settings.max_attempts) from exc
        result = _failure(key, f"provider_error:{exc.kind}", str(exc), began)
    except Exception as exc:  # noqa: BLE001 - a bug must fail the run, not strand it
        log.exception("run %s step %s failed", run_id, key)
        result = _failure(key, "error", f"{type(exc).__name__}: {exc}", began)
    store.complete_step(run_id, key, result, _completed_event(run_id, phase, round_, result), claimant)
    coordinator_send(run_id, handover)


def _failure(key: str, reason: str, message: str, began: float) -> dict[str, Any]:
    return {
        "key": key,
        "text": None,
        "input_tokens": 0,
        "output_tokens": 0,
        "calls": 1,
        "interrupted": reason,
        "error": message,
        "started_at": began,
        "finished_at": time.time(),
    }
