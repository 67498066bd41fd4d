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
from orchestration.core.callcache import CacheSpec
from orchestration.core.loop import ROLE_OF, parse_step_key
from orchestration.core.toolcache import CachedResult
from orchestration.core.tools import MAX_RESULT_CHARS, ToolSpec, Workspace, tool_error
from orchestration.services.toolcaching import ToolResultCache
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
        cache: ToolResultCache | None = None,
    ) -> None:
        self.store = store
        #: The tool-result cache (None: no result is ever cached).
        self.cache = cache
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
            result = self._clean(tool_error(LOST.format(name=call["name"])))
            return self._finish(run_id, ref, round_, phase, call, result, False, 0.0, next_turn)
        began = time.monotonic()
        hit: CachedResult | None = None
        cache: CacheSpec | None = None
        key: str | None = None
        if run.get("status") != "running":
            text, ok = tool_error("the run is over; the call was not made"), False
        elif spec is None:  # the model named a tool it was not given
            given = ", ".join(t.name for t in offered)
            text, ok = tool_error(f"unknown tool {call['name']!r}; the tools are: {given}"), False
        else:
            where = CallInfo(spec_of_run.workspace, run_id, ref, agent.tool_options or {})
            arguments = dict(call.get("arguments") or {})
            cache = spec_of_run.cache if agent.cache else None
            key = self._cache_key(cache, spec, arguments, where)
            if cache is not None and key is not None and self.cache is not None:
                hit = self.cache.find(cache, key, spec.name)
            if hit is None:
                try:
                    text, ok = self.run_tool(spec, arguments, where)
                except Exception as exc:  # noqa: BLE001 - a tool's failure is the model's to read
                    text, ok = tool_error(f"{spec.name} failed: {type(exc).__name__}: {exc}"), False
        if hit is not None:  # served from the cache: no tool ran, no tool seconds counted
            return self._finish(
                run_id, ref, round_, phase, call, hit.result, True, 0.0, next_turn, hit
            )
        text = self._clean(text)
        seconds = time.monotonic() - began
        if ok and cache is not None and key is not None and self.cache is not None:
            # Before the result is stored on the turn: a redelivery after a worker lost
            # in between finds it here.
            self.cache.keep(cache, key, text, seconds)
        for observer in self.observers:
            observer.tool_called(call["name"], seconds, ok)
        return self._finish(run_id, ref, round_, phase, call, text, ok, seconds, next_turn)

    def _cache_key(
        self, cache: CacheSpec | None, spec: ToolSpec, arguments: dict[str, Any], where: CallInfo
    ) -> str | None:
        """The call's tool-result cache key; None when not cached."""
        if self.cache is None:
            return None
        return self.cache.key(cache, spec, arguments, where.workspace, where.options)

    def _clean(self, text: str) -> str:
        """``text`` as stored: scrubbed of key values, cut to :data:`MAX_RESULT_CHARS`."""
        text = self.scrub(text)
        if len(text) > MAX_RESULT_CHARS:
            text = text[:MAX_RESULT_CHARS] + f"\n[cut: {len(text) - MAX_RESULT_CHARS} chars]"
        return text

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
        hit: CachedResult | None = None,
    ) -> ToolOutcome:
        """Store the call's result (already :meth:`_clean`) once; the next turn when it was
        the last of its turn to answer. A ``hit`` is recorded as served from the cache."""
        result: dict[str, Any] = {
            "name": call["name"],
            "result": text,
            "ok": ok,
            "seconds": round(seconds, 4),
        }
        served = {"cached": True, "saved_seconds": hit.seconds} if hit is not None else {}
        result.update(served)
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
            **served,
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
