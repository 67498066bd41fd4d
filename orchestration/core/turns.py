"""An agent run's turns: what follows a turn, and the messages of earlier turns. Pure.

An agent with tools may take several turns per agent run: each turn a model call, the
tool calls it asks for run between turns. ``after_turn`` says what follows one, the way
``loop.decide`` says what follows a step.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from orchestration.core.tools import fence

#: What follows a turn: its tool calls run (then another turn), it is the agent's answer,
#: or it asked for tools on its last allowed turn (the agent is interrupted).
Next = Literal["tools", "answer", "max_turns"]
#: The interruption of an agent that ran out of turns.
MAX_TURNS = "max_turns"
#: Usage fields a step's result sums over its turns.
USAGE_FIELDS = ("input_tokens", "output_tokens", "cached_input_tokens", "cache_write_tokens")


def after_turn(turn: int, max_turns: int, tool_calls: int, interrupted: str | None) -> Next:
    """What follows turn ``turn`` (1-based) of an agent allowed ``max_turns``, whose answer
    asked for ``tool_calls`` calls (an interrupted answer ends the agent run as it is)."""
    if interrupted is not None or tool_calls == 0:
        return "answer"
    return "tools" if turn < max_turns else "max_turns"


@dataclass(frozen=True, slots=True)
class TurnView:
    """An earlier turn as the next model call needs it: its text, its calls and results."""

    text: str
    calls: Sequence[Mapping[str, Any]]
    #: Call index -> stored result (``result`` text and ``ok``).
    results: Mapping[int, Mapping[str, Any]]


def turn_messages(turns: Iterable[TurnView], boundary: str | None) -> list[dict[str, Any]]:
    """The messages of earlier turns, vendor-neutral: the assistant's answer with its tool
    calls, then one ``tool`` message per call, its result fenced as data."""
    messages: list[dict[str, Any]] = []
    for turn in turns:
        messages.append(
            {
                "role": "assistant",
                "content": turn.text,
                "tool_calls": [
                    {"id": c["id"], "name": c["name"], "arguments": c.get("arguments") or {}}
                    for c in turn.calls
                ],
            }
        )
        for i, call in enumerate(turn.calls):
            done = turn.results.get(i) or {}
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": call["id"],
                    "name": call["name"],
                    "content": fence(call["name"], str(done.get("result", "")), boundary),
                    "is_error": not done.get("ok", False),
                }
            )
    return messages


def summed(result: dict[str, Any], earlier: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """``result`` (the last turn's) with the usage of the ``earlier`` turns added and the
    number of turns (``turns``): a step's result counts its whole agent run."""
    earlier = list(earlier)
    out = dict(result)
    for name in USAGE_FIELDS:
        out[name] = int(out.get(name) or 0) + sum(int(t.get(name) or 0) for t in earlier)
    out["usd"] = float(out.get("usd") or 0.0) + sum(float(t.get("usd") or 0.0) for t in earlier)
    out["calls"] = int(out.get("calls") or 0) + sum(int(t.get("calls") or 0) for t in earlier)
    cached = [t for t in (*earlier, result) if t.get("cached")]
    if cached:  # turns served from the model-call cache, and what they would have cost
        out["cached_calls"] = len(cached)
        out["saved_usd"] = sum(float(t.get("saved_usd") or 0.0) for t in cached)
    out["turns"] = len(earlier) + 1
    out["tool_calls"] = sum(len(t.get("tool_calls") or []) for t in earlier)
    return out


__all__ = ["MAX_TURNS", "Next", "TurnView", "after_turn", "summed", "turn_messages"]
