"""What a step task does, apart from Celery: claim the step, call the model at most once at
a time, store the result, and say what comes next (:class:`Handover`, :class:`RetryLater`,
:class:`Park` or ``None``). Claims, retries and round trips: docs/internals.md.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from orchestration.backoff import vendor_backoff
from orchestration.core import events as ev
from orchestration.core.agents import AgentSpec, Price
from orchestration.core.architecture import LoopSpec
from orchestration.core.budget import Amount, Refusal, role_scopes
from orchestration.core.callcache import CacheSpec
from orchestration.core.completion import REFUSED, UNFINISHED, Completion, Message, refusal_error
from orchestration.core.critique import read_critique
from orchestration.core.errors import ProviderError
from orchestration.core.loop import (
    REDIS_FULL,
    ROLE_OF,
    budget_cut,
    earlier_of_role,
    error_interruption,
    interruption,
    parse_step_key,
    step_index,
)
from orchestration.core.memory import turn_step
from orchestration.core.outputs import INVALID_OUTPUT, output_text, read_output
from orchestration.core.pricing import cost_usd
from orchestration.core.ratelimit import PAUSE_ALL_S, VendorLimits, rate_limited_reason, spread
from orchestration.core.structured import read_structured, structured_critique, structured_output
from orchestration.core.tools import McpServerSpec, ToolSpec
from orchestration.core.turns import MAX_TURNS, TurnView, after_turn, summed, turn_messages
from orchestration.prices import price_for
from orchestration.services.budgeting import Budgets, clamped, rate_name, step_id
from orchestration.services.callcaching import CallCache, hit_result
from orchestration.services.leases import Call, Leases
from orchestration.services.storing import keep_trying, store_or_fail
from orchestration.settings import Settings
from orchestration.state.budgets import LIMIT_LOST, LimitLost
from orchestration.state.connection import INFRA_ERRORS
from orchestration.state.conversations import keeps, messages_from, own_turns, turn_json
from orchestration.state.events import event_json
from orchestration.state.runs import Outgoing, RunStore, StepStart
from orchestration.state.scripts import ScriptCall
from orchestration.state.turns import TurnStore, call_ref

log = logging.getLogger(__name__)

#: Times a call's output limit is lowered to fit a budget (one per scope and unit in the way).
_FITS = 4


class ModelClient(Protocol):
    """What the step needs of a provider adapter (see ``workers.providers``)."""

    def warm(self) -> None: ...

    def complete(
        self, agent: AgentSpec, messages: list[Message], *, structured: bool = False
    ) -> Completion: ...


class StepObserver(Protocol):
    """Told what each model call did (metrics); set by the worker."""

    def step_waits(self, agent: AgentSpec, reason: str, seconds: float) -> None: ...

    def call_failed(self, agent: AgentSpec, phase: str, kind: str, *, retried: bool) -> None: ...

    def call_answered(self, agent: AgentSpec, phase: str, result: dict[str, Any]) -> None: ...


#: Lists the tools of one MCP server (``workers.tools.runner.list_mcp``).
ListMcp = Callable[[McpServerSpec], list[ToolSpec]]
#: Finds the adapter for an agent (``workers.providers.provider_for``).
ProviderLookup = Callable[[AgentSpec], ModelClient]
#: Makes an exception's text safe to store (no API keys); ``workers.secrets.redact``.
Scrub = Callable[[str], str]
#: (run id, transition) -> the message handing the run to its coordinator, to push with
#: the step's store; None: the worker sends it after (``workers.runtime``).
HandoverMessage = Callable[[str, int], Outgoing | None]


@dataclass(frozen=True, slots=True)
class Handover:
    """The step is over (stored now or before): the coordinator makes transition ``seq``."""

    run_id: str
    seq: int
    #: The coordinator's message went with the store (nothing is left to send).
    sent: bool = False


@dataclass(frozen=True, slots=True)
class RetryLater:
    """Run this step again in ``delay_s`` seconds, with ``failures`` failed attempts so far."""

    delay_s: float
    failures: int
    #: Why, in words safe to show anywhere (scrubbed): what it waits for, or what failed.
    reason: str | None = None
    #: The step claim this delivery holds, handed on to the retry (None: holds none).
    claim: str | None = None
    #: A failed attempt (a provider error), not a wait (a rate limit, budget room, a
    #: busy step): a wait is a normal state and is shown without a traceback.
    failed: bool = False
    #: Seconds the step has waited for rate limits so far (this wait included): past
    #: ``rate_wait_max_s`` the run is interrupted; a 429 or a limiter wait is no failure.
    waited: float = 0.0
    #: ``(limit name, permit)`` of a rate slot booked for when the retry runs.
    permit: tuple[str, str] | None = None


def _waiting_for(what: str, agent: AgentSpec) -> str:
    """A wait's reason as task events show it: what the step waits for, for which model."""
    return f"waiting for {what} ({agent.provider}:{agent.model_name})"


@dataclass(frozen=True, slots=True)
class FanOut:
    """The turn asked for tool calls (stored now or before): send a tool task for each of
    ``refs``; the last to store its result hands the run to the step's next turn."""

    run_id: str
    key: str
    refs: tuple[str, ...]


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
    #: Whether the model is asked natively for the critique's shape (a critic) or for its
    #: ``output_schema`` (an actor that has one).
    structured: bool = False
    #: The loop's model-call cache; None when off or the agent refuses it.
    cache: CacheSpec | None = None


@dataclass(frozen=True, slots=True)
class Park:
    """A step of a ``vendor_batch`` agent, taken and ready to be parked: no call is made;
    its request goes out in a vendor batch (``workers.vendor_batches``)."""

    run_id: str
    key: str
    seat: Seat
    spec_id: str
    messages: list[Message]
    prompt: str
    conv_key: str
    scopes: list[str]
    claimant: str
    batch_id: str | None
    #: The run's quoting token, for reading a critique's reply.
    boundary: str | None = None
    #: Which turn of its agent run this call is (an agent with tools takes several: each
    #: turn is a vendor batch round trip of its own).
    turn: int = 1


@dataclass(frozen=True, slots=True)
class StepContext:
    """One delivery's step on its way to the model: which run, step and claim, with what
    seat and input; passed whole down the call path instead of a dozen parameters."""

    run_id: str
    key: str
    phase: str
    round_: int
    claimant: str
    seat: Seat
    messages: list[Message]
    prompt: str
    #: The conversation key of a persistent subagent ("" when each call is just its prompt).
    conv: str
    scopes: tuple[str, ...]
    #: Some of ``scopes`` has a limit: the call holds its worst case in all of them first.
    limited: bool
    paused_s: float | None
    handover: Handover
    #: The run's quoting token, for reading a critique's reply.
    boundary: str | None = None
    #: Which turn of its agent run this call is (1-based; agents with tools take several).
    turn: int = 1
    #: The stored earlier turns of this agent run (their usage is the step's too).
    earlier: tuple[dict[str, Any], ...] = ()
    #: Seconds waited for rate limits so far; a rate slot booked by the last delivery.
    waited: float = 0.0
    permit: tuple[str, str] | None = None

    @property
    def held(self) -> list[str]:
        """The scopes the call holds budget in (none when no scope has a limit)."""
        return list(self.scopes) if self.limited else []


StepOutcome = Handover | RetryLater | Park | FanOut | None


class StepService:
    """Runs steps. One per process; thread-safe (its caches only ever gain entries)."""

    def __init__(
        self,
        store: RunStore,
        budgets: Budgets,
        providers: ProviderLookup,
        settings: Settings,
        scrub: Scrub,
        observers: tuple[StepObserver, ...] = (),
        leases: Leases | None = None,
        scrub_output: Scrub | None = None,
        handover_message: HandoverMessage | None = None,
        cache: CallCache | None = None,
        turns: TurnStore | None = None,
        list_mcp: ListMcp | None = None,
        spec_seen: Callable[[LoopSpec], None] | None = None,
        give_room: Callable[[], int] | None = None,
    ) -> None:
        self.store = store
        #: Makes room in a full Redis (the model-call cache's eviction; entries evicted),
        #: before an answer Redis refused for memory is judged too big to store.
        self.give_room = give_room
        #: Turns and tool results of agents with tools.
        self.turns = turns or TurnStore(store.r)
        #: Lists an MCP server's tools (``workers.tools.runner.list_mcp``).
        self.list_mcp = list_mcp
        #: Told of a spec before the first call of it here (``workers.spec_keys.register``:
        #: every key variable the spec names, both roles', is a secret from its first step).
        self.spec_seen = spec_seen
        #: The model-call cache's store (None: no call is ever cached).
        self.cache = cache
        self.handover_message = handover_message
        self.leases = leases or Leases(store, budgets.ledger, settings.step_lease_s)
        self.budgets = budgets
        self.providers = providers
        self.settings = settings
        self.scrub = scrub
        #: Makes model output safe to store (no key values); ``workers.secrets.scrub_output``.
        self.scrub_output = scrub_output
        self.observers = observers
        self._seats: dict[tuple[str, str], Seat] = {}

    def run(
        self,
        run_id: str,
        key: str,
        *,
        claimant: str,
        previous: str = "",
        failures: int = 0,
        waited: float = 0.0,
        permit: tuple[str, str] | None = None,
    ) -> StepOutcome:
        """Take step ``key`` of ``run_id`` and see it through; what the task does next.

        ``claimant`` identifies this delivery (unique per delivery); ``previous`` is the
        claim the delivery that re-scheduled this one held (see :attr:`RetryLater.claim`);
        ``failures`` counts the step's failed provider attempts so far, ``waited`` its
        seconds of rate-limit waits; ``permit`` is the rate slot it booked for now.
        """
        outcome = self._run(run_id, key, claimant, previous, failures, waited, permit)
        if permit is not None and not isinstance(outcome, Handover | RetryLater | FanOut):
            # The step is over or parked: no call goes with it. A turn that asked for tools
            # made its call with the permit (one resending lost calls lets it lapse).
            self._give_back(permit)
        return outcome

    def _run(
        self,
        run_id: str,
        key: str,
        claimant: str,
        previous: str,
        failures: int,
        waited: float,
        permit: tuple[str, str] | None,
    ) -> StepOutcome:
        store = self.store
        phase, round_ = parse_step_key(key)
        started = (
            event_json(ev.CRITIC_STARTED, run_id, round_)
            if phase == "critique"
            else event_json(ev.ACTOR_STARTED, run_id, round_, phase=ev.ACTOR_PHASE[phase])
        )
        lease_s = self.settings.step_lease_s
        earlier = earlier_of_role(key)
        known = self.budgets.known_pauses()
        start = store.begin_step(run_id, key, claimant, lease_s, started, previous, earlier, known)
        dead = None
        # A claim naming a dead process: the step is taken over now, not after its lease.
        holder = start.holder if start.outcome == "busy" else None
        if holder is not None and store.take_over(
            run_id, key, holder, claimant, lease_s, self.settings.process_ttl_s
        ):
            dead = holder
            start = store.begin_step(
                run_id, key, claimant, lease_s, started, previous, earlier, known
            )
        if start.outcome == "busy":  # another delivery's call is in flight: check later
            self._give_back(permit)
            why = "waiting: another delivery has the step"
            return RetryLater(self.check_s(), failures, why, waited=waited)
        # The run's scopes this step's calls are charged to (not the other role's own).
        start = replace(start, scopes=role_scopes(start.scopes, ROLE_OF[phase]))
        if dead is not None and start.limited:
            # The dead call's outcome is unknown: its hold is charged now, not left to
            # lapse (which would charge it too, a lease later, holding room meanwhile).
            self.budgets.charge_dead(_hold_id(run_id, key, dead), list(start.scopes))
        if start.outcome in ("gone", "stop"):
            return None
        handover = Handover(run_id, step_index(phase, round_) + 1)
        if start.outcome in ("done", "cancelled"):
            self._give_back(permit)
            return handover
        try:
            return self._prepare_and_answer(
                run_id, key, phase, round_, claimant, start, handover, failures, waited, permit
            )
        except INFRA_ERRORS:
            raise  # Redis or the broker away: the task retries it
        except Exception as exc:  # noqa: BLE001 - a run must end, never hang on a bad spec
            return self._failed_to_prepare(run_id, key, phase, round_, claimant, handover, exc)

    def _failed_to_prepare(
        self,
        run_id: str,
        key: str,
        phase: str,
        round_: int,
        claimant: str,
        handover: Handover,
        exc: Exception,
    ) -> Handover:
        """Store the step as failed by ``exc`` (raised while its call was made ready: a bad
        spec, a refused key, a URL no client takes), scrubbed, and hand the run on: its
        coordinator ends it ``failed``, never leaving it ``running``."""
        message = self.scrub(f"{type(exc).__name__}: {exc}")
        log.error("run %s step %s failed before its call: %s", run_id, key, message)
        result = _failure(key, "error", message, time.time(), calls=0)
        send = self.handover_message(run_id, handover.seq) if self.handover_message else None
        self._keep_trying(
            lambda: self.store.complete_step(
                run_id,
                key,
                result,
                _completed_event(run_id, phase, round_, result),
                claimant,
                send=send,
            ),
            f"run {run_id} step {key}: storing its failure",
        )
        return replace(handover, sent=True) if send is not None else handover

    def _prepare_and_answer(
        self,
        run_id: str,
        key: str,
        phase: str,
        round_: int,
        claimant: str,
        start: StepStart,
        handover: Handover,
        failures: int,
        waited: float,
        permit: tuple[str, str] | None,
    ) -> StepOutcome:
        """Make the step's call ready (its seat, messages, hold) and answer it."""
        store = self.store
        assert start.input is not None and start.spec_id is not None
        role = ROLE_OF[phase]
        seat = self.seat(start.spec_id, role)
        prompt: str = start.input["prompt"]
        messages: list[Message] = [{"role": "user", "content": prompt}]
        conv = (start.input.get("conv") or "") if seat.turns else ""
        boundary: str | None = start.input.get("boundary")
        if conv and start.history is not None:
            # The history the begin script read, bounded by tokens: earlier runs' oldest
            # turns go first, this run's own stay.
            messages[:0] = messages_from(start.history, max_tokens=seat.max_tokens, run_id=run_id)
        elif seat.turns and start.own is not None:
            # The run's own conversation: its earlier steps of the role, read with the step.
            turns = own_turns(run_id, start.own, seat.turns)
            messages[:0] = messages_from(turns, max_tokens=seat.max_tokens, run_id=run_id)
        turn, prior = 1, tuple[dict[str, Any], ...]()
        if seat.agent.mcp_servers:  # their tools, listed once per run, frozen for it
            seat = replace(seat, agent=self._with_mcp(run_id, role, seat.agent))
        if seat.agent.takes_tools:
            stored = self.turns.turns(run_id, key)
            if stored and stored[-1].missing:
                # The last turn's calls have not all answered (a lost message, a sweep):
                # send them again (a copy of one in flight is harmless) and let the claim go.
                last = stored[-1]
                self.turns.store_turn(run_id, key, last.number, last.data, claimant)
                return FanOut(
                    run_id, key, tuple(call_ref(key, last.number, i) for i in last.missing)
                )
            views = [TurnView(t.data.get("text") or "", t.calls, t.results) for t in stored]
            messages.extend(turn_messages(views, boundary))  # type: ignore[arg-type]
            turn, prior = len(stored) + 1, tuple(dict(t.data) for t in stored)
        if seat.agent.execution == "vendor_batch":
            # The adapter (and so the worker's key policy) before the call is parked: a
            # refusal fails the run here, not the vendor batch it would have joined.
            self.providers(seat.agent)
            return Park(
                run_id,
                key,
                seat,
                start.spec_id,
                messages,
                prompt,
                conv,
                list(start.scopes),
                claimant,
                store.batch_of(run_id),
                boundary,
                turn,
            )
        # From here to the stored answer the claim (and the budget hold, once made) is
        # renewed: a slow SDK start or a slow call keeps the step; a dead worker's lapses.
        # Scopes without any limit hold nothing: the call's usage is only counted.
        held = start.scopes if start.limited else ()
        hold = Call(run_id, key, claimant, _hold_id(run_id, key, claimant), held)
        step = StepContext(
            run_id,
            key,
            phase,
            round_,
            claimant,
            seat,
            messages,
            prompt,
            conv,
            start.scopes,
            start.limited,
            start.paused_s,
            handover,
            boundary,
            turn,
            prior,
            waited,
            permit,
        )
        with self.leases.held(hold):
            return self._answer(step, failures)

    def _answer(self, step: StepContext, failures: int) -> Handover | RetryLater | FanOut:
        """Call the model and store its answer (or learn to retry). Without a limit in any
        scope the call holds nothing and its usage is counted with its store."""
        store, run_id, key, seat = self.store, step.run_id, step.key, step.seat
        call = self._call(step, failures)
        if isinstance(call, RetryLater):
            return replace(call, claim=step.claimant)
        result, completion, settle = call
        if seat.agent.takes_tools:
            calls = len(completion.tool_calls) if completion is not None else 0
            after = after_turn(step.turn, seat.agent.max_turns, calls, result.get("interrupted"))
            if after == "tools":
                assert completion is not None
                return self._store_turn(step, result, completion, settle)
            if after == "max_turns":
                result["interrupted"] = MAX_TURNS
                result["error"] = (
                    f"asked for tools on its last turn (max_turns={seat.agent.max_turns})"
                )
        spend = None
        if not step.limited and completion is not None and not result.get("cached"):
            used = _used(completion, result)
            for earlier in step.earlier:  # unlimited scopes count a whole agent run at once
                if not earlier.get("cached"):
                    used = used + _used_of(earlier)
            spend = self.budgets.spend(list(step.scopes), used)
        if step.earlier:
            result = summed(result, step.earlier)
        conversation = None
        # A reply cut at max_tokens, or refused, is not a turn the model should build on.
        whole = completion is not None and completion.stop_reason not in UNFINISHED
        if result.get("interrupted") == INVALID_OUTPUT:  # not an answer to build on either
            whole = False
        if completion is not None and whole and step.conv and keeps(seat.turns, completion.text):
            turn = turn_json(turn_step(run_id, key), step.prompt, completion.text)
            conversation = (step.conv, turn, seat.turns)
        # The settlement, the result and the conversation turn: one round trip. A paid
        # answer is not dropped for a Redis blip: the store is tried again here, holding
        # the claim (a retry of the task would have to call the model again).
        handover = step.handover
        send = self.handover_message(run_id, handover.seq) if self.handover_message else None

        def write(stored: dict[str, Any], turn: tuple[str, str, int] | None) -> object:
            return store.complete_step(
                run_id,
                key,
                stored,
                _completed_event(run_id, step.phase, step.round_, stored),
                step.claimant,
                conversation=turn,
                conversation_max_tokens=seat.max_tokens,
                before=settle,
                spend=spend,
                send=send,
            )

        # An answer Redis can never hold (OOM, bigger than its room): the step fails,
        # charged, and the run ends `failed` instead of retrying for ever.
        store_or_fail(
            lambda: write(result, conversation),
            lambda why: write(_unstorable(key, result, why), None),
            _size(result, conversation),
            "this step's answer",
            f"run {run_id} step {key}: storing the answer",
            store.r,
            self.give_room,
        )
        return replace(handover, sent=True) if send is not None else handover

    def _with_mcp(self, run_id: str, role: str, agent: AgentSpec) -> AgentSpec:
        """``agent`` offering its MCP servers' tools too: those frozen for the run, or listed
        now and frozen (a server that cannot be listed offers none; the others do)."""
        frozen = self.turns.frozen_tools(run_id, role)
        if frozen is None:
            listed: list[ToolSpec] = []
            for server in agent.mcp_servers:
                try:
                    listed += self.list_mcp(server) if self.list_mcp else []
                except Exception as exc:  # noqa: BLE001 - a server down offers no tools
                    why = self.scrub(str(exc))
                    log.warning("run %s: MCP server not listed: %s", run_id, why)
                    self.store.add_event(  # seen by the run's watchers: its tools are absent
                        run_id,
                        event_json(ev.TOOL_RESULT, run_id, tool="tools/list", ok=False, error=why),
                    )
            frozen = self.turns.freeze_tools(run_id, role, listed)
        own = {t.name for t in agent.tool_specs}
        extra = tuple(t for t in frozen if t.name not in own)
        return agent.model_copy(update={"tool_specs": agent.tool_specs + extra})

    def _store_turn(
        self,
        step: StepContext | _BatchTurn,
        result: dict[str, Any],
        completion: Completion,
        settle: list[Any],
    ) -> FanOut:
        """Store a turn that asked for tool calls (with its budget settlement, in one round
        trip) and let the step's claim go: the calls run as tasks of their own."""
        run_id, key = step.run_id, step.key
        calls = [c.as_dict() for c in completion.tool_calls]
        data: dict[str, Any] = {"text": completion.text, "tool_calls": calls}
        for name in _USAGE:
            if name in result:
                data[name] = result[name]
        refs = tuple(call_ref(key, step.turn, i) for i in range(len(calls)))
        events = [
            event_json(
                ev.TOOL_CALL,
                run_id,
                step.round_,
                phase=step.phase,
                turn=step.turn,
                call=ref,
                tool=call["name"],
                arguments=call["arguments"],
            )
            for ref, call in zip(refs, calls, strict=True)
        ]
        self._keep_trying(
            lambda: self.turns.store_turn(
                run_id, key, step.turn, data, step.claimant, events, before=settle
            ),
            f"run {run_id} step {key}: storing turn {step.turn}",
        )
        return FanOut(run_id, key, refs)

    def _keep_trying(self, write: Callable[[], object], what: str) -> None:
        """Run ``write`` until Redis takes it (:func:`~orchestration.services.storing.keep_trying`):
        a paid answer is not dropped for a Redis blip."""
        keep_trying(write, what)

    def _reserve(
        self,
        agent: AgentSpec,
        messages: list[Message],
        structured: bool,
        sid: str,
        scopes: list[str],
        worst: Amount,
        lease_s: float,
    ) -> tuple[AgentSpec, Amount, Refusal | None, str | None]:
        """Reserve the call's worst case. A budget that cannot hold it may still hold a
        shorter answer: ``max_tokens`` is lowered to what is left (a reply cut there
        interrupts the run with that budget's reason). The agent as it will call, its
        worst case, the refusal when nothing fits, and the reason of the budget that
        lowered ``max_tokens`` (None when none did)."""
        budgets = self.budgets
        refusal = budgets.reserve(sid, scopes, worst, lease_s)
        lowered_by: str | None = None
        for _ in range(_FITS):
            if refusal is None or not refusal.exhausted:
                break
            fit = clamped(agent, refusal, worst)
            if fit.max_tokens is None:
                break
            lowered_by = lowered_by or refusal.reason
            agent = agent.model_copy(update={"max_tokens": fit.max_tokens})
            worst = budgets.estimate(agent, messages, structured)
            refusal = budgets.reserve(sid, scopes, worst, lease_s)
        return agent, worst, refusal, lowered_by

    # --- vendor batch execution (the rest is in workers/vendor_batches.py) ----------
    def reserve_parked(
        self, parking: Park, hold_s: float, failures: int
    ) -> dict[str, Any] | Handover | RetryLater:
        """Reserve a parked step's worst case for as long as a vendor batch may take; the
        request to park — or, when the budget has no room, the step ends with the budget
        interruption and the run goes back to its coordinator (:class:`Handover`). Room
        held by calls in flight re-schedules the step, as for a synchronous call."""
        agent, run_id, key = parking.seat.agent, parking.run_id, parking.key
        began = time.time()
        structured = parking.seat.structured
        worst = self.budgets.estimate(agent, parking.messages, structured)
        agent, worst, refusal, lowered_by = self._reserve(
            agent,
            parking.messages,
            structured,
            parked_id(run_id, key, parking.turn),
            parking.scopes,
            worst,
            hold_s,
        )
        phase, round_ = parse_step_key(key)
        if refusal is not None:
            if not refusal.exhausted or clamped(agent, refusal, worst).wait:
                wait = self.backoff_s(min(failures, 6), None)
                waiting = _waiting_for("budget room held by calls in flight", agent)
                return replace(self._retry(wait, failures, waiting), claim=parking.claimant)
            result = _failure(key, refusal.reason, _refused(refusal), began, calls=0)
            self.store.complete_step(
                run_id,
                key,
                result,
                _completed_event(run_id, phase, round_, result),
                parking.claimant,
            )
            return Handover(run_id, step_index(phase, round_) + 1)
        return {
            "spec_id": parking.spec_id,
            "role": ROLE_OF[phase],
            "messages": parking.messages,
            "prompt": parking.prompt,
            "conv": parking.conv_key,
            "structured": parking.seat.structured,
            "scopes": parking.scopes,
            "claimant": parking.claimant,
            "batch_id": parking.batch_id,
            "parked_at": began,
            "attempts": 0,
            "max_tokens": agent.max_tokens,
            "boundary": parking.boundary,
            "lowered_by": lowered_by,
            "turn": parking.turn,
            # The tools as this turn offers them (an MCP server's are frozen for the run).
            **(
                {"tools": [t.model_dump(mode="json") for t in agent.tool_specs]}
                if agent.takes_tools
                else {}
            ),
        }

    def agent_of(self, request: dict[str, Any]) -> AgentSpec:
        """The agent of a parked request, its ``max_tokens`` as lowered to fit its budget."""
        agent = self.seat(request["spec_id"], request["role"]).agent
        max_tokens = request.get("max_tokens")
        if max_tokens is not None and max_tokens != agent.max_tokens:
            agent = agent.model_copy(update={"max_tokens": int(max_tokens)})
        if request.get("tools") is not None:  # an agent with tools: as its turn offered them
            tools = tuple(ToolSpec.model_validate(t) for t in request["tools"])
            agent = agent.model_copy(update={"tool_specs": tools})
        return agent

    def release_parked(self, run_id: str, key: str, request: dict[str, Any]) -> Handover:
        """A parked step that will never be sent (its run was cancelled): release its
        hold; the run goes to its coordinator, which finishes it."""
        self.budgets.release(parked_id(run_id, key, request.get("turn")), request["scopes"])
        phase, round_ = parse_step_key(key)
        return Handover(run_id, step_index(phase, round_) + 1)

    def store_batch_outcome(
        self,
        run_id: str,
        key: str,
        request: dict[str, Any],
        outcome: Completion | ProviderError,
        *,
        vendor_batch: str | None,
    ) -> Handover | FanOut:
        """Store a parked step's result from its vendor batch (priced at the batch rate;
        the budget settled once); the run goes back to its coordinator. A turn of an agent
        with tools that asks for calls is stored as a turn instead: its calls go out as
        tool tasks (:class:`FanOut`), and the last to answer sends the step again."""
        seat = self.seat(request["spec_id"], request["role"])
        phase, round_ = parse_step_key(key)
        turn = int(request.get("turn") or 1)
        sid, scopes = parked_id(run_id, key, turn), list(request["scopes"])
        began = float(request.get("parked_at") or time.time())
        conversation: tuple[str, str, int] | None = None
        settle: list[ScriptCall] = []
        if isinstance(outcome, ProviderError):
            self.budgets.release(sid, scopes)
            result = _failure(
                key, error_interruption(outcome.kind), self.scrub(str(outcome)), began
            )
            result["vendor_batch"] = vendor_batch
            for observer in self.observers:
                observer.call_failed(seat.agent, phase, outcome.kind, retried=False)
            if turn > 1:  # the agent run's earlier turns count with the step
                result = self._with_earlier(run_id, key, turn, result)
        else:
            outcome = self.cleaned(outcome)
            result = _result_from(
                outcome,
                phase,
                key,
                seat,
                batch=True,
                started_at=began,
                finished_at=time.time(),
                model=seat.agent.model,
                scrub=self.scrub_output,
                vendor_batch=vendor_batch,
                boundary=request.get("boundary"),
            )
            result["interrupted"] = budget_cut(result["interrupted"], request.get("lowered_by"))
            used = Amount(
                input_tokens=outcome.input_tokens,
                output_tokens=outcome.output_tokens,
                usd=result["usd"],
                calls=1,
            )
            settle = self.budgets.settle_calls(sid, scopes, used)
            self.budgets.learn(
                seat.agent,
                request["messages"],
                bool(request.get("structured")),
                outcome.input_tokens,
            )
            for observer in self.observers:  # latency: from parking to the batch's result
                observer.call_answered(seat.agent, phase, result)
            if seat.agent.takes_tools:
                done = self._batch_turn(run_id, key, request, turn, result, outcome, settle)
                if isinstance(done, FanOut):
                    return done
                result = done
            conv_key = request.get("conv") or ""
            whole = outcome.stop_reason not in UNFINISHED
            if whole and conv_key and keeps(seat.turns, outcome.text):
                said = turn_json(turn_step(run_id, key), request["prompt"], outcome.text)
                conversation = (conv_key, said, seat.turns)
        self.store.complete_step(
            run_id,
            key,
            result,
            _completed_event(run_id, phase, round_, result),
            request["claimant"],
            conversation=conversation,
            conversation_max_tokens=seat.max_tokens,
            before=settle,
        )
        return Handover(run_id, step_index(phase, round_) + 1)

    def _batch_turn(
        self,
        run_id: str,
        key: str,
        request: dict[str, Any],
        turn: int,
        result: dict[str, Any],
        completion: Completion,
        settle: list[ScriptCall],
    ) -> dict[str, Any] | FanOut:
        """What a vendor batch's answer to turn ``turn`` of an agent with tools is: a turn
        whose calls run next (stored with its settlement), or the agent run's last answer
        (interrupted at ``max_turns``), summed with its earlier turns."""
        agent = self.agent_of(request)
        after = after_turn(turn, agent.max_turns, len(completion.tool_calls), result["interrupted"])
        phase, round_ = parse_step_key(key)
        if after == "tools":
            step = _BatchTurn(run_id, key, phase, round_, str(request["claimant"]), turn)
            return self._store_turn(step, result, completion, settle)
        if after == "max_turns":
            result["interrupted"] = MAX_TURNS
            result["error"] = f"asked for tools on its last turn (max_turns={agent.max_turns})"
        return self._with_earlier(run_id, key, turn, result)

    def _with_earlier(
        self, run_id: str, key: str, turn: int, result: dict[str, Any]
    ) -> dict[str, Any]:
        """``result`` of turn ``turn`` summed with the stored earlier turns of its step."""
        earlier = [t.data for t in self.turns.turns(run_id, key) if t.number < turn]
        return summed(result, earlier) if earlier else result

    def cleaned(self, completion: Completion) -> Completion:
        """``completion`` with no key value in it (:func:`clean_completion`): a model may
        repeat a key it was shown, and everything stored of an answer (result, events,
        conversation turn) comes from here."""
        return (
            completion
            if self.scrub_output is None
            else clean_completion(completion, self.scrub_output)
        )

    def seat(self, spec_id: str, role: str) -> Seat:
        """The cached :class:`Seat` of ``role`` in spec ``spec_id`` (specs never change)."""
        seat = self._seats.get((spec_id, role))
        if seat is None:
            spec = self.store.load_spec(spec_id)
            if self.spec_seen is not None:
                self.spec_seen(spec)
            agent = spec.actor if role == "actor" else spec.critic
            turns = spec.conversation_turns if spec.persistent_subagents else 0
            structured = (
                structured_critique(agent) if role == "critic" else structured_output(agent)
            )
            seat = self._seats[(spec_id, role)] = Seat(
                agent,
                price_for(agent),
                max(turns, 0),
                spec.conversation_max_tokens,
                structured,
                spec.cache if agent.cache else None,
            )
        return seat

    def backoff_s(self, attempt: int, retry_after: float | None) -> float:
        """The vendor backoff's wait (full jitter); a vendor's Retry-After is a floor."""
        policy = vendor_backoff(self.settings.retry_base_s, self.settings.retry_max_s)
        wait = policy.delay(attempt)
        return max(wait, retry_after) if retry_after is not None else wait

    def check_s(self) -> float:
        """How long a delivery that found the step busy waits before looking again: a few
        seconds, well inside the claim's lease (so a dead holder is noticed in time)."""
        return random.uniform(0.5, 1.0) * min(5.0, self.settings.step_lease_s / 3)

    def _retry(
        self,
        seconds: float,
        failures: int,
        reason: str,
        *,
        failed: bool = False,
        waited: float = 0.0,
        permit: tuple[str, str] | None = None,
    ) -> RetryLater:
        """Re-schedule the step in ``seconds`` (no thread waits), saying why.

        The worker holds a waiting message unacknowledged, so a wait is kept well inside
        the broker's visibility timeout; a longer pause (a vendor's Retry-After) is still
        obeyed, as the fleet-wide pause makes the step wait again when it comes back.
        """
        wait = min(seconds, self.settings.visibility_timeout_s / 2)
        return RetryLater(
            wait,
            failures,
            f"{reason}; again in {wait:.1f} s",
            failed=failed,
            waited=waited,
            permit=permit,
        )

    # --- rate limits: pacing, 429s, permits --------------------------------------------
    def _pace(
        self, step: StepContext, agent: AgentSpec, tokens: int, failures: int
    ) -> str | RetryLater:
        """The rate permit this call goes with ('' when no limit applies), or the wait:
        until the slot it booked (the retry brings the permit), or — no slot within the
        horizon, or a fleet-wide pause — before asking again, spread so that calls told
        alike do not come back at one instant."""
        if step.permit is not None:
            return step.permit[1]  # booked by the delivery before this one, for now
        hold_s = self.settings.step_lease_s + agent.timeout_s
        decision = self.budgets.rate_permit(agent, tokens, step.paused_s, hold_s)
        if decision.wait_s <= 0:
            return decision.permit
        wait = decision.wait_s if decision.booked else spread(decision.wait_s, random.random())
        for observer in self.observers:
            observer.step_waits(agent, "rate_limit", wait)
        permit = (rate_name(agent), decision.permit) if decision.booked else None
        why = _waiting_for("the fleet's rate limit", agent)
        return self._retry(wait, failures, why, waited=step.waited + wait, permit=permit)

    def _rate_limited(
        self,
        step: StepContext,
        agent: AgentSpec,
        exc: ProviderError,
        permit: tuple[str, str] | None,
        failures: int,
        message: str,
    ) -> RetryLater:
        """A 429, which is a wait and no failed attempt: the permit is released, the
        call waits the vendor's Retry-After (or a backoff growing with what it waited so
        far), spread. A model the limiter paces keeps pacing the others (a long
        Retry-After pauses its limit); one with no limit to pace by is paused fleet-wide."""
        after = exc.retry_after
        pause_s = after if after is not None and after >= PAUSE_ALL_S else 0.0
        paced = self.budgets.rate_refused(agent, permit[1] if permit else "", exc.limits, pause_s)
        if after and not paced:
            self.budgets.pause(agent, after)
        settings = self.settings
        if after is None:
            after = min(max(step.waited / 2, settings.retry_base_s), settings.retry_max_s)
        wait = spread(after, random.random())
        for observer in self.observers:
            observer.call_failed(agent, step.phase, exc.kind, retried=True)
        retry = event_json(
            ev.STEP_RETRY,
            step.run_id,
            step.round_,
            phase=step.phase,
            kind=exc.kind,
            status_code=exc.status_code,
            attempt=failures + 1,
            counted=False,  # a wait: not one of the step's max_attempts
            wait=round(wait, 3),
        )
        with contextlib.suppress(*INFRA_ERRORS):  # only the event is lost to a Redis blip
            self.store.add_event(step.run_id, retry)
        reason = f"{exc.kind}: {message}"
        return self._retry(wait, failures, reason, waited=step.waited + wait)

    def _give_back(
        self, permit: tuple[str, str] | None, learned: VendorLimits | None = None
    ) -> None:
        """Return a rate permit whose call was never sent (or failed), noting ``learned``."""
        if permit is None:
            return
        name, held = permit
        with contextlib.suppress(*INFRA_ERRORS):  # a lost permit lapses at its expiry
            self.budgets.limiter.settle(name, held, tokens=None, learned=learned)

    def _cache_key(self, seat: Seat, messages: list[Message], boundary: str | None) -> str | None:
        """The call's model-call cache key; None when not cached."""
        if self.cache is None:
            return None
        return self.cache.key(seat.cache, seat.agent, messages, seat.structured, boundary)

    def _from_cache(
        self, seat: Seat, cache_key: str, key: str, began: float, boundary: str | None
    ) -> tuple[dict[str, Any], Completion, list[Any]] | None:
        """The step's result from a cached answer (billed nothing); None on a miss."""
        assert self.cache is not None and seat.cache is not None
        found = self.cache.find(seat.cache, cache_key, seat.agent, boundary)
        if found is None:
            return None
        completion = self.cleaned(found)
        result = hit_result(
            _result_from(
                completion,
                parse_step_key(key)[0],
                key,
                seat,
                boundary=boundary,
                started_at=began,
                model=seat.agent.model,
                scrub=self.scrub_output,
            )
        )
        return result, completion, []

    def _call(
        self, step: StepContext, failures: int
    ) -> tuple[dict[str, Any], Completion | None, list[Any]] | RetryLater:
        """Call the model within the fleet's rate limits and the run's budgets.

        Returns the step's result, the completion (when the model answered) and the budget
        settlement still to run (with the result's store, in one round trip) — or a
        :class:`RetryLater`: for a transient failure (counted against ``max_attempts``), a
        rate-limit wait or budget room held by calls in flight (not counted).
        """
        settings, budgets = self.settings, self.budgets
        run_id, key, seat, messages = step.run_id, step.key, step.seat, step.messages
        phase, round_, boundary, scopes = step.phase, step.round_, step.boundary, step.held
        agent = seat.agent
        # The hold is this delivery's: a second call of the step (its first caller died,
        # or the broker delivered it twice) is a second call the vendor bills.
        sid = _hold_id(run_id, key, step.claimant)
        began = time.time()
        cache_key = self._cache_key(seat, messages, boundary)
        if (
            cache_key is not None
            and (hit := self._from_cache(seat, cache_key, key, began, boundary)) is not None
        ):
            self._give_back(step.permit)  # a slot booked before the answer was cached
            return hit  # before any rate-limit grant or budget hold: a hit costs neither
        worst = budgets.estimate(agent, messages, seat.structured)
        provider = self.providers(agent)
        # Ready the HTTP client before taking a rate permit, so the permit is spent at once.
        provider.warm()
        # Fleet-wide rate limits and pauses first (a wait holds no budget), then the budget.
        if step.waited >= settings.rate_wait_max_s:  # waited long enough: stop, say why
            self._give_back(step.permit)
            reason = rate_limited_reason(step.waited)
            waited = f"waited {step.waited:.0f}s in all for the rate limits of {agent.model}"
            return _failure(key, reason, waited, began, calls=0), None, []
        paced = self._pace(step, agent, worst.tokens, failures)
        if isinstance(paced, RetryLater):
            return paced
        permit = (rate_name(agent), paced) if paced else None
        try:
            agent, worst, refusal, lowered_by = self._reserve(
                agent, messages, seat.structured, sid, scopes, worst, settings.step_lease_s
            )
        except LimitLost as exc:  # the cap is gone from Redis: fail, never call uncapped
            self._give_back(permit)
            return _failure(key, LIMIT_LOST, str(exc), began, calls=0), None, []
        if refusal is not None:
            self._give_back(permit)
            if not refusal.exhausted or clamped(agent, refusal, worst).wait:
                # the room is held by calls in flight; it frees soon
                wait = self.backoff_s(min(failures, 6), None)
                for observer in self.observers:
                    observer.step_waits(agent, "budget", wait)
                waiting = _waiting_for("budget room held by calls in flight", agent)
                return self._retry(wait, failures, waiting, waited=step.waited)
            return _failure(key, refusal.reason, _refused(refusal), began, calls=0), None, []
        try:
            completion = self.cleaned(
                provider.complete(agent, messages, structured=seat.structured)
            )
        except ProviderError as exc:
            budgets.release(sid, scopes)
            message = self.scrub(str(exc))
            if exc.kind == "rate_limited":  # a wait, not a failed attempt
                return self._rate_limited(step, agent, exc, permit, failures, message)
            self._give_back(permit, exc.limits)
            retried = exc.transient and failures + 1 < settings.max_attempts
            for observer in self.observers:
                observer.call_failed(agent, phase, exc.kind, retried=retried)
            if retried:
                wait = self.backoff_s(failures, exc.retry_after)
                log.info(
                    "run %s step %s: %s; retry %s in %.1fs",
                    run_id,
                    key,
                    exc.kind,
                    failures + 1,
                    wait,
                )
                self.store.add_event(
                    run_id,
                    event_json(
                        ev.STEP_RETRY,
                        run_id,
                        round_,
                        phase=phase,
                        kind=exc.kind,
                        status_code=exc.status_code,
                        attempt=failures + 1,
                        max_attempts=settings.max_attempts,
                        wait=round(wait, 3),
                    ),
                )
                return self._retry(
                    wait, failures + 1, f"{exc.kind}: {message}", failed=True, waited=step.waited
                )
            # No key: no request went out, so no call is counted (nor billed).
            calls = 0 if exc.kind == "missing_key" else 1
            stopped = _failure(key, error_interruption(exc.kind), message, began, calls=calls)
            return stopped, None, []
        except Exception as exc:  # noqa: BLE001 - a bug must fail the run, not strand it
            budgets.release(sid, scopes)
            self._give_back(permit)
            message = self.scrub(f"{type(exc).__name__}: {exc}")
            log.error("run %s step %s failed: %s", run_id, key, message)
            for observer in self.observers:
                observer.call_failed(agent, phase, "error", retried=False)
            return _failure(key, "error", message, began), None, []
        # What the call teaches the token estimate; a Redis blip here loses only a sample.
        with contextlib.suppress(*INFRA_ERRORS):
            budgets.learn(agent, messages, seat.structured, completion.input_tokens)
        result = _result_from(
            completion,
            phase,
            key,
            seat,
            boundary=boundary,
            started_at=began,
            finished_at=time.time(),
            model=agent.model,
            scrub=self.scrub_output,
        )
        result["interrupted"] = budget_cut(result["interrupted"], lowered_by)
        for observer in self.observers:
            observer.call_answered(agent, phase, result)
        if cache_key is not None and self.cache is not None and seat.cache is not None:
            self.cache.keep(seat.cache, cache_key, completion, boundary)
        settle = budgets.settle_calls(sid, scopes, _used(completion, result))
        tokens = completion.input_tokens + completion.output_tokens
        paid = budgets.rate_settle_call(agent, paced, tokens, completion.limits)
        return result, completion, settle if paid is None else [*settle, paid]


def _used(completion: Completion, result: dict[str, Any]) -> Amount:
    """What one answered call used, as budgets count it."""
    return Amount(
        input_tokens=completion.input_tokens,
        output_tokens=completion.output_tokens,
        usd=result["usd"],
        calls=1,
    )


def _used_of(turn: dict[str, Any]) -> Amount:
    """What a stored earlier turn used, as budgets count it."""
    return Amount(
        input_tokens=int(turn.get("input_tokens") or 0),
        output_tokens=int(turn.get("output_tokens") or 0),
        usd=float(turn.get("usd") or 0.0),
        calls=int(turn.get("calls") or 0),
    )


def clean_completion(completion: Completion, scrub: Scrub) -> Completion:
    """``completion`` with ``scrub`` applied to its text, to every string of its
    structured critique and of its tool calls' arguments; the same object when nothing
    changed."""
    text = scrub(completion.text)
    structured = completion.structured
    if structured is not None:
        structured = _scrubbed(structured, scrub)
    calls = completion.tool_calls
    if calls:
        cleaned = tuple(
            replace(c, arguments=_scrubbed(c.arguments, scrub)) for c in completion.tool_calls
        )
        if any(a.arguments is not b.arguments for a, b in zip(cleaned, calls, strict=True)):
            calls = cleaned
    if (
        text is completion.text
        and structured is completion.structured
        and calls is completion.tool_calls
    ):
        return completion
    return replace(completion, text=text, structured=structured, tool_calls=calls)


def _scrubbed(value: Any, scrub: Scrub) -> Any:
    """``value`` (JSON-like) with ``scrub`` applied to every string in it; the same
    object when nothing changed."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, list):
        items = [_scrubbed(v, scrub) for v in value]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    if isinstance(value, dict):
        found = {k: _scrubbed(v, scrub) for k, v in value.items()}
        return value if all(found[k] is v for k, v in value.items()) else found
    return value


@dataclass(frozen=True, slots=True)
class _BatchTurn:
    """What :meth:`StepService._store_turn` reads of a step, for a turn a vendor batch
    answered (no delivery holds the step: the parked request's claim does)."""

    run_id: str
    key: str
    phase: str
    round_: int
    claimant: str
    turn: int


def parked_id(run_id: str, key: str, turn: int | None) -> str:
    """The id of a parked call's budget hold and settlement: the step's for its first turn,
    one per later turn (each turn of an agent with tools is a call of its own)."""
    sid = step_id(run_id, key)
    return sid if not turn or turn <= 1 else f"{sid}|t{turn}"


def _hold_id(run_id: str, key: str, claimant: str) -> str:
    """The id of one delivery's budget hold for a step (a second call is a second hold)."""
    return f"{step_id(run_id, key)}:{claimant}"


def _result_from(
    completion: Completion,
    phase: str,
    key: str,
    seat: Seat,
    *,
    batch: bool = False,
    scrub: Scrub | None = None,
    boundary: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    usd = 0.0
    if seat.price is not None:
        usd = cost_usd(
            seat.price,
            completion.input_tokens,
            completion.output_tokens,
            completion.cached_input_tokens,
            completion.cache_write_tokens,
            batch=batch,
        )
    result: dict[str, Any] = {
        "key": key,
        "text": completion.text,
        "input_tokens": completion.input_tokens,
        "output_tokens": completion.output_tokens,
        "cached_input_tokens": completion.cached_input_tokens,
        "cache_write_tokens": completion.cache_write_tokens,
        "usd": usd,
        "calls": 1,
        "stop_reason": completion.stop_reason,
        **extra,
    }
    if completion.stop_reason in REFUSED:  # an outcome, not an answer: nothing to read
        reason = completion.stop_reason
        return {
            **result,
            "text": None,
            "interrupted": reason,
            "error": refusal_error(reason, completion.text),
        }
    complete = False
    if phase == "critique":
        native = read_structured(completion.structured)
        critique, complete = (
            native if native is not None else read_critique(completion.text, boundary)
        )
        issues, summary = critique.issues, critique.summary
        findings = [f.as_dict() for f in critique.findings]
        if scrub is not None:  # what parsing decoded (a key as JSON escapes) is scrubbed too
            issues, summary = _scrubbed(issues, scrub), scrub(summary)
            findings = _scrubbed(findings, scrub)
        result.update(
            score=critique.score,
            issues=issues,
            summary=summary,
            findings=findings,
            # read from the vendor's structured output, not searched for in the text
            structured=native is not None,
        )
    result["interrupted"] = interruption(phase, completion.stop_reason, complete)
    schema = seat.agent.output_schema
    # (a turn asking for tools has no answer yet)
    answered = result["interrupted"] is None and not completion.tool_calls
    if phase != "critique" and schema is not None and answered:
        result.update(_structured_answer(schema, completion, key))
    return result


def _structured_answer(schema: dict[str, Any], completion: Completion, key: str) -> dict[str, Any]:
    """An actor's answer read against its ``output_schema``: the object and its JSON as
    the step's text, or the interruption :data:`INVALID_OUTPUT` saying what failed."""
    value, error = read_output(schema, completion.text, completion.structured)
    if value is None:
        phase, round_ = parse_step_key(key)
        return {
            "interrupted": INVALID_OUTPUT,
            "error": f"actor (round {round_}, {phase}): {error}",
        }
    # ``structured``: the text is the JSON of an answer read and checked against the schema
    return {"text": output_text(value), "structured": True}


#: A result's usage (and timing) fields: kept by a turn, and by a step that could not be stored.
_USAGE = (
    "input_tokens",
    "output_tokens",
    "cached_input_tokens",
    "cache_write_tokens",
    "usd",
    "calls",
    "started_at",
    "finished_at",
    "cached",
    "saved_usd",
)


def _unstorable(key: str, result: dict[str, Any], why: str) -> dict[str, Any]:
    """``result`` as a step failed for Redis's memory (:data:`REDIS_FULL`): no answer,
    ``why``, and the call's usage (it was made and is charged)."""
    kept = {name: result[name] for name in _USAGE if name in result}
    return {**_failure(key, REDIS_FULL, why, result.get("started_at") or time.time()), **kept}


def _size(result: dict[str, Any], conversation: tuple[str, str, int] | None) -> int:
    """About the bytes a step's store sends: its result, and its conversation turn."""
    return len(json.dumps(result, default=str)) + (len(conversation[1]) if conversation else 0)


def _completed_event(run_id: str, phase: str, round_: int, result: dict[str, Any]) -> str:
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


__all__ = [
    "clean_completion",
    "FanOut",
    "Handover",
    "HandoverMessage",
    "ModelClient",
    "Park",
    "RetryLater",
    "Seat",
    "StepContext",
    "StepObserver",
    "StepOutcome",
    "StepService",
]
