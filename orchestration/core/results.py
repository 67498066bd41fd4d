"""What a finished run returns, built from its stored records by pure code."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, computed_field

from orchestration.core.events import Event
from orchestration.core.loop import ROLE_OF, Status, parse_step_key
from orchestration.core.usage import Usage

M = TypeVar("M", bound=BaseModel)

FINISHED_STATUSES: frozenset[str] = frozenset(
    {"approved", "max_rounds_reached", "interrupted", "failed", "cancelled"}
)


class RoundRecord(BaseModel):
    """One critique -> refine round: the critique, what it judged and what followed."""

    model_config = ConfigDict(frozen=True)

    round: int
    score: float | None = None
    issues: list[str] = Field(default_factory=list)
    #: The issues as objects (``message``, ``path``, ``line``, ``end_line``, ``severity``,
    #: ``rule``) when the critic gave locations (see orchestration/core/findings.py);
    #: empty for string-only critiques and records stored before findings existed.
    findings: list[dict[str, Any]] = Field(default_factory=list)
    summary: str = ""
    #: The output the critic judged.
    judged_output: str | None = None
    #: The round whose actor step wrote ``judged_output`` (0 for the first draft).
    judged_output_round: int | None = None
    #: The actor's revision after this critique (None when approved or stopped).
    revision: str | None = None
    critic_reply: str | None = None


class UsageReport(BaseModel):
    """Usage of a run, in total and per role."""

    model_config = ConfigDict(frozen=True)

    total: Usage = Usage()
    by_role: dict[str, Usage] = Field(default_factory=dict)


class RunResult(BaseModel):
    """The outcome of one actor-critic run."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    status: Status | str
    output: str | None = None
    #: The round whose actor step wrote ``output``: 0 for the first draft, ``n`` for the
    #: revision made in round ``n``.
    output_round: int | None = None
    #: The critic's last score (with ``keep == "best"``: its best). It judged the output
    #: written in ``scored_output_round``, which is ``output`` itself when the run was
    #: approved or kept its best, but the output *before* the last revision when the
    #: rounds ran out (that revision was never scored).
    final_score: float | None = None
    #: The round whose output ``final_score`` judged (compare with ``output_round``).
    scored_output_round: int | None = None
    #: Which revision ``output`` is: ``last`` (the loop's last) or ``best`` (the
    #: highest-scored, the loop's ``keep`` setting).
    keep: str = "last"
    #: With ``keep == "best"``: the critique round that gave the best score, whose issues
    #: are what is still wrong with ``output``; None otherwise or when nothing was scored.
    best_round: int | None = None
    interruption_reason: str | None = None
    error: str | None = None
    rounds: list[RoundRecord] = Field(default_factory=list)
    usage: UsageReport = UsageReport()
    input_id: str | None = None
    batch_id: str | None = None
    user_id: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    created_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    events: list[Event] = Field(default_factory=list)
    #: Served from the cache: an earlier run's result on the same loop and prompt, which
    #: bills nothing (its calls are ``cached_calls``, its cost ``saved_usd``).
    cached: bool = False
    #: ``output`` parsed, when the actor has an ``output_schema`` and its answer matched it
    #: (``output`` is then this object's JSON); None otherwise.
    output_json: dict[str, Any] | None = None

    @property
    def finished(self) -> bool:
        return self.status in FINISHED_STATUSES

    @property
    def approved(self) -> bool:
        return self.status == "approved"

    @property
    def final_score_judges_output(self) -> bool:
        """Whether ``final_score`` is the critic's score of ``output`` itself."""
        return self.final_score is not None and self.scored_output_round == self.output_round

    @property
    def model_calls(self) -> int:
        return self.usage.total.calls

    @computed_field  # type: ignore[prop-decorator]
    @property
    def turns(self) -> int:
        """Model calls the run made (each agent turn is one), as the reference counts."""
        return self.usage.total.turns

    @computed_field  # type: ignore[prop-decorator]
    @property
    def tokens_in(self) -> int:
        """Input tokens of the whole run, by the reference's name."""
        return self.usage.total.tokens_in

    @computed_field  # type: ignore[prop-decorator]
    @property
    def tokens_out(self) -> int:
        """Output tokens of the whole run, by the reference's name."""
        return self.usage.total.tokens_out

    @computed_field  # type: ignore[prop-decorator]
    @property
    def cost_usd(self) -> float:
        """USD the whole run cost, by the reference's name."""
        return self.usage.total.cost_usd

    def output_as(self, model: type[M]) -> M | None:
        """:attr:`output_json` as an instance of the pydantic ``model`` (the class the
        actor's ``output_schema`` came from); None when there is none."""
        return None if self.output_json is None else model.model_validate(self.output_json)

    @property
    def verdict(self) -> RoundRecord | None:
        """The critique that speaks of ``output``: the best round's with ``keep ==
        "best"``, else the last round's; None before any critique."""
        if self.best_round is not None:
            return next((r for r in self.rounds if r.round == self.best_round), None)
        return self.rounds[-1] if self.rounds else None


def _float(value: str | None) -> float | None:
    return float(value) if value not in (None, "") else None


def _step_order(key: str) -> tuple[int, int]:
    phase, round_ = parse_step_key(key)
    return round_, {"generate": 0, "critique": 1, "refine": 2}[phase]


def keep_best(result: RunResult) -> RunResult:
    """``result`` with its ``output`` the highest-scored revision (``[loop] keep = "best"``):
    the output the best critique judged (the earliest on a tie), ``output_round`` and
    ``scored_output_round`` naming the round that wrote it, ``best_round`` the critique's.
    An approved run keeps its output (the approving score is its best); a run with no
    scored round keeps what it has."""
    scored = [r for r in result.rounds if r.score is not None and r.judged_output is not None]
    if not scored:
        return result.model_copy(update={"keep": "best"})
    if result.approved:  # the approved output is the one that passed: it stays
        return result.model_copy(update={"keep": "best", "best_round": scored[-1].round})
    best = max(scored, key=lambda r: r.score or 0.0)  # max keeps the first of equal scores
    judged_round = best.judged_output_round
    return result.model_copy(
        update={
            "output": best.judged_output,
            "output_json": _json_object(best.judged_output)
            if result.output_json is not None
            else None,
            "output_round": judged_round,
            "final_score": best.score,
            "scored_output_round": judged_round,
            "keep": "best",
            "best_round": best.round,
        }
    )


def kept(result: RunResult, keep: str) -> RunResult:
    """``result`` as a loop whose ``keep`` setting is ``keep`` returns it."""
    return keep_best(result) if keep == "best" else result


def build_result(
    run: Mapping[str, str], steps: Mapping[str, Mapping[str, Any]], events: list[Event]
) -> RunResult:
    """Assemble a :class:`RunResult` from a run record, its step results and its events."""
    ordered = [steps[k] for k in sorted(steps, key=_step_order)]
    rounds: dict[int, dict[str, Any]] = {}
    by_role: dict[str, Usage] = {}
    output: str | None = None
    output_round: int | None = None
    output_json: dict[str, Any] | None = None
    partial: tuple[str | None, int] | None = None
    final_score: float | None = None
    scored_round: int | None = None
    for step in ordered:
        phase, round_ = parse_step_key(step["key"])
        role = ROLE_OF[phase]
        used = step_usage(step)
        by_role[role] = by_role.get(role, Usage()) + used
        text = step.get("text")
        if phase == "critique":
            rec = rounds.setdefault(round_, {"round": round_})
            rec.update(
                score=step.get("score"),
                issues=step.get("issues") or [],
                findings=step.get("findings") or [],
                summary=step.get("summary") or "",
                judged_output=output,
                judged_output_round=output_round,
                critic_reply=text,
            )
            if step.get("score") is not None:
                final_score, scored_round = step["score"], output_round
        elif step.get("interrupted"):
            partial = (text, round_)
        else:
            if phase == "refine":
                rounds.setdefault(round_, {"round": round_})["revision"] = text
            output, output_round = text, round_
            output_json = _json_object(text) if step.get("structured") else None
    if output is None and partial is not None:  # only a cut-off draft: better than nothing
        output, output_round = partial
    for again, used in retried_usage(run).items():
        by_role[again] = by_role.get(again, Usage()) + used
    total = Usage()
    for used in by_role.values():
        total = total + used
    return RunResult(
        run_id=run["run_id"],
        status=run.get("status", "queued"),
        output=output,
        output_round=output_round,
        output_json=output_json,
        final_score=final_score,
        scored_output_round=scored_round,
        interruption_reason=run.get("reason") or None,
        error=run.get("error") or None,
        rounds=[RoundRecord(**rounds[n]) for n in sorted(rounds)],
        usage=UsageReport(total=total, by_role=by_role),
        input_id=run.get("input_id") or None,
        batch_id=run.get("batch_id") or None,
        user_id=run.get("user_id") or None,
        metadata=_json_dict(run.get("metadata")),
        created_at=_float(run.get("created_at")),
        started_at=_float(run.get("started_at")),
        finished_at=_float(run.get("finished_at")),
        events=events,
    )


def step_usage(step: Mapping[str, Any]) -> Usage:
    """Usage recorded on one stored step result."""
    return Usage(
        input_tokens=step.get("input_tokens", 0),
        output_tokens=step.get("output_tokens", 0),
        cached_input_tokens=step.get("cached_input_tokens", 0),
        cache_write_tokens=step.get("cache_write_tokens", 0),
        calls=step.get("calls", 1),
        usd=step.get("usd", 0.0),
        cached_calls=step.get("cached_calls", 1 if step.get("cached") else 0),
        saved_usd=step.get("saved_usd", 0.0),
        tool_calls=step.get("tool_calls", 0) if isinstance(step.get("tool_calls"), int) else 0,
    )


def retried_usage(run: Mapping[str, str]) -> dict[str, Usage]:
    """By role, what the attempts a rerun of the interrupted run dropped had spent
    (record field ``retried``): paid for, so still the run's."""
    return {role: Usage(**used) for role, used in _json_dict(run.get("retried")).items()}


def run_usage(
    steps: Mapping[str, Mapping[str, Any]], retried: Mapping[str, Usage] | None = None
) -> dict[str, Any]:
    """Total usage of a run's stored steps (and of its ``retried`` attempts), as a plain dict."""
    total = Usage()
    for step in steps.values():
        total = total + step_usage(step)
    for used in (retried or {}).values():
        total = total + used
    # the cache's counts only where it served something (most runs have none), and the
    # tool calls only where an agent made some
    hidden = set() if total.cached_calls else {"cached_calls", "saved_usd"}
    return total.model_dump(exclude=hidden | (set() if total.tool_calls else {"tool_calls"}))


def _json_object(text: str | None) -> dict[str, Any] | None:
    """``text`` as the JSON object it holds; None when it holds none."""
    import json

    try:
        value = json.loads(text) if text else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _json_dict(raw: str | None) -> dict[str, Any]:
    if not raw:
        return {}
    import json

    value = json.loads(raw)
    return value if isinstance(value, dict) else {}
