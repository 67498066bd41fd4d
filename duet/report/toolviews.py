"""The tool calls of the HTML report, shaped for its templates: per input, one folded block
per round with the actor's and critic's turns (:func:`round_views`); across the batch, the
calls by tool (:func:`tool_rows`). Pure, no markup; a record's odd shapes are skipped.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from orchestration.core.loop import ROLE_OF, parse_step_key

#: Rows of the batch's table of tools, most calls first; the rest are summed in one row.
TOOL_ROWS = 30
#: Tool calls one page lists, worst input first (about 0.5 kB each): a round past them shows
#: its counts only, so a big batch of agents with tools still makes a page a browser opens.
PAGE_CALLS = 5_000
#: The tool of the calls a record counts without listing them (past its list's length).
NOT_LISTED = "(not listed)"


class CallBudget:
    """The tool calls a page may still list, spent round by round as inputs are shaped."""

    def __init__(self, calls: int | None = None) -> None:
        self.left = PAGE_CALLS if calls is None else calls

    def take(self, calls: int) -> bool:
        """Whether ``calls`` more may be listed (and if so, count them as listed)."""
        if calls > self.left:
            self.left = 0  # later (better) inputs do not jump ahead of this one
            return False
        self.left -= calls
        return True


@dataclass(frozen=True)
class CallView:
    """One tool call as the page shows it: tool, arguments, how it ended, its result."""

    name: str
    arguments: str
    arguments_cut: int
    #: ``ok``, ``error`` or ``running`` (no result stored): a CSS class, never record text.
    state: str
    result: str
    result_cut: int
    result_chars: int
    cached: bool
    #: Seconds the tool ran (None: no result yet).
    seconds: float | None


@dataclass(frozen=True)
class TurnView:
    """One turn that asked for tools: the agent's role, its model call number, its calls."""

    role: str
    number: int
    cached: bool
    calls: tuple[CallView, ...]


@dataclass(frozen=True)
class RoundView:
    """A round's turns (the draft is round 0), with what its folded summary line counts."""

    round: int
    #: The turns listed (none past the page's budget), and how many there were.
    turns: tuple[TurnView, ...]
    turn_count: int
    calls: int
    errors: int
    cached: int
    seconds: float
    unlisted: int
    #: Its calls are counted but not listed: the page's :class:`CallBudget` was spent.
    over_budget: bool = False

    @property
    def title(self) -> str:
        return "Draft" if self.round == 0 else f"Round {self.round}"


@dataclass(frozen=True)
class ToolRow:
    """Calls of one tool by one role across the batch."""

    role: str
    name: str
    calls: int
    errors: int
    cached: int
    seconds: float
    inputs: int


def round_views(record: Mapping[str, Any], budget: CallBudget | None = None) -> list[RoundView]:
    """The tool calls of one record's agent runs, one view per round that made some; a round
    the ``budget`` has no room for keeps its counts and lists no turn."""
    by_round: dict[int, list[tuple[TurnView, int]]] = {}
    for round_, role, step in _steps(record):
        turns = _mappings(step.get("turns"))
        views = by_round.setdefault(round_, []) if turns else []
        for n, turn in enumerate(turns):
            made = tuple(_call(c) for c in _mappings(turn.get("calls")))
            number = _int(turn.get("turn"))
            cached = turn.get("cached") is True
            unlisted = _int(step.get("unlisted")) if n == len(turns) - 1 else 0
            views.append((TurnView(role, number, cached, made), unlisted))
    rounds = []
    for round_, views in sorted(by_round.items()):
        calls = [c for v, _ in views for c in v.calls]
        listed = budget is None or budget.take(len(calls))
        rounds.append(
            RoundView(
                round=round_,
                turns=tuple(v for v, _ in views) if listed else (),
                turn_count=len(views),
                calls=len(calls),
                errors=sum(c.state == "error" for c in calls),
                cached=sum(c.cached for c in calls),
                seconds=sum(c.seconds or 0.0 for c in calls),
                unlisted=sum(u for _, u in views),
                over_budget=not listed,
            )
        )
    return rounds


def tool_rows(records: Iterable[Mapping[str, Any]]) -> list[ToolRow]:
    """Calls by role and tool over every record (approved ones too), most calls first; past
    :data:`TOOL_ROWS` rows the rest are one ``(other tools)`` row."""
    tally: dict[tuple[str, str], list[float]] = {}
    inputs: dict[tuple[str, str], set[int]] = {}
    for n, record in enumerate(records):
        for _, role, step in _steps(record):
            if unlisted := _int(step.get("unlisted")):  # counted, not listed by the record
                tally.setdefault((role, NOT_LISTED), [0, 0, 0, 0.0])[0] += unlisted
                inputs.setdefault((role, NOT_LISTED), set()).add(n)
            for turn in _mappings(step.get("turns")):
                for call in _mappings(turn.get("calls")):
                    key = (role, str(call.get("name") or ""))
                    row = tally.setdefault(key, [0, 0, 0, 0.0])
                    row[0] += 1
                    row[1] += call.get("ok") is False
                    row[2] += call.get("cached") is True
                    row[3] += _float(call.get("seconds"))
                    inputs.setdefault(key, set()).add(n)
    ranked = sorted(tally, key=lambda k: (-tally[k][0], k))
    shown, rest = ranked[:TOOL_ROWS], ranked[TOOL_ROWS:]
    rows = [_row(k[0], k[1], [tally[k]], inputs[k]) for k in shown]
    if rest:
        seen = set().union(*(inputs[k] for k in rest))
        rows.append(_row("", f"(other tools: {len(rest):,})", [tally[k] for k in rest], seen))
    return rows


def tool_totals(rows: Iterable[ToolRow]) -> tuple[int, int, int, float]:
    """Calls, errors, calls served from the cache and tool seconds over the table's rows."""
    rows = list(rows)
    return (
        sum(r.calls for r in rows),
        sum(r.errors for r in rows),
        sum(r.cached for r in rows),
        sum(r.seconds for r in rows),
    )


def _row(role: str, name: str, tallies: list[list[float]], inputs: set[int]) -> ToolRow:
    calls, errors, cached = (int(sum(t[i] for t in tallies)) for i in range(3))
    return ToolRow(role, name, calls, errors, cached, sum(t[3] for t in tallies), len(inputs))


def _steps(record: Mapping[str, Any]) -> Iterator[tuple[int, str, Mapping[str, Any]]]:
    """The record's agent runs with tool calls: round, role (from the step key) and entry."""
    steps = record.get("tool_turns")
    for step in steps if isinstance(steps, list) else ():
        if not isinstance(step, Mapping):
            continue
        try:
            phase, round_ = parse_step_key(str(step.get("step")))
        except ValueError:
            continue
        yield round_, ROLE_OF[phase], step


def _call(call: Mapping[str, Any]) -> CallView:
    ok = call.get("ok")
    args = str(call.get("arguments") or "")
    result = "" if call.get("result") is None else str(call.get("result"))
    full = max(_int(call.get("result_chars")), len(result))
    seconds = call.get("seconds")
    return CallView(
        name=str(call.get("name") or ""),
        arguments=args,
        arguments_cut=max(0, _int(call.get("arguments_chars")) - len(args)),
        state="running" if ok is None else "ok" if ok is True else "error",
        result=result,
        result_cut=full - len(result),
        result_chars=full,
        cached=call.get("cached") is True,
        seconds=None if seconds is None else _float(seconds),
    )


def _mappings(value: Any) -> list[Mapping[str, Any]]:
    """The objects in a record's list (anything else in it, or no list, is skipped)."""
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _float(value: Any) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if ok else 0.0
