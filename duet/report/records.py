"""Result records of a batch, their summary and their CSV form. Pure.

A *result record* is one line of a results file (``duet run -o``, ``duet results``): a
plain JSON object per input; ``index`` is its position in the input file, so records
written as runs finish can be put back in input order (:func:`by_index`). Runs give
:func:`result_record`, inputs that were never run give :func:`rejected_record`, so every
input is accounted for. Everything else here is a pure function of those records; the
HTML report built from them is :mod:`duet.report.html`.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from duet.formats.findings import simulated
from duet.report.turns import tool_turns
from orchestration.core.usage import Usage

if TYPE_CHECKING:
    from duet.intake.files import InputProblem
    from orchestration.core.architecture import LoopSpec
    from orchestration.core.results import RunResult
    from orchestration.state.turns import Turn

#: Outcomes of an input that ran to its end without an interruption or a failure.
FINISHED_WELL = ("approved", "max_rounds_reached")

#: Every outcome of an input, in the order tables and charts list them.
OUTCOMES = ("approved", "max_rounds_reached", "interrupted", "failed", "cancelled", "rejected")
#: Outcome -> the label people read.
LABELS = {
    "approved": "approved",
    "max_rounds_reached": "max rounds",
    "interrupted": "interrupted",
    "failed": "failed",
    "cancelled": "cancelled",
    "rejected": "rejected",
}


def _iso(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, tz=timezone.utc).isoformat()


def _usage(u: Any) -> dict[str, Any]:
    return {
        "input_tokens": u.input_tokens,
        "output_tokens": u.output_tokens,
        "calls": u.calls,
        "usd": round(u.usd, 6),
        **(
            {"cached_calls": u.cached_calls, "saved_usd": round(u.saved_usd, 6)}
            if getattr(u, "cached_calls", 0)
            else {}
        ),
        **({"tool_calls": u.tool_calls} if getattr(u, "tool_calls", 0) else {}),
    }


def result_record(
    result: RunResult,
    *,
    index: int | None = None,
    spec: LoopSpec | None = None,
    turns: Mapping[str, Sequence[Turn]] | None = None,
) -> dict[str, Any]:
    """The results-file record of a finished run.

    Args:
        result: the run's result.
        index: the input's position in the input file (rejected inputs included).
        spec: the loop the run ran, for the models and loop settings in the record.
        turns: the run's stored turns of agents with tools, by step key, for the
            record's ``tool_turns`` (:func:`~duet.report.turns.tool_turns`).
    """
    total = result.usage.total
    verdict = result.verdict
    duration = None
    if result.started_at is not None and result.finished_at is not None:
        duration = round(result.finished_at - result.started_at, 3)
    return {
        "index": index,
        "id": result.input_id,
        "status": str(result.status),
        "output": result.output,
        "final_score": result.final_score,
        "scored_output_round": result.scored_output_round,
        "output_round": result.output_round,
        #: ``best``: ``output`` is the highest-scored revision, judged in ``best_round``.
        "keep": result.keep,
        "best_round": result.best_round,
        "rounds": [
            {
                "round": r.round,
                "score": r.score,
                "issues": r.issues,
                "summary": r.summary,
                "findings": r.findings,
            }
            for r in result.rounds
        ],
        "n_rounds": len(result.rounds),
        #: What is still wrong with the output, if anything: the last critique's issues
        #: (with ``keep = "best"``, those of the critique that judged the kept output).
        "issues": list(verdict.issues) if verdict else [],
        #: The same issues as located findings, when the critic gave locations.
        "findings": list(verdict.findings) if verdict else [],
        #: The tool calls of each agent run that made some, results cut to a preview.
        "tool_turns": tool_turns(turns or {}),
        "usage": {
            **_usage(total),
            "by_role": {role: _usage(u) for role, u in sorted(result.usage.by_role.items())},
        },
        "reason": result.interruption_reason,
        "error": result.error,
        "run_id": result.run_id,
        "batch_id": result.batch_id,
        "user_id": result.user_id,
        "metadata": result.metadata,
        "models": {"actor": spec.actor.model, "critic": spec.critic.model} if spec else None,
        "loop": (
            {
                "max_rounds": spec.max_rounds,
                "approval_threshold": spec.approval_threshold,
                "keep": spec.keep,
                "min_improvement": spec.min_improvement,
                **({"name": spec.name} if spec.name else {}),
            }
            if spec
            else None
        ),
        "created_at": _iso(result.created_at),
        "started_at": _iso(result.started_at),
        "finished_at": _iso(result.finished_at),
        "duration_s": duration,
    }


def rejected_record(
    problem: InputProblem | Mapping[str, Any],
    *,
    index: int | None = None,
    batch_id: str | None = None,
) -> dict[str, Any]:
    """The results-file record of an input that was never run, saying where and why.

    ``problem`` is the reader's :class:`~duet.intake.files.InputProblem`, or the same fields as
    stored with a batch (``id``, ``source``, ``line``, ``reason``, ``index``).
    """
    if not isinstance(problem, Mapping):
        problem = {
            "id": problem.id,
            "source": problem.source,
            "line": problem.line,
            "reason": problem.reason,
        }
    return {
        "index": problem.get("index") if index is None else index,
        "id": problem["id"],
        "status": "rejected",
        "output": None,
        "final_score": None,
        "scored_output_round": None,
        "output_round": None,
        "keep": None,
        "best_round": None,
        "rounds": [],
        "n_rounds": 0,
        "issues": [],
        "findings": [],
        "tool_turns": [],
        "usage": {"input_tokens": 0, "output_tokens": 0, "calls": 0, "usd": 0.0},
        "reason": problem["reason"],
        "error": None,
        "run_id": None,
        "batch_id": batch_id,
        "user_id": None,
        "metadata": {},
        "duration_s": None,
        "source": problem["source"],
        "line": problem["line"],
    }


def by_index(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records in input order (by ``index``; records without one keep their place at the end)."""
    rows = list(records)
    return sorted(rows, key=lambda r: (r.get("index") is None, r.get("index") or 0))


def is_record(value: Any) -> bool:
    """Whether a parsed line looks like a result record (not, say, an input line)."""
    return isinstance(value, Mapping) and "status" in value and "id" in value and "usage" in value


def reason_of(record: Mapping[str, Any]) -> str | None:
    """Why an input did not finish well, as counted (its reason, else its error, else its
    outcome); None when it finished well. Quoted text in a rejection (an id) is elided."""
    status = record.get("status") or "unknown"
    if status in FINISHED_WELL:
        return None
    why = record.get("reason") or record.get("error") or status
    if status == "rejected":
        return "rejected: " + re.sub(r"'[^']*'", "'…'", str(why))  # ids apart
    return str(why)


def kept_note(
    keep: str | None, output_round: int | None, best_round: int | None, score: float | None
) -> str | None:
    """With ``keep = "best"``, which revision the output is and why; None otherwise."""
    if keep != "best":
        return None
    if best_round is None or score is None:
        return "the last revision (keep = best, but no revision was scored)"
    made = "the first draft" if output_round == 0 else f"the round {output_round} revision"
    return f"the best-scored revision, {made} (scored {score:.2f} in round {best_round})"


def record_kept_note(record: Mapping[str, Any]) -> str | None:
    """:func:`kept_note` of a results-file record."""
    return kept_note(
        record.get("keep"),
        record.get("output_round"),
        record.get("best_round"),
        record.get("final_score"),
    )


def record_usage(raw: Any) -> Usage:
    """A record's ``usage`` as :class:`Usage`; a field missing, null or unreadable counts
    0 (a results file read back may come from anywhere)."""
    raw = raw if isinstance(raw, Mapping) else {}
    counts = {f: _number(raw.get(f), int) for f in ("input_tokens", "output_tokens", "calls")}
    counts["cached_calls"] = _number(raw.get("cached_calls"), int)
    return Usage(
        **counts, usd=_number(raw.get("usd"), float), saved_usd=_number(raw.get("saved_usd"), float)
    )


def _number(value: Any, kind: type[int] | type[float]) -> Any:
    try:
        number = kind(value or 0)
    except (TypeError, ValueError):
        return kind(0)
    return number if number >= 0 else kind(0)


@dataclass
class Summary:
    """Running totals over result records; add records one at a time, in flat memory."""

    counts: Counter[str] = field(default_factory=Counter)
    #: Critique rounds summed over runs that ran (rejected inputs excluded).
    rounds: int = 0
    runs: int = 0
    #: The runs' usage summed (calls served from the model-call cache, and what they
    #: would have cost, apart).
    usage: Usage = field(default_factory=Usage)
    #: Why inputs did not finish well: reason (or error) -> how many.
    reasons: Counter[str] = field(default_factory=Counter)
    #: Runs whose critic was the offline ``sim`` model: their verdicts are made up.
    simulated: int = 0

    def add(self, record: Mapping[str, Any]) -> None:
        """Count one record."""
        status = record.get("status") or "unknown"
        self.counts[status] += 1
        why = reason_of(record)
        if why is not None:
            self.reasons[why] += 1
        if status == "rejected":
            return
        self.runs += 1
        models = record.get("models")
        if isinstance(models, Mapping) and simulated(str(models.get("critic") or "")):
            self.simulated += 1
        self.rounds += int(record.get("n_rounds") or 0)
        self.usage = self.usage + record_usage(record.get("usage"))

    @property
    def total(self) -> int:
        """Records counted, rejected ones included."""
        return sum(self.counts.values())

    @property
    def input_tokens(self) -> int:
        return self.usage.input_tokens

    @property
    def output_tokens(self) -> int:
        return self.usage.output_tokens

    @property
    def tokens(self) -> int:
        return self.usage.total_tokens

    @property
    def calls(self) -> int:
        return self.usage.calls

    @property
    def usd(self) -> float:
        return self.usage.usd

    @property
    def cached_calls(self) -> int:
        return self.usage.cached_calls

    @property
    def saved_usd(self) -> float:
        return self.usage.saved_usd

    @property
    def mean_rounds(self) -> float | None:
        """Mean critique rounds per run, or None before any run."""
        return self.rounds / self.runs if self.runs else None

    @property
    def ok(self) -> bool:
        """True when every input was accepted and every run finished without an
        interruption, a failure or a cancellation."""
        return all(self.counts[s] == 0 for s in self.counts if s not in FINISHED_WELL)


# --- CSV ------------------------------------------------------------------------------
#: Columns of a results CSV; nested fields (rounds, metadata) are JSON in their cell.
CSV_COLUMNS = (
    "index",
    "id",
    "status",
    "final_score",
    "n_rounds",
    "input_tokens",
    "output_tokens",
    "calls",
    "usd",
    "reason",
    "error",
    "run_id",
    "batch_id",
    "user_id",
    "actor_model",
    "critic_model",
    "created_at",
    "finished_at",
    "duration_s",
    "output",
    "issues",
    "rounds",
    "metadata",
    "output_round",
    "scored_output_round",
    "keep",
    "best_round",
    "tool_turns",
)
#: The columns holding numbers; every other cell is text (an id ``007`` stays ``007``).
CSV_NUMBERS = frozenset(
    {
        "index",
        "final_score",
        "n_rounds",
        "input_tokens",
        "output_tokens",
        "calls",
        "usd",
        "duration_s",
        "output_round",
        "scored_output_round",
        "best_round",
    }
)
#: The columns holding JSON (lists and objects).
CSV_JSON = ("issues", "rounds", "metadata", "tool_turns")


#: A cell starting with one of these is a formula to a spreadsheet (CSV injection).
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
#: ...and one starting with an apostrophe gets another, so reading it back is exact.
_QUOTED_START = (*_FORMULA_START, "'")


def csv_cell(value: Any) -> Any:
    """A value made safe for a spreadsheet: text that a spreadsheet would run as a
    formula gets a leading apostrophe (shown as text, not evaluated). Numbers stay numbers."""
    if isinstance(value, str) and value.startswith(_QUOTED_START):
        return "'" + value
    return value


def csv_text(cell: str) -> str:
    """The text :func:`csv_cell` was given for a text cell (its apostrophe taken off)."""
    return cell[1:] if cell[:1] == "'" and cell[1:].startswith(_QUOTED_START) else cell


def csv_row(record: Mapping[str, Any]) -> list[Any]:
    """One results-file record as a CSV row in :data:`CSV_COLUMNS` order, every text cell
    neutralised (:func:`csv_cell`)."""
    usage = record.get("usage") or {}
    flat = {
        **record,
        **{k: usage.get(k) for k in ("input_tokens", "output_tokens", "calls", "usd")},
    }
    models = record.get("models") or {}
    flat["actor_model"], flat["critic_model"] = models.get("actor"), models.get("critic")
    flat["issues"] = json.dumps(record.get("issues") or [], ensure_ascii=False)
    flat["rounds"] = json.dumps(record.get("rounds") or [], ensure_ascii=False)
    flat["metadata"] = json.dumps(record.get("metadata") or {}, ensure_ascii=False)
    flat["tool_turns"] = json.dumps(record.get("tool_turns") or [], ensure_ascii=False)
    return ["" if flat.get(c) is None else csv_cell(flat[c]) for c in CSV_COLUMNS]


def readable_date(iso: str) -> str:
    """An ISO timestamp as people read it (``2026-12-02 13:20 UTC``); text that is not one
    is returned as it is."""
    try:
        when = datetime.fromisoformat(iso)
    except ValueError:
        return iso
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
