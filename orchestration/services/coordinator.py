"""What the coordinator task does, apart from Celery: advance a run by one transition.

Load the run, ask :func:`loop.decide` what happens next, record that (one atomic
script), and say which step to enqueue. Recording is a compare-and-set on the run's
transition counter, so a redelivered coordinator message changes nothing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from orchestration.core import events as ev
from orchestration.core.architecture import LoopSpec
from orchestration.core.budget import role_scopes
from orchestration.core.loop import (
    REDIS_FULL,
    ROLE_OF,
    Finish,
    LoopState,
    StepOutcome,
    decide,
    parse_step_key,
    starts_round,
    step_key,
)
from orchestration.core.memory import conversation_scope
from orchestration.core.results import FINISHED_STATUSES, retried_usage, run_usage
from orchestration.core.templates import render_critique_prompt, render_refine_prompt
from orchestration.services.budgeting import rate_name
from orchestration.services.runcaching import ResultKeeper
from orchestration.services.storing import store_or_fail
from orchestration.state import keys
from orchestration.state.events import event_json
from orchestration.state.gates import BatchGate, limit_of
from orchestration.state.keys import TASK_BY_PHASE
from orchestration.state.runs import Once, Outgoing, RunStore

log = logging.getLogger(__name__)

#: How a run ends that ``resume`` may start again (``--interrupted`` for the second).
RESUMABLE = ("cancelled", "interrupted")

#: (scopes) -> (blocked reason or None, warning events); set when budgets are wired in.
#: Warnings are :class:`Once` events: the transition that records them sets their flag.
BudgetCheck = Callable[[Mapping[str, str], list[str]], tuple[str | None, list[Once]]]


class RunObserver(Protocol):
    """Told of each run's start and end, once each (metrics, traces); set by the worker."""

    def run_started(self, run: Mapping[str, str]) -> None: ...

    def run_finished(self, run: Mapping[str, str], status: str, reason: str | None) -> None: ...


@dataclass(frozen=True, slots=True)
class Dispatch:
    """A step task to enqueue: ``task`` with ``(run_id, step_key)``."""

    task: str
    run_id: str
    step_key: str
    #: The transition that made this step (for marking it dispatched).
    seq: int
    #: The run's batch, if any (carried in the message's headers for logs).
    batch_id: str | None = None
    #: The message went with the transition (nothing is left to send).
    sent: bool = False


#: Send run ``run_id`` its transition ``seq`` (a run handed a place under its batch's
#: ``max_in_flight``); set by the worker.
SendTransition = Callable[[str, int], None]

#: A step to enqueue -> its message, to push with the transition that makes the step;
#: None: the worker sends it after (``workers.runtime``).
DispatchMessage = Callable[[Dispatch], Outgoing | None]


def outcomes(steps: Mapping[str, Mapping[str, Any]]) -> tuple[StepOutcome, ...]:
    """Stored step results as the loop sees them, in run order."""
    found = []
    for key, step in steps.items():
        phase, round_ = parse_step_key(key)
        found.append(
            StepOutcome(phase, round_, interrupted=step.get("interrupted"), score=step.get("score"))
        )
    order = {"generate": 0, "critique": 1, "refine": 2}
    return tuple(sorted(found, key=lambda o: (o.round, order[o.phase])))


def _key_at(index: int) -> str:
    """The key of the ``index``-th step of a run (inverse of :func:`loop.step_index`)."""
    if index == 0:
        return step_key("generate", 0)
    return step_key("critique" if index % 2 else "refine", (index + 1) // 2)


def _steps_before(seq: int) -> tuple[str, ...]:
    """The keys of the (up to) two steps before transition ``seq``."""
    return tuple(_key_at(i) for i in (seq - 1, seq - 2) if i >= 0)


def _reads_for(spec: LoopSpec, role: str, run: Mapping[str, str]) -> dict[str, Any]:
    """What the step's begin script reads for it: the pause key of its model, the budget
    hashes of the run's scopes its role is charged to (for their limits) and, with persistent subagents, its
    conversation and the turns kept: the team's, the role's worker's and the user's as the
    spec's memory says (a list, ``conv``) — or, when the conversation is the run's own
    (scope ``run:<id>``), the run's earlier steps of the role themselves (``own``): their
    inputs and results already hold every turn, so no list copies them."""
    agent = spec.actor if role == "actor" else spec.critic
    reads: dict[str, Any] = {"pause": keys.rate_pause(rate_name(agent))}
    scopes = [s for s in run.get("budget_scopes", "").split(",") if s]
    if scopes:  # whether any has a limit (a call in scopes without one holds nothing);
        # the other role's own scope is not the step's
        reads["budgets"] = [keys.budget(s) for s in role_scopes(scopes, role)]
    turns = spec.conversation_turns if spec.persistent_subagents else 0
    if turns > 0:
        scope = conversation_scope(
            spec.memory,
            run_id=run["run_id"],
            user_id=run.get("user_id") or None,
            batch_id=run.get("batch_id") or None,
        )
        if scope.startswith("run:"):
            reads.update(own=1, turns=turns)
        else:
            conv = keys.conversation(spec.team_id, spec.worker_ids[role], scope)
            reads.update(conv=conv, turns=turns)
    return reads


class Coordinator:
    """Advances runs. One per process; holds only the store (and its spec cache)."""

    def __init__(
        self,
        store: RunStore,
        budget_check: BudgetCheck | None = None,
        observers: tuple[RunObserver, ...] = (),
        dispatch_message: DispatchMessage | None = None,
        send_transition: SendTransition | None = None,
        results: ResultKeeper | None = None,
        give_room: Callable[[], int] | None = None,
    ) -> None:
        self.store = store
        #: Makes room in a full Redis (the model-call cache's eviction), before a step's
        #: input Redis refused for memory is judged too big to store.
        self.give_room = give_room
        #: Keeps the results of runs that finished well for ``submit_batch`` to serve.
        self.results = results
        self.dispatch_message = dispatch_message
        self.send_transition = send_transition
        self.gate = BatchGate(store.r)
        self.budget_check = budget_check
        self.observers = observers

    def advance(self, run_id: str, seq: int) -> Dispatch | None:
        """Make transition ``seq`` of ``run_id``; the step to enqueue, if any."""
        # Every step's outcome, but the text of only the last two steps: the one that
        # just finished and the one before it hold the current output and the critique.
        view = self.store.load_for_transition(run_id, _steps_before(seq))
        run, steps = view.run, view.steps
        if not run:
            log.warning("coordinate: run %s not found (expired?)", run_id)
            return None
        if run.get("status") in FINISHED_STATUSES:
            # A redelivered finish: the first delivery may have died before passing on
            # the place the run gave back.
            self.pass_places(run)
            return None
        made = int(run.get("seq", 0))
        if made > seq:
            return self._redispatch(run, steps, made)
        if made < seq:
            log.warning("coordinate: run %s is at transition %s, message for %s", run_id, made, seq)
            return None
        if seq == 0 and not self._has_place(run):
            return None  # waits at its batch's gate; a finish hands it a place
        spec = self.store.load_spec(run["spec_id"])
        outs = outcomes(steps)
        if len(outs) != seq and run.get("cancelled") != "1":
            if len(outs) == seq - 1 and run.get("current_step") not in (None, "", *steps):
                return self._step_again(run, seq)
            log.warning("coordinate: run %s has %s steps at transition %s", run_id, len(outs), seq)
            return None
        events: list[str | Once] = []
        if seq == 0:
            events.append(event_json(ev.RUN_STARTED, run_id))
        state = LoopState(
            max_rounds=spec.max_rounds,
            approval_threshold=spec.approval_threshold,
            steps=outs,
            cancelled=run.get("cancelled") == "1",
            min_improvement=spec.min_improvement,
        )
        scopes = [s for s in run.get("budget_scopes", "").split(",") if s]
        if self.budget_check is not None and scopes and starts_round(state):
            blocked, warnings = self.budget_check(run, scopes)
            events.extend(warnings)
            if blocked:
                state = replace(state, budget_blocked=blocked)
        action = decide(state)
        if isinstance(action, Finish):
            self._finish(run, steps, outs, seq, action, events)
            return None
        current = self._current_output(run_id, steps, outs)
        if action.phase == "generate":
            prompt = run["prompt"]
        elif action.phase == "critique":
            # Runs queued before boundaries existed use their id as the token.
            boundary = run.get("boundary") or run["run_id"]
            prompt = render_critique_prompt(
                spec.critique_template, prompt=run["prompt"], output=current, boundary=boundary
            )
        else:
            critique = self._full(run_id, steps, step_key("critique", action.round))
            prompt = render_refine_prompt(
                spec.refine_template,
                prompt=run["prompt"],
                output=current,
                critique=critique.get("summary") or "",
                issues=critique.get("issues") or [],
            )
        key = step_key(action.phase, action.round)
        step_input = {"phase": action.phase, "round": action.round, "prompt": prompt}
        if action.phase == "critique":
            step_input["boundary"] = boundary  # the step reads the reply's quotes by it
        elif (spec.actor if ROLE_OF[action.phase] == "actor" else spec.critic).tool_specs:
            # Tool results are fenced between the run's markers, the actor's too.
            step_input["boundary"] = run.get("boundary") or run["run_id"]
        step_input.update(_reads_for(spec, ROLE_OF[action.phase], run))
        noted = {k: steps[k] for k in view.unnoted}  # the record notes their outcomes now
        dispatch = Dispatch(TASK_BY_PHASE[action.phase], run_id, key, seq + 1, run.get("batch_id"))
        send = self.dispatch_message(dispatch) if self.dispatch_message else None
        # A step's input Redis can never hold (OOM, bigger than its room): the run ends
        # `failed` naming Redis's memory, instead of the transition retried for ever.
        failing = Finish("failed", f"{ROLE_OF[action.phase]}:round_{action.round}:{REDIS_FULL}")
        stored, recorded = store_or_fail(
            lambda: self.store.record_step(run, seq, key, step_input, events, noted, send),
            lambda why: self._finish(run, steps, outs, seq, failing, list(events), error=why),
            len(json.dumps(step_input)),
            "this step's input",
            f"run {run_id} transition {seq}",
            self.store.r,
            self.give_room,
            patience_s=0,  # the task retries an outage, with its backoff
        )
        if not stored or recorded != 1:
            return None  # failed, or another coordinator made this transition first
        if seq == 0:
            for observer in self.observers:
                observer.run_started(run)
        return replace(dispatch, sent=True) if send is not None else dispatch

    def _has_place(self, run: Mapping[str, str]) -> bool:
        """Whether the run may start: its batch has no ``max_in_flight``, or it holds
        one of the places (taken now if one is free; else it waits in the queue)."""
        limit = limit_of(run)
        if not limit or not run.get("batch_id"):
            return True
        return self.gate.enter(run["batch_id"], run["run_id"], limit)

    def pass_places(self, run: Mapping[str, str]) -> None:
        """Hand the places free in the finished run's batch to the runs waiting for one,
        and send each its next transition (its first, unless ``resume`` re-opened it)."""
        limit = limit_of(run)
        if not limit or not run.get("batch_id") or self.send_transition is None:
            return
        handed = self.gate.pass_on(run["batch_id"], limit)
        for waiting, seq in zip(handed, self.store.seqs(handed), strict=True):
            self.send_transition(waiting, seq)

    def _full(self, run_id: str, steps: dict[str, dict[str, Any]], key: str) -> Mapping[str, Any]:
        """The whole stored result of ``key`` (read now if only its outcome was loaded)."""
        step = steps[key]
        if "key" not in step:  # an outcome only: the full result has its own key
            loaded = self.store.step_result(run_id, key)
            if loaded is not None:
                step = steps[key] = loaded
        return step

    def _current_output(
        self, run_id: str, steps: dict[str, dict[str, Any]], outs: tuple[StepOutcome, ...]
    ) -> str:
        for out in reversed(outs):
            if out.role == "actor" and not out.interrupted:
                return str(self._full(run_id, steps, step_key(out.phase, out.round))["text"])
        return ""

    def _redispatch(
        self, run: Mapping[str, str], steps: Mapping[str, Any], made: int
    ) -> Dispatch | None:
        """A transition made but never handed to the broker (a crash in between): send it.

        A step that reached a worker is marked ``dispatched`` by its begin script, and a
        stored one has an outcome: both are left alone. A step still waiting in the
        queue is sent again; the copy is harmless (the step claim and the stored result
        make a second delivery a no-op).
        """
        current = run.get("current_step")
        if not current or int(run.get("dispatched", -1)) >= made or current in steps:
            return None
        return self._step_again(run, made)

    def _step_again(self, run: Mapping[str, str], made: int) -> Dispatch:
        """The run's current step, unstored, sent again: a run ``resume`` re-opened
        mid-step waited for a place and was handed one (a copy still queued is harmless:
        the step claim and the stored result make a second delivery a no-op)."""
        current = run["current_step"]
        phase, _ = parse_step_key(current)
        return Dispatch(TASK_BY_PHASE[phase], run["run_id"], current, made, run.get("batch_id"))

    def _finish(
        self,
        run: Mapping[str, str],
        steps: dict[str, dict[str, Any]],
        outs: tuple[StepOutcome, ...],
        seq: int,
        action: Finish,
        events: list[str | Once],
        error: str | None = None,
    ) -> None:
        """End the run as ``action`` says; ``error``: why, when no step says it."""
        run_id = run["run_id"]
        last_round = outs[-1].round if outs else 0
        score = next((o.score for o in reversed(outs) if o.score is not None), None)
        if action.status == "approved":
            events.append(event_json(ev.APPROVED, run_id, last_round, score=score))
        elif action.status == "max_rounds_reached":
            events.append(event_json(ev.MAX_ROUNDS_REACHED, run_id, last_round, score=score))
        if error is None and outs and action.status in ("interrupted", "failed"):
            last = self._full(run_id, steps, step_key(outs[-1].phase, outs[-1].round))
            error = last.get("error")
        events.append(
            event_json(
                ev.RUN_FINISHED,
                run_id,
                last_round,
                status=action.status,
                reason=action.reason,
                score=score,
            )
        )
        made = self.store.record_finish(
            run,
            seq,
            action.status,
            reason=action.reason,
            error=error,
            usage=run_usage(steps, retried_usage(run)),
            events=events,
            # A cancelled or interrupted run may be resumed: it keeps its steps' inputs
            # and outcomes.
            outcomes=() if action.status in RESUMABLE else tuple(steps),
        )
        if made == 1:
            for observer in self.observers:
                if seq == 0:
                    observer.run_started(run)
                observer.run_finished(run, action.status, action.reason)
            self.pass_places(run)
            if self.results is not None:
                self.results.finished(self.store, run, action.status)


__all__ = [
    "Coordinator",
    "Dispatch",
    "DispatchMessage",
    "RunObserver",
    "SendTransition",
    "outcomes",
]
