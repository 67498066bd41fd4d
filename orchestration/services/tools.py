"""What a tool task does, apart from Celery: run one tool call a turn asked for, at most
once for a tool with effects, store its result once, and hand the run to the next turn
when it was the turn's last call to answer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from orchestration.core import events as ev
from orchestration.core.loop import ROLE_OF, parse_step_key
from orchestration.core.tools import MAX_RESULT_CHARS, ToolSpec, Workspace, tool_error
from orchestration.state.connection import INFRA_ERRORS
from orchestration.state.events import event_json
from orchestration.state.keys import TASK_BY_PHASE
from orchestration.state.processes import alive
from orchestration.state.runs import RunStore
from orchestration.state.turns import TurnStore, parse_call_ref

log = logging.getLogger(__name__)

#: Seconds a tool task keeps trying to store a result while Redis is away.
STORE_PATIENCE_S = 120.0
#: Seconds a delivery that found a call held by a live worker waits before looking again.
HELD_CHECK_S = 2.0
#: What a model reads for a call with effects whose worker was lost mid-call.
LOST = (
    "the worker running this call was lost before it answered; {name} has effects, so it "
    "is not run again (it may or may not have had them)"
)


@dataclass(frozen=True, slots=True)
class CallInfo:
    """Where a tool call runs: the run's repository and commit (or None), the ids, the
    agent's tool options."""

    workspace: Workspace | None
    run_id: str
    call_id: str
    options: Mapping[str, Any]


#: Runs one tool: ``(spec, arguments, where) -> (result text, ok)``; never raises for the
#: tool's own failures (``workers.tools.registry.call``, ``workers.tools.mcp``).
RunTool = Callable[[ToolSpec, dict[str, Any], CallInfo], tuple[str, bool]]
#: Makes tool output safe to store (no key values); ``workers.secrets.scrub_output``.
Scrub = Callable[[str], str]


class ToolObserver(Protocol):
    """Told what each tool call did (metrics); set by the worker."""

    def tool_called(self, name: str, seconds: float, ok: bool) -> None: ...


@dataclass(frozen=True, slots=True)
class NextTurn:
    """Every call of the turn has its result: send the step task for the next turn."""

    task: str
    run_id: str
    step_key: str


@dataclass(frozen=True, slots=True)
class CheckLater:
    """Another live delivery runs this call (a tool with effects): look again later."""

    delay_s: float


ToolOutcome = NextTurn | CheckLater | None


class ToolService:
    """Runs tool calls. One per process; thread-safe."""

    def __init__(
        self,
        store: RunStore,
        run_tool: RunTool,
        scrub: Scrub,
        *,
        observers: tuple[ToolObserver, ...] = (),
        turns: TurnStore | None = None,
    ) -> None:
        self.store = store
        self.turns = turns or TurnStore(store.r)
        self.run_tool = run_tool
        self.scrub = scrub
        self.observers = observers

    def run(self, run_id: str, ref: str, claimant: str) -> ToolOutcome:
        """Run call ``ref`` of ``run_id`` for delivery ``claimant`` (unless stored before,
        or held by a live delivery); what the task does next."""
        step_key, turn_no, index = parse_call_ref(ref)
        phase, round_ = parse_step_key(step_key)
        turn = next((t for t in self.turns.turns(run_id, step_key) if t.number == turn_no), None)
        run, _ = self.store.load_run(run_id)
        if turn is None or index >= len(turn.calls) or not run:
            log.warning("tool: run %s has no call %s (expired?)", run_id, ref)
            return None
        call = turn.calls[index]
        spec_of_run = self.store.load_spec(run["spec_id"])
        agent = spec_of_run.actor if ROLE_OF[phase] == "actor" else spec_of_run.critic
        offered = agent.tool_specs + (self.turns.frozen_tools(run_id, ROLE_OF[phase]) or ())
        spec = next((t for t in offered if t.name == call["name"]), None)
        next_turn = NextTurn(TASK_BY_PHASE[phase], run_id, step_key)
        state, holder = self.turns.start_call(run_id, ref, claimant)
        if state == "done":
            return next_turn if self._left(run_id, ref) <= 0 else None
        if state == "held" and holder is not None and (spec is None or not spec.pure):
            if alive(self.store.r, [holder])[0]:
                return CheckLater(HELD_CHECK_S)
            # Its worker died mid-call: a tool with effects is not run again.
            result = tool_error(LOST.format(name=call["name"]))
            return self._finish(run_id, ref, round_, phase, call, result, False, 0.0, next_turn)
        began = time.monotonic()
        if run.get("status") != "running":
            text, ok = tool_error("the run is over; the call was not made"), False
        elif spec is None:  # the model named a tool it was not given
            given = ", ".join(t.name for t in offered)
            text, ok = tool_error(f"unknown tool {call['name']!r}; the tools are: {given}"), False
        else:
            where = CallInfo(spec_of_run.workspace, run_id, ref, agent.tool_options or {})
            try:
                text, ok = self.run_tool(spec, dict(call.get("arguments") or {}), where)
            except Exception as exc:  # noqa: BLE001 - a tool's failure is the model's to read
                text, ok = tool_error(f"{spec.name} failed: {type(exc).__name__}: {exc}"), False
        seconds = time.monotonic() - began
        for observer in self.observers:
            observer.tool_called(call["name"], seconds, ok)
        return self._finish(run_id, ref, round_, phase, call, text, ok, seconds, next_turn)

    def _finish(
        self,
        run_id: str,
        ref: str,
        round_: int,
        phase: str,
        call: Mapping[str, Any],
        text: str,
        ok: bool,
        seconds: float,
        next_turn: NextTurn,
    ) -> ToolOutcome:
        """Store the call's result (scrubbed, capped) once; the next turn when it was the
        last of its turn to answer."""
        text = self.scrub(text)
        if len(text) > MAX_RESULT_CHARS:
            text = text[:MAX_RESULT_CHARS] + f"\n[cut: {len(text) - MAX_RESULT_CHARS} chars]"
        result = {"name": call["name"], "result": text, "ok": ok, "seconds": round(seconds, 4)}
        event = event_json(
            ev.TOOL_RESULT,
            run_id,
            round_,
            phase=phase,
            call=ref,
            tool=call["name"],
            ok=ok,
            seconds=round(seconds, 4),
            chars=len(text),
        )
        left = _keep_trying(lambda: self.turns.finish_call(run_id, ref, result, event))
        return next_turn if left <= 0 else None

    def _left(self, run_id: str, ref: str) -> int:
        """The calls of ``ref``'s turn without a result (a no-op store reads it)."""
        return self.turns.finish_call(run_id, ref, {}, "")


def _keep_trying(write: Callable[[], int]) -> int:
    """``write`` until Redis takes it (backoff 0.2 s doubling to 5 s, for up to
    :data:`STORE_PATIENCE_S`): a call that ran is not run again for a Redis blip."""
    deadline = time.monotonic() + STORE_PATIENCE_S
    wait = 0.2
    while True:
        try:
            return write()
        except INFRA_ERRORS as exc:
            if time.monotonic() + wait > deadline:
                raise
            log.warning("storing a tool result: %s; again in %.1fs", type(exc).__name__, wait)
            time.sleep(wait)
            wait = min(wait * 2, 5.0)


__all__ = ["CallInfo", "CheckLater", "NextTurn", "RunTool", "ToolOutcome", "ToolService"]
