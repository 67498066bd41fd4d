"""The turns of agent runs that call tools, and the results of those calls, in Redis.

An agent run with tools is one step (``r1.critique``) made of turns: each turn a model
call, stored with the calls it asked for; each call's result stored once; a counter per
turn of the calls still without a result (:mod:`orchestration.state.keys` ``run_turns``).
The tool task that stores the last result hands the run to the next turn; the store is
what lets a redelivered turn or call repeat no model call and no call with effects.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestration.core.tools import ToolSpec
from orchestration.state import keys, replicas
from orchestration.state.scripts import ScriptCall, register


def turn_field(step_key: str, turn: int) -> str:
    """The field of turn ``turn`` (1-based) of step ``step_key``."""
    return f"{step_key}|t{turn}"


def call_ref(step_key: str, turn: int, index: int) -> str:
    """What a tool task's message names: call ``index`` of turn ``turn`` of the step."""
    return f"{step_key}|t{turn}|{index}"


def parse_call_ref(ref: str) -> tuple[str, int, int]:
    """Inverse of :func:`call_ref`; ValueError on anything else."""
    step, turn, index = ref.split("|")
    if not turn.startswith("t"):
        raise ValueError(f"not a tool call: {ref!r}")
    return step, int(turn[1:]), int(index)


@dataclass(frozen=True, slots=True)
class Turn:
    """One stored turn: the model's answer, the calls it asked for and their results so far."""

    number: int
    data: dict[str, Any]
    #: Call index -> stored result (``{"name", "result", "ok", "seconds"}``).
    results: dict[int, dict[str, Any]] = field(default_factory=dict)

    @property
    def calls(self) -> list[dict[str, Any]]:
        return list(self.data.get("tool_calls") or [])

    @property
    def missing(self) -> list[int]:
        """The indexes of calls without a result."""
        return [i for i in range(len(self.calls)) if i not in self.results]


class TurnStore:
    """Reads and writes turns and tool results; thread-safe (holds only the client)."""

    def __init__(self, client: Any) -> None:
        self.r = client
        self._store = register(client, "turn_store")
        self._start = register(client, "tool_start")
        self._finish = register(client, "tool_finish")

    def turns(self, run_id: str, step_key: str) -> list[Turn]:
        """The step's stored turns, oldest first, with their calls' results."""
        return _grouped(self.r.hgetall(keys.run_turns(run_id)), step_key).get(step_key, [])

    def all_turns(self, run_id: str) -> dict[str, list[Turn]]:
        """Every step's turns (``duet show``, result records), by step key: one read."""
        return _grouped(self.r.hgetall(keys.run_turns(run_id)))

    def frozen_tools(self, run_id: str, role: str) -> tuple[ToolSpec, ...] | None:
        """The tools listed from the role's MCP servers for this run; None: not yet."""
        raw = self.r.hget(keys.run_turns(run_id), f"{_FROZEN}{role}")
        return None if raw is None else _specs(raw)

    def freeze_tools(
        self, run_id: str, role: str, specs: Iterable[ToolSpec]
    ) -> tuple[ToolSpec, ...]:
        """Freeze ``specs`` as the role's MCP tools for this run, unless some were frozen
        first (a concurrent turn); the ones frozen."""
        key, name = keys.run_turns(run_id), f"{_FROZEN}{role}"
        text = json.dumps([s.model_dump(mode="json") for s in specs])
        pipe = self.r.pipeline(transaction=True)
        pipe.hsetnx(key, name, text)
        pipe.hget(key, name)
        return _specs(pipe.execute()[1])

    def store_turn(
        self,
        run_id: str,
        step_key: str,
        turn: int,
        data: Mapping[str, Any],
        claimant: str,
        events: Iterable[str] = (),
        *,
        before: Iterable[ScriptCall] = (),
    ) -> bool:
        """Store ``turn`` (its answer and tool calls) unless stored before, and let the
        step's claim go; ``before`` (the budget settlement) runs in the same round trip."""
        calls = len(data.get("tool_calls") or [])
        call = ScriptCall(
            self._store,
            [keys.run_turns(run_id), keys.step_claim(run_id, step_key), keys.run_events(run_id)],
            [turn_field(step_key, turn), json.dumps(dict(data)), calls, claimant, *events],
        )
        return bool(replicas.run_durable(self.r, [*before, call])[-1])

    def start_call(self, run_id: str, ref: str, claimant: str) -> tuple[str, str | None]:
        """Take call ``ref`` for ``claimant``: ``("go", None)``, ``("done", None)`` or
        ``("held", holder)``."""
        res = replicas.run_durable(
            self.r, [ScriptCall(self._start, [keys.run_turns(run_id)], [ref, claimant])]
        )[0]
        state = _s(res[0])
        return state, (_s(res[1]) if len(res) > 1 else None)

    def finish_call(
        self, run_id: str, ref: str, result: Mapping[str, Any], event: str, claimant: str = ""
    ) -> int:
        """Store call ``ref``'s result once; the calls of its turn still without one."""
        step, turn, _ = parse_call_ref(ref)
        call = ScriptCall(
            self._finish,
            [keys.run_turns(run_id), keys.run_events(run_id)],
            [ref, json.dumps(dict(result)), f"{turn_field(step, turn)}|left", event, claimant],
        )
        return int(replicas.run_durable(self.r, [call])[0])


def publish_tools(client: Any, specs: Mapping[str, ToolSpec]) -> None:
    """Say which tools this worker knows (a submit checks names against these)."""
    if specs:
        client.hset(keys.tools(), mapping={n: s.model_dump_json() for n, s in specs.items()})


def published_tools(client: Any, names: Iterable[str] | None = None) -> dict[str, ToolSpec]:
    """The tools some worker published, by name (only ``names`` when given)."""
    if names is None:
        found = client.hgetall(keys.tools())
        pairs = [(_s(k), v) for k, v in found.items()]
    else:
        wanted = list(dict.fromkeys(names))
        pairs = list(zip(wanted, client.hmget(keys.tools(), wanted) if wanted else [], strict=True))
    return {n: ToolSpec.model_validate_json(v) for n, v in pairs if v is not None}


#: Field prefix of the tools frozen for a run from a role's MCP servers (``mcp|critic``).
_FROZEN = "mcp|"


def _grouped(found: Mapping[Any, Any], only: str | None = None) -> dict[str, list[Turn]]:
    """The turns in a read of the hash (of step ``only``, when given), by step, oldest first."""
    turns: dict[str, dict[int, dict[str, Any]]] = {}
    results: dict[tuple[str, int], dict[int, dict[str, Any]]] = {}
    for raw_name, raw in found.items():
        name = _s(raw_name)
        if name.startswith(_FROZEN):
            continue
        step, _, rest = name.partition("|t")
        if not rest or (only is not None and step != only):
            continue
        parts = rest.split("|")
        if len(parts) == 1 and parts[0].isdigit():
            turns.setdefault(step, {})[int(parts[0])] = json.loads(raw)
        elif len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            results.setdefault((step, int(parts[0])), {})[int(parts[1])] = json.loads(raw)
    return {
        step: [Turn(n, stored[n], results.get((step, n), {})) for n in sorted(stored)]
        for step, stored in sorted(turns.items())
    }


def _specs(raw: Any) -> tuple[ToolSpec, ...]:
    return tuple(ToolSpec.model_validate(s) for s in json.loads(raw))


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


__all__ = [
    "Turn",
    "TurnStore",
    "call_ref",
    "parse_call_ref",
    "publish_tools",
    "published_tools",
    "turn_field",
]
