"""Run and batch state in Redis: records, step results, inputs, events, claims.

Every operation that must not half-happen is one Lua script (``lua/run_*.lua``,
``lua/step_*.lua``; one round trip, atomic); reads that go together are one pipeline.
The layout of keys is in :mod:`orchestration.state.keys`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestration.core import events as ev
from orchestration.core.architecture import LoopSpec, stored_spec
from orchestration.core.budget import ROLE_KINDS
from orchestration.core.errors import ConfigError, RunTimeout, SpecTampered
from orchestration.core.events import Event
from orchestration.core.loop import ROLE_OF, StepOutcome, parse_step_key, rerun_point, step_index
from orchestration.core.memory import CHARS_PER_TOKEN
from orchestration.core.results import (
    FINISHED_STATUSES,
    RunResult,
    build_result,
    kept,
    retried_usage,
    run_usage,
    step_usage,
)
from orchestration.core.usage import Usage
from orchestration.defaults import DEFAULT_FINISHED_TTL_S
from orchestration.state import keys, replicas, scripts
from orchestration.state.budgets import Spend
from orchestration.state.conversations import turn_prefix
from orchestration.state.events import event_json, stored_event
from orchestration.state.gates import GATE_FIELD
from orchestration.state.processes import alive, process_of
from orchestration.state.scripts import ScriptCall, run_scripts


@dataclass(frozen=True, slots=True)
class RunRecord:
    """The fields of a new run."""

    run_id: str
    spec_id: str
    prompt: str
    user_id: str | None = None
    batch_id: str | None = None
    input_id: str | None = None
    metadata: Mapping[str, Any] | None = None
    budget_scopes: tuple[str, ...] = ()
    #: The run's quoting token (see :mod:`orchestration.core.quoting`); drawn once, so a
    #: retried critique shows the critic the same prompt.
    boundary: str | None = None
    #: The batch's ``max_in_flight`` (see :mod:`orchestration.state.gates`); None: none.
    gate: int | None = None
    #: A ``RunResult`` (JSON) served from the cache: the run is written finished with it
    #: (:meth:`RunStore.finish_served`) and never sent to a worker.
    served: str | None = None


@dataclass(frozen=True, slots=True)
class StepStart:
    """What :meth:`RunStore.begin_step` found."""

    outcome: str  # go | done | busy | cancelled | stop | gone
    input: dict[str, Any] | None = None
    spec_id: str | None = None
    user_id: str | None = None
    #: Budget scopes the step's call is charged to.
    scopes: tuple[str, ...] = ()
    #: Seconds left of the fleet-wide pause of the step's model (0.0: none); None when
    #: it was not read (its key was among ``begin_step``'s ``known_pauses``).
    paused_s: float | None = 0.0
    #: The role's stored conversation turns (raw, oldest first); None when the step keeps
    #: no conversation.
    history: list[Any] | None = None
    #: The run's own conversation (scope ``run:<id>``): the earlier steps of the role, as
    #: ``(step key, input JSON, stored result JSON)`` ('' where none); None otherwise.
    own: list[tuple[str, str, str]] | None = None
    #: Whether any of ``scopes`` has a limit: the call then holds its worst case first;
    #: without one its usage is only counted, with its store (see ``complete_step``).
    limited: bool = True
    #: ``busy``: the claim found (whose process may be dead, see :meth:`RunStore.take_over`).
    holder: str | None = None


#: Fields of a stored step result kept in its compact outcome (see ``step_outcome``).
OUTCOME_FIELDS = (
    "interrupted",
    "score",
    "input_tokens",
    "output_tokens",
    "cached_input_tokens",
    "cache_write_tokens",
    "calls",
    "usd",
    "tool_calls",
)
#: The run-hash field holding the ``RunResult`` of a run served from the cache.
SERVED_FIELD = "served"
#: Prefix of the run-hash fields holding the compact outcome of each stored step.
OUTCOME_PREFIX = "o:"
#: Prefix of the run-hash fields holding each step's input (JSON: role, prompt, what its
#: begin script reads), written by the transition that makes the step.
INPUT_PREFIX = "in:"


#: Fields of a step result left out of the stored JSON when they hold these values, which
#: :func:`loaded_result` puts back: most calls use no prompt cache, answer in free text and
#: end whole. The step's ``key`` is left out too: it is the steps hash field's own name.
STORED_DEFAULTS: dict[str, Any] = {
    "cached_input_tokens": 0,
    "cache_write_tokens": 0,
    "structured": False,
    "interrupted": None,
}


def _default(field: str, value: Any) -> bool:
    if field not in STORED_DEFAULTS:
        return field == "key"
    default = STORED_DEFAULTS[field]
    return (
        value is default if default is None else type(value) is type(default) and value == default
    )


def stored_result(result: Mapping[str, Any]) -> str:
    """A step result as the steps hash stores it: compact JSON, without the fields
    :func:`loaded_result` puts back."""
    return json.dumps(
        {k: v for k, v in result.items() if not _default(k, v)}, separators=(",", ":")
    )


def loaded_result(key: str, raw: str) -> dict[str, Any]:
    """The step result stored as ``raw`` in field ``key`` of a steps hash, whole again."""
    return {"key": key, **STORED_DEFAULTS, **json.loads(raw)}


#: The outcome fields :func:`step_outcome` leaves out when they hold their default.
_OUTCOME_DEFAULTS = {f: STORED_DEFAULTS[f] for f in OUTCOME_FIELDS if f in STORED_DEFAULTS}


def loaded_outcome(raw: str) -> dict[str, Any]:
    """A step's outcome as :func:`step_outcome` stored it, with the fields it left out."""
    return {**_OUTCOME_DEFAULTS, **json.loads(raw)}


def step_outcome(result: Mapping[str, Any]) -> str:
    """The compact outcome of a step result: what the coordinator needs of every step
    (how it ended, the score, the usage), without its text, nor the fields that hold
    their :data:`STORED_DEFAULTS` (the coordinator reads each with that default)."""
    return json.dumps(
        {f: result[f] for f in OUTCOME_FIELDS if f in result and not _default(f, result[f])},
        separators=(",", ":"),
    )


@dataclass(frozen=True, slots=True)
class StaleRun:
    """An unfinished run that has not moved for a while, as :meth:`RunStore.stale_runs`
    found it."""

    run_id: str
    #: None: the record is gone (expired).
    status: str | None
    seq: int
    current_step: str | None
    #: The current step's result is stored.
    stored: bool
    #: The current step is claimed by a delivery that may be alive (its claim is being
    #: renewed, and its process is alive).
    claimed: bool
    batch_id: str | None


@dataclass(frozen=True, slots=True)
class RunView:
    """What the coordinator reads of a run for one transition (see ``load_for_transition``).

    ``steps`` maps *every* stored step key to its outcome fields; only the steps named in
    ``full`` carry their whole stored result (text, issues, error...).
    """

    run: dict[str, str]
    steps: dict[str, dict[str, Any]]
    #: Steps read whole whose outcome the record does not hold yet (the next transition
    #: writes it: ``record_step(outcomes=...)``).
    unnoted: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Outgoing:
    """A broker message to push with a state change, in its script: ``text`` onto list
    ``queue`` (the queue's key, ``keys.queue_key``) of the same Redis (the worker builds it; the store never reads it). The
    change and the message are one: no crash between them can lose the message."""

    queue: str
    text: str


@dataclass(frozen=True, slots=True)
class Once:
    """An event a transition emits only if it is the first to set a flag (field ``field``
    of hash ``key``), in the same script that records the transition: a transition that
    loses its compare-and-set, or never runs, neither emits it nor uses it up."""

    event: str
    key: str
    field: str


def _renews_conversation(step_key: str) -> bool:
    """Whether storing ``step_key`` renews its conversation's TTL: a run's first turns
    (round 0 and 1) do, later ones leave it (one command less a call); a new list always
    gets it."""
    try:
        return parse_step_key(step_key)[1] <= 1
    except ValueError:  # not a loop step's key: renew
        return True


def _reopen_keys(run_id: str, batch_id: str | None) -> list[str]:
    """The keys of the scripts that re-open a finished run: its record, its batch's ('' for
    none), its events, the open-runs index, then the run's other keys (steps first)."""
    return [
        keys.run(run_id),
        keys.batch(batch_id) if batch_id else "",
        keys.run_events(run_id),
        keys.open_runs(),
        *keys.run_keys(run_id)[1:],
    ]


def served_result(run: Mapping[str, str], events: list[Event]) -> RunResult:
    """The result of a run served from the cache: the kept one, with this run's identity,
    times and events, marked ``cached``."""
    kept_result = RunResult.model_validate_json(run[SERVED_FIELD])
    return kept_result.model_copy(
        update={
            "run_id": run["run_id"],
            "input_id": run.get("input_id"),
            "batch_id": run.get("batch_id"),
            "user_id": run.get("user_id"),
            "metadata": json.loads(run["metadata"]) if run.get("metadata") else {},
            "created_at": float(run["created_at"]) if run.get("created_at") else None,
            "started_at": float(run["started_at"]) if run.get("started_at") else None,
            "finished_at": float(run["finished_at"]) if run.get("finished_at") else None,
            "events": events,
            "cached": True,
        }
    )


class RunStore:
    """Reads and writes runs and batches. Thread-safe: it holds only a pooled client."""

    def __init__(self, client: Any, *, finished_ttl_s: int = DEFAULT_FINISHED_TTL_S):
        # ``client`` decodes responses to str (see connection.get_redis), which redis-py's
        # annotations cannot express, hence Any.
        self.r = client
        self.finished_ttl_s = finished_ttl_s
        self._transition = scripts.register(client, "run_transition")
        self._begin = scripts.register(client, "step_begin")
        self._complete = scripts.register(client, "step_complete")
        self._reopen = scripts.register(client, "run_reopen")
        self._rerun = scripts.register(client, "run_rerun")
        self._renew = scripts.register(client, "step_renew")
        self._take_over = scripts.register(client, "step_takeover")
        self._specs: dict[str, LoopSpec] = {}

    # --- specs ------------------------------------------------------------
    def save_spec(self, spec: LoopSpec, pipe: Any = None) -> str:
        spec_id = spec.spec_id
        (pipe or self.r).set(keys.spec(spec_id), spec.model_dump_json(), ex=self.finished_ttl_s * 2)
        self._specs[spec_id] = spec
        return spec_id

    def load_spec(self, spec_id: str) -> LoopSpec:
        """A spec by id, checked against its content hash; cached for the life of the
        process, as specs never change.

        Raises:
            SpecTampered: the stored JSON does not hash to ``spec_id``.
            ConfigError: it is no valid spec (the message quotes none of its values).
        """
        spec = self._specs.get(spec_id)
        if spec is None:
            raw = self.r.get(keys.spec(spec_id))
            if raw is None:
                raise LookupError(f"loop spec {spec_id} not found in Redis (expired?)")
            spec = self._specs[spec_id] = stored_spec(spec_id, raw)
        return spec

    # --- creating runs ----------------------------------------------------
    def create_runs(self, records: Iterable[RunRecord], pipe: Any) -> None:
        """Queue the writes of new runs on ``pipe`` (the caller executes it)."""
        now = repr(time.time())
        for rec in records:
            fields = {
                "run_id": rec.run_id,
                "spec_id": rec.spec_id,
                "prompt": rec.prompt,
                "status": "queued",
                "seq": 0,
                "created_at": now,
            }
            if rec.user_id:
                fields["user_id"] = rec.user_id
            if rec.batch_id:
                fields["batch_id"] = rec.batch_id
            if rec.input_id is not None:
                fields["input_id"] = rec.input_id
            if rec.metadata:
                fields["metadata"] = json.dumps(rec.metadata)
            if rec.budget_scopes:
                fields["budget_scopes"] = ",".join(rec.budget_scopes)
            if rec.boundary:
                fields["boundary"] = rec.boundary
            if rec.gate:
                fields[GATE_FIELD] = rec.gate
            if rec.served is not None:
                fields[SERVED_FIELD] = rec.served
            pipe.hset(keys.run(rec.run_id), mapping=fields)
            pipe.zadd(keys.runs_moved(), {rec.run_id: float(now)})
            pipe.xadd(keys.run_events(rec.run_id), {"e": event_json(ev.RUN_QUEUED, rec.run_id)})
            pipe.zadd(keys.open_runs(), {rec.run_id: float(now)})

    # --- the coordinator's side ------------------------------------------
    def load_run(self, run_id: str) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
        """The run record and its stored step results, in one round trip."""
        pipe = self.r.pipeline(transaction=False)
        pipe.hgetall(keys.run(run_id))
        pipe.hgetall(keys.run_steps(run_id))
        run, steps = pipe.execute()
        return run, {k: loaded_result(k, v) for k, v in steps.items()}

    def load_for_transition(self, run_id: str, full: tuple[str, ...]) -> RunView:
        """The run record, every stored step's outcome, and the whole results of the
        steps named in ``full``: one round trip, whatever the size of the texts.

        Outcomes come from the run's ``o:<step key>`` fields, which each transition writes
        for the step before it (see :meth:`record_step`), and from the whole results read.
        A run whose steps so found do not number its transitions (cancelled mid-step, or a
        redelivered message) is read whole instead.
        """
        pipe = self.r.pipeline(transaction=False)
        pipe.hgetall(keys.run(run_id))
        if full:
            pipe.hmget(keys.run_steps(run_id), full)
        got = pipe.execute()
        run: dict[str, str] = got[0]
        steps: dict[str, dict[str, Any]] = {}
        for field in [f for f in run if f.startswith((OUTCOME_PREFIX, INPUT_PREFIX))]:
            value = run.pop(field)
            if field.startswith(OUTCOME_PREFIX):
                steps[field[len(OUTCOME_PREFIX) :]] = loaded_outcome(value)
        noted = set(steps)
        if full:
            for key, raw in zip(full, got[1], strict=True):
                if raw is not None:
                    steps[key] = loaded_result(key, raw)
        if run and len(steps) != int(run.get("seq", 0)):
            _, every = self.load_run(run_id)
            return RunView(run, every, tuple(k for k in every if k not in noted))
        return RunView(run, steps, tuple(k for k in full if k in steps and k not in noted))

    def step_result(self, run_id: str, step_key: str) -> dict[str, Any] | None:
        """One stored step result, or None."""
        raw = self.r.hget(keys.run_steps(run_id), step_key)
        return None if raw is None else loaded_result(step_key, raw)

    def record_step(
        self,
        run: Mapping[str, str],
        seq: int,
        step_key: str,
        step_input: Mapping[str, Any],
        events: Sequence[str | Once],
        outcomes: Mapping[str, Mapping[str, Any]] | None = None,
        send: Outgoing | None = None,
    ) -> int:
        """Make transition ``seq`` create ``step_key``; 1 if made, <= 0 if not (see script).
        ``send`` (the step's message) is pushed by the script that makes the transition,
        and only by it.

        ``events`` are emitted with it, in order; a :class:`Once` only if this transition
        is the one that sets its flag. ``outcomes``: stored step results whose compact
        outcome the record gets with it (``o:<step key>``, what later transitions read
        instead of the step's text).
        """
        args = [
            "step",
            repr(time.time()),
            step_key,
            json.dumps(step_input),
            send.text if send else "",
        ]
        fields = {OUTCOME_PREFIX + k: step_outcome(v) for k, v in (outcomes or {}).items()}
        return self._run_transition(
            run, seq, args, events, record=fields, queue=send.queue if send else ""
        )

    def record_finish(
        self,
        run: Mapping[str, str],
        seq: int,
        status: str,
        *,
        reason: str | None,
        error: str | None,
        usage: Mapping[str, Any],
        events: Sequence[str | Once],
        forget: Sequence[str] = (),
        outcomes: Iterable[str] = (),
    ) -> int:
        """Make transition ``seq`` finish the run; 1 if made, <= 0 if not. ``events`` as
        for :meth:`record_step`; the keys in ``forget`` (what nothing reads once the run is
        over) are deleted with it instead of kept for the finished-run TTL, and so are the
        compact outcomes and the inputs of the steps named in ``outcomes`` (the record's
        ``o:<step key>`` and ``in:<step key>`` fields, read only while the run moves; a run
        that may be resumed keeps them)."""
        return self._run_transition(
            run,
            seq,
            [
                "finish",
                repr(time.time()),
                status,
                reason or "",
                error or "",
                json.dumps(usage),
                str(self.finished_ttl_s),
                run["run_id"],
            ],
            events,
            forget,
            [f"{prefix}{key}" for key in outcomes for prefix in (OUTCOME_PREFIX, INPUT_PREFIX)],
        )

    def _run_transition(
        self,
        run: Mapping[str, str],
        seq: int,
        args: list[str],
        events: Sequence[str | Once],
        forget: Sequence[str] = (),
        drop: Sequence[str] = (),
        record: Mapping[str, str] | None = None,
        queue: str = "",
    ) -> int:
        call = self._transition_call(run, seq, args, events, forget, drop, record, queue)
        return int(replicas.run_durable(self.r, [call])[0])

    def _transition_call(
        self,
        run: Mapping[str, str],
        seq: int,
        args: list[str],
        events: Sequence[str | Once],
        forget: Sequence[str] = (),
        drop: Sequence[str] = (),
        record: Mapping[str, str] | None = None,
        queue: str = "",
    ) -> ScriptCall:
        run_id = run["run_id"]
        batch_id = run.get("batch_id")
        once = [(n, e) for n, e in enumerate(events, 1) if isinstance(e, Once)]
        # A finish gives the run's keys, and its own budget scope's, the finished TTL; the
        # batch's keys (and its budget scope's) get it with the batch's last run.
        finish = args[0] == "finish"
        scopes = run.get("budget_scopes", "").split(",")
        batch_keys: tuple[str, ...] = ("",) * 6
        if finish and batch_id:
            batch_scope = f"batch:{batch_id}"
            batch_keys = (
                keys.batch_runs(batch_id),
                keys.batch_rejected(batch_id),
                *(keys.budget_keys(batch_scope) if batch_scope in scopes else ("", "", "")),
                # The run's place under max_in_flight, given back with the finish.
                keys.batch_gate(batch_id) if run.get(GATE_FIELD) else "",
            )
        run_scope = f"run:{run_id}"
        agent_scopes = [f"{kind}:{run_id}" for kind in ROLE_KINDS]
        script_keys = [
            keys.run(run_id),
            queue,
            keys.run_events(run_id),
            keys.batch(batch_id) if batch_id else "",
            keys.batch_events(batch_id) if batch_id else "",
            keys.open_runs(),
            keys.runs_moved(),
            *batch_keys,
            *keys.run_keys(run_id),
            *(keys.budget_keys(run_scope) if finish and run_scope in scopes else ()),
            # ...and its agents' own scopes (``actor:<run id>``, ``critic:<run id>``)
            *(k for s in agent_scopes if finish and s in scopes for k in keys.budget_keys(s)),
            *forget,
            *(e.key for _, e in once),
        ]
        while len(args) < 8:
            args.append("")
        flags = json.dumps([[n, e.field] for n, e in once])
        texts = [e.event if isinstance(e, Once) else e for e in events]
        return ScriptCall(
            self._transition,
            script_keys,
            [
                seq,
                *args,
                flags,
                len(forget),
                json.dumps(dict(record) if record else list(drop)),
                *texts,
            ],
        )

    def finish_served(self, records: Sequence[RunRecord]) -> None:
        """Finish runs just created with a ``served`` result, in one round trip: each by
        the finish transition a worker's would make (batch counters, ``done``, its status
        count, the batch's finished stream), billing the served usage (nothing)."""
        now = repr(time.time())
        calls = []
        for rec in records:
            assert rec.served is not None
            served = RunResult.model_validate_json(rec.served)
            run = {"run_id": rec.run_id, "budget_scopes": ",".join(rec.budget_scopes)}
            if rec.batch_id:
                run["batch_id"] = rec.batch_id
            usage = served.usage.total.model_dump()
            events = [
                event_json(
                    ev.RUN_FINISHED,
                    rec.run_id,
                    len(served.rounds),
                    status=served.status,
                    reason=None,
                    score=served.final_score,
                    cached=True,
                )
            ]
            args = ["finish", now, str(served.status), "", "", json.dumps(usage)]
            calls.append(
                self._transition_call(run, 0, [*args, str(self.finished_ttl_s), rec.run_id], events)
            )
        if calls:
            replicas.run_durable(self.r, calls)

    def fail_run(self, run_id: str, error: str) -> bool:
        """End a run as ``failed`` whatever transition it is at (a bug, not a decision);
        True if this call ended it."""
        run, steps = self.load_run(run_id)
        if not run or run.get("status") in FINISHED_STATUSES:
            return False
        made = self.record_finish(
            run,
            int(run.get("seq", 0)),
            "failed",
            reason="coordinator:error",
            error=error,
            usage=run_usage(steps),
            events=[
                event_json(ev.RUN_FINISHED, run_id, status="failed", reason="coordinator:error")
            ],
        )
        return made == 1

    # --- the step's side --------------------------------------------------
    def begin_step(
        self,
        run_id: str,
        step_key: str,
        claimant: str,
        lease_s: int,
        started_event: str,
        previous: str = "",
        earlier: Sequence[str] = (),
        known_pauses: Sequence[str] = (),
    ) -> StepStart:
        """Take the step for delivery ``claimant`` (new for each delivery) for ``lease_s``
        seconds; ``previous`` is the claim the delivery that re-scheduled this one held
        (taken over at once). Another live claim makes the outcome ``busy``. ``earlier``:
        the run's earlier steps of the role (read when the conversation is the run's own).
        ``known_pauses``: pause keys the caller knows lately; when the step's is one of
        them it is not read (``paused_s`` None)."""
        # Durable: a claim a failover lost would let a redelivered step call the model again.
        res = replicas.run_durable(
            self.r,
            [
                ScriptCall(
                    self._begin,
                    [
                        keys.run(run_id),
                        keys.run_inputs(run_id),
                        keys.run_steps(run_id),
                        keys.step_claim(run_id, step_key),
                        keys.run_events(run_id),
                    ],
                    [
                        step_key,
                        claimant,
                        lease_s,
                        started_event,
                        previous,
                        len(known_pauses),
                        *known_pauses,
                        *earlier,
                    ],
                )
            ],
        )[0]
        if res[0] != "go":
            return StepStart(res[0], holder=res[1] if len(res) > 1 else None)
        scopes = tuple(s for s in res[4].split(",") if s) if res[4] else ()
        paused = None if res[5] is None else max(res[5], 0) / 1000
        history = own = None
        if len(res) > 7 and res[7] == "h":
            history = res[8:]
        elif len(res) > 7:
            own = [(res[i], res[i + 1], res[i + 2]) for i in range(8, len(res), 3)]
        return StepStart(
            "go",
            json.loads(res[1]),
            res[2],
            res[3] or None,
            scopes,
            paused,
            history,
            own=own,
            limited=bool(res[6]),
        )

    def take_over(
        self,
        run_id: str,
        step_key: str,
        holder: str,
        claimant: str,
        lease_s: int,
        process_ttl_s: float,
    ) -> bool:
        """Give the step's claim to ``claimant`` if it is still ``holder``'s and names a
        process that is dead: its liveness key gone while the fleet's have been renewed
        without a break for ``process_ttl_s`` (atomically). False: the holder is alive,
        names no process, Redis was away lately, or the claim changed meanwhile."""
        process_id = process_of(holder)
        if process_id is None:
            return False
        return bool(
            self._take_over(
                keys=[
                    keys.step_claim(run_id, step_key),
                    keys.process(process_id),
                    keys.processes_since(),
                ],
                args=[holder, claimant, lease_s, max(1, int(process_ttl_s * 1000))],
            )
        )

    def complete_step(
        self,
        run_id: str,
        step_key: str,
        result: Mapping[str, Any],
        completed_event: str,
        claimant: str,
        *,
        conversation: tuple[str, str, int] | None = None,
        conversation_max_tokens: int | None = None,
        before: Iterable[ScriptCall] = (),
        spend: Spend | None = None,
        send: Outgoing | None = None,
    ) -> bool:
        """Store the step's result unless one is stored already; True if this one was.
        ``send`` (the coordinator's message) is pushed in the same script either way.

        ``conversation`` is ``(key, turn, turns kept)``: the turn is appended to that
        conversation when, and only when, this result is the one stored. Past about
        ``conversation_max_tokens`` the oldest turns of other runs are dropped down to
        half of it (see the script). ``before`` are other scripts to run first in the
        same round trip (e.g. the budget settlement). ``spend`` (budget scopes without
        limits) is added to those scopes' spent counters in the same script, once per
        delivery: a store sent again after a lost reply does not add it twice.
        """
        conv_key, turn, turns = conversation or ("", "", 0)
        max_chars = (
            "" if conversation_max_tokens is None else conversation_max_tokens * CHARS_PER_TOKEN
        )
        call = ScriptCall(
            self._complete,
            [
                keys.run_steps(run_id),
                keys.step_claim(run_id, step_key),
                keys.run_events(run_id),
                send.queue if send else "",
                conv_key,
                *(spend.keys if spend else ()),
            ],
            [
                step_key,
                stored_result(result),
                completed_event,
                claimant,
                send.text if send else "",
                turn,
                turns,
                "1" if _renews_conversation(step_key) else "",
                max_chars,
                turn_prefix(run_id),
                spend.amount if spend else "",
                self.finished_ttl_s,
            ],
        )
        return bool(replicas.run_durable(self.r, [*before, call])[-1])

    def renew_claims(self, claims: Iterable[tuple[str, str, str]], lease_s: int) -> None:
        """Renew the claims ``(run id, step key, claimant)`` still held by their claimant
        for another ``lease_s`` seconds (one round trip; a claim lost meanwhile is left)."""
        calls = [
            ScriptCall(self._renew, [keys.step_claim(run_id, key)], [claimant, lease_s])
            for run_id, key, claimant in claims
        ]
        if calls:
            run_scripts(self.r, calls)

    # --- the sweeper's side -------------------------------------------------
    def stale_runs(self, moved_before: float, limit: int) -> list[StaleRun]:
        """Up to ``limit`` unfinished runs that have not moved since ``moved_before``
        (``time.time()``), with what the sweeper needs to decide about each.

        A transition notes when the run moved in its record (``moved_at``), not in the
        index: a run the index holds as older but whose record says it moved since is
        given its real time in the index here (so the next look skips it) and left out.
        """
        ids: list[str] = self.r.zrangebyscore(
            keys.runs_moved(), "-inf", moved_before, start=0, num=limit
        )
        if not ids:
            return []
        pipe = self.r.pipeline(transaction=False)
        for run_id in ids:
            pipe.hmget(keys.run(run_id), "status", "seq", "current_step", "batch_id", "moved_at")
        records = pipe.execute()
        moved = {
            run_id: float(rec[4])
            for run_id, rec in zip(ids, records, strict=True)
            if rec[4] is not None and float(rec[4]) > moved_before
        }
        if moved:
            # XX: a run finished meanwhile (and so dropped from the index) stays out.
            pipe.zadd(keys.runs_moved(), moved, xx=True)
        stale = [(r, rec) for r, rec in zip(ids, records, strict=True) if r not in moved]
        for run_id, (_, _, current, _, _) in stale:
            pipe.hexists(keys.run_steps(run_id), current or "")
            pipe.get(keys.step_claim(run_id, current or ""))
        found = pipe.execute()[1 if moved else 0 :]
        # A claim whose process is dead is no live call (the step is taken over at once).
        holders = [h for h in found[1::2] if h]
        live = dict(zip(holders, alive(self.r, holders), strict=True))
        return [
            StaleRun(
                run_id,
                status,
                int(seq or 0),
                current or None,
                bool(found[2 * n]),
                bool(found[2 * n + 1]) and live[found[2 * n + 1]],
                batch or None,
            )
            for n, (run_id, (status, seq, current, batch, _)) in enumerate(stale)
        ]

    def claimed_by(self, process_ids: Iterable[str], chunk: int = 500) -> list[StaleRun]:
        """The unfinished runs whose current step is claimed by one of ``process_ids``
        (dead processes: the steps to send again at once) and not stored yet. Reads the
        whole index of unfinished runs, ``chunk`` at a time: a death is rare."""
        dead = set(process_ids)
        found: list[StaleRun] = []
        start = 0
        while True:
            ids: list[str] = self.r.zrange(keys.runs_moved(), start, start + chunk - 1)
            if not ids:
                return found
            start += chunk
            pipe = self.r.pipeline(transaction=False)
            for run_id in ids:
                pipe.hmget(keys.run(run_id), "status", "seq", "current_step", "batch_id")
            records = pipe.execute()
            for run_id, (_, _, current, _) in zip(ids, records, strict=True):
                pipe.get(keys.step_claim(run_id, current or ""))
                pipe.hexists(keys.run_steps(run_id), current or "")
            claims = pipe.execute()
            for n, (run_id, (status, seq, current, batch)) in enumerate(
                zip(ids, records, strict=True)
            ):
                claim, stored = claims[2 * n], claims[2 * n + 1]
                if current and claim and not stored and process_of(claim) in dead:
                    found.append(
                        StaleRun(run_id, status, int(seq or 0), current, False, False, batch)
                    )

    def touch(self, run_id: str, at: float | None = None) -> None:
        """Note that the run moved now (or at ``at``): the sweep leaves it alone a while."""
        self.r.zadd(keys.runs_moved(), {run_id: time.time() if at is None else at})

    def seqs(self, run_ids: list[str]) -> list[int]:
        """Each run's next transition (``seq``; 0 for a gone run), in one round trip: what
        a run handed a batch place is sent (0 unless ``resume`` re-opened it)."""
        pipe = self.r.pipeline(transaction=False)
        for run_id in run_ids:
            pipe.hget(keys.run(run_id), "seq")
        return [int(seq or 0) for seq in pipe.execute()] if run_ids else []

    def forget(self, run_id: str) -> None:
        """Drop a finished or vanished run from the index of unfinished runs."""
        self.r.zrem(keys.runs_moved(), run_id)

    def prompts(self, run_ids: list[str]) -> list[str | None]:
        """Each run's input prompt (None when the run is gone), in one round trip."""
        pipe = self.r.pipeline(transaction=False)
        for run_id in run_ids:
            pipe.hget(keys.run(run_id), "prompt")
        return list(pipe.execute())

    def batch_of(self, run_id: str) -> str | None:
        """The id of the batch run ``run_id`` belongs to, if any."""
        batch: str | None = self.r.hget(keys.run(run_id), "batch_id") or None
        return batch

    def add_event(self, run_id: str, event: str) -> None:
        """Append one event (see :func:`orchestration.state.events.event_json`) to the run."""
        self.r.xadd(keys.run_events(run_id), {"e": event})

    # --- reading ------------------------------------------------------------
    def status(self, run_id: str) -> str | None:
        status: str | None = self.r.hget(keys.run(run_id), "status")
        return status

    def cancel_run(self, run_id: str) -> bool:
        """Flag a run cancelled; the next transition finishes it. False if already finished."""
        status = self.r.hget(keys.run(run_id), "status")
        if status is None or status in FINISHED_STATUSES:
            return False
        self.r.hset(keys.run(run_id), "cancelled", "1")
        return True

    def resume_point(self, run_id: str) -> tuple[str, int, str | None]:
        """Where an unfinished run stands, re-opening it first if it was cancelled.

        Returns ``(what, seq, step_key)``: ``coordinate`` (send transition ``seq``),
        ``step`` (re-send ``step_key``, whose result is not stored), or ``finished`` /
        ``gone`` (nothing to do).
        """
        run = self.r.hmget(keys.run(run_id), "batch_id")
        batch_id = run[0]
        res = self._reopen(
            keys=_reopen_keys(run_id, batch_id), args=[event_json(ev.RUN_RESUMED, run_id)]
        )
        what = res[0]
        if what not in ("queued", "running"):
            return what, 0, None
        self.touch(run_id)
        seq, current = int(res[1]), res[2] or None
        if current and not self.r.hexists(keys.run_steps(run_id), current):
            return "step", seq, current
        return "coordinate", seq, None

    def rerun_point(self, run_id: str) -> tuple[str, int]:
        """Re-open an ``interrupted`` run where it stopped (see :func:`loop.rerun_point`).

        Returns ``("running", seq)`` (send transition ``seq``) or ``("finished" | "gone",
        0)``: not interrupted (any more), or expired. The step dropped keeps counting in the
        run's usage (record field ``retried``), so a batch's spend never goes down.
        """
        pipe = self.r.pipeline(transaction=False)
        pipe.hmget(keys.run(run_id), "status", "seq", "batch_id", "retried")
        pipe.hgetall(keys.run_steps(run_id))
        (status, seq, batch_id, retried), raw = pipe.execute()
        if status is None:
            return "gone", 0
        if status != "interrupted":
            return "finished", 0
        steps = {k: loaded_result(k, v) for k, v in raw.items()}
        order = sorted(steps, key=lambda k: step_index(*parse_step_key(k)))
        outs = tuple(
            StepOutcome(*parse_step_key(k), interrupted=steps[k].get("interrupted")) for k in order
        )
        again, drop = rerun_point(outs)
        carried = retried_usage({"retried": retried or ""})
        if drop is not None:
            role = ROLE_OF[parse_step_key(drop)[0]]
            carried[role] = carried.get(role, Usage()) + step_usage(steps[drop])
        if drop is not None:  # its turns go with it: the agent run starts again
            stale = [
                f for f in self.r.hkeys(keys.run_turns(run_id)) if _s(f).startswith(f"{drop}|")
            ]
            if stale:
                self.r.hdel(keys.run_turns(run_id), *stale)
        # Durable: a re-open a failover lost would leave the run interrupted after all.
        call = ScriptCall(
            self._rerun,
            _reopen_keys(run_id, batch_id),
            [
                seq,
                again,
                drop or "",
                json.dumps({role: used.model_dump() for role, used in carried.items()}),
                event_json(ev.RUN_RESUMED, run_id),
            ],
        )
        res = replicas.run_durable(self.r, [call])[0]
        if res[0] != "running":
            return "finished", 0
        self.touch(run_id)
        return "running", int(res[1])

    def events(self, run_id: str, after: str = "-") -> list[tuple[str, Event]]:
        raw = self.r.xrange(keys.run_events(run_id), min=after)
        return [(eid, stored_event(f["e"], run_id, eid)) for eid, f in raw]

    def follow_events(
        self, run_id: str, *, timeout_s: float | None = None, block_ms: int = 5000
    ) -> Iterator[Event]:
        """Yield the run's events as they come, until ``run.finished`` (or the timeout)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        last = "0-0"
        stream = keys.run_events(run_id)
        while True:
            wait = block_ms
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RunTimeout(f"run {run_id} did not finish within {timeout_s:g}s")
                wait = max(1, min(block_ms, int(left * 1000)))
            got = self.r.xread({stream: last}, block=wait, count=500)
            for _, entries in got or ():
                for eid, fields in entries:
                    last = eid
                    event = stored_event(fields["e"], run_id, eid)
                    yield event
                    # A resumed run has an earlier run.finished: only the last one ends it.
                    if event.type == ev.RUN_FINISHED and self.status(run_id) in FINISHED_STATUSES:
                        return
            if not got and not self.r.exists(keys.run(run_id)):
                raise LookupError(f"run {run_id} not found (expired or never submitted)")

    def result(self, run_id: str) -> RunResult:
        """The run's result, its ``output`` the revision its loop keeps (``keep``)."""
        pipe = self.r.pipeline(transaction=False)
        pipe.hgetall(keys.run(run_id))
        pipe.hgetall(keys.run_steps(run_id))
        pipe.xrange(keys.run_events(run_id))
        run, steps, events = pipe.execute()
        if not run:
            raise LookupError(f"run {run_id} not found (expired or never submitted)")
        if SERVED_FIELD in run:
            return served_result(run, [stored_event(f["e"], run_id, eid) for eid, f in events])
        result = build_result(
            run,
            {k: loaded_result(k, v) for k, v in steps.items()},
            [stored_event(f["e"], run_id, eid) for eid, f in events],
        )
        return kept(result, self._keep_of(run.get("spec_id", "")))

    def _keep_of(self, spec_id: str) -> str:
        """The ``keep`` setting of a spec. A spec outlives its runs (it is stored for twice
        their TTL at each submit); one gone, or one that fails its checks (rewritten in
        Redis: the run failed for it), leaves the run's result as stored."""
        try:
            return self.load_spec(spec_id).keep
        except (LookupError, SpecTampered, ConfigError):
            return "last"


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
