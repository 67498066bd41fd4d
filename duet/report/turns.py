"""The tool calls of a run's agents as its result record carries them, and as ``duet show``
and the HTML report read them: per agent run (step), each turn that asked for tools with its
calls, each result cut to a preview with its full size said. Pure: no I/O, no markup.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from orchestration.core.loop import ROLE_OF, parse_step_key

if TYPE_CHECKING:
    from orchestration.state.turns import Turn

#: Characters of a tool result, and of a call's arguments (as JSON), a record keeps; the
#: run's stored turns keep the whole result (``duet show RUN`` reads them).
RESULT_CHARS = 300
ARGUMENTS_CHARS = 400
#: Calls of one agent run a record lists; the rest are counted (``unlisted``).
CALLS_LISTED = 60

_PHASE_ORDER = {"generate": 0, "critique": 1, "refine": 2}


def tool_turns(by_step: Mapping[str, Sequence[Turn]]) -> list[dict[str, Any]]:
    """A run's stored turns (step key -> turns, as the turn store reads them) as a result
    record carries them: one entry per agent run that called tools, in the run's order."""
    steps = []
    for key, turns in by_step.items():
        try:
            phase, round_ = parse_step_key(key)
        except ValueError:
            continue  # not a step (nothing else is stored with turns today)
        if turns:
            steps.append((round_, _PHASE_ORDER[phase], key, ROLE_OF[phase], turns))
    return [_step(key, round_, role, turns) for round_, _, key, role, turns in sorted(steps)]


def _step(key: str, round_: int, role: str, turns: Sequence[Turn]) -> dict[str, Any]:
    listed, unlisted, shown = 0, 0, []
    for turn in turns:
        calls = []
        for i, call in enumerate(turn.calls):
            if listed >= CALLS_LISTED:
                unlisted += 1
                continue
            listed += 1
            calls.append(_call(call, turn.results.get(i)))
        shown.append({"turn": turn.number, "cached": bool(turn.data.get("cached")), "calls": calls})
    return {"step": key, "round": round_, "role": role, "turns": shown, "unlisted": unlisted}


def _call(call: Mapping[str, Any], done: Mapping[str, Any] | None) -> dict[str, Any]:
    """One call: its tool and arguments, and its result (None while it has none)."""
    args = json.dumps(call.get("arguments") or {}, ensure_ascii=False)
    text = None if done is None else str(done.get("result", ""))
    seconds = None if done is None else done.get("seconds")
    return {
        "name": str(call.get("name") or ""),
        "arguments": args[:ARGUMENTS_CHARS],
        "arguments_chars": len(args),
        "ok": None if done is None else bool(done.get("ok")),
        "result": None if text is None else text[:RESULT_CHARS],
        "result_chars": 0 if text is None else len(text),
        "cached": bool(done and done.get("cached")),
        "seconds": float(seconds) if isinstance(seconds, int | float) else None,
    }


def call_outcome(call: Mapping[str, Any], head: int) -> str:
    """How a recorded call ended, on one line: ``ok: <result's first characters>``,
    ``error: ...`` or ``running``, ``served from cache`` first for a cached result."""
    if call.get("ok") is None:
        return "running"
    text = " ".join(str(call.get("result") or "").split())[:head]
    outcome = f"{'ok' if call.get('ok') else 'error'}: {text}"
    return f"served from cache, {outcome}" if call.get("cached") else outcome


def step_turns(record_turns: Sequence[Mapping[str, Any]], step: str) -> list[Mapping[str, Any]]:
    """The recorded turns of one step (``r1.critique``); none when it called no tool."""
    return next((list(s["turns"]) for s in record_turns if s.get("step") == step), [])


__all__ = [
    "ARGUMENTS_CHARS",
    "CALLS_LISTED",
    "RESULT_CHARS",
    "call_outcome",
    "step_turns",
    "tool_turns",
]
