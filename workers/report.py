"""Result records of a batch, their summary, and the HTML report built from them. Pure.

A *result record* is one line of a results file (``duet run -o``, ``duet results``): a
plain JSON object per input, in input order. Runs give :func:`result_record`, inputs that
were never run give :func:`rejected_record`, so every input is accounted for. Everything
else here is a pure function of those records.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestration.inputs import InputProblem
    from orchestration.results import RunResult

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


def result_record(result: RunResult) -> dict[str, Any]:
    """The results-file record of a finished run."""
    total = result.usage.total
    duration = None
    if result.started_at is not None and result.finished_at is not None:
        duration = round(result.finished_at - result.started_at, 3)
    return {
        "id": result.input_id,
        "status": str(result.status),
        "output": result.output,
        "final_score": result.final_score,
        "rounds": [
            {"round": r.round, "score": r.score, "issues": r.issues, "summary": r.summary}
            for r in result.rounds
        ],
        "n_rounds": len(result.rounds),
        "usage": {
            "input_tokens": total.input_tokens,
            "output_tokens": total.output_tokens,
            "calls": total.calls,
            "usd": round(total.usd, 6),
        },
        "reason": result.interruption_reason,
        "error": result.error,
        "run_id": result.run_id,
        "user_id": result.user_id,
        "metadata": result.metadata,
        "duration_s": duration,
    }


def rejected_record(problem: InputProblem) -> dict[str, Any]:
    """The results-file record of an input that was never run, saying where and why."""
    return {
        "id": problem.id,
        "status": "rejected",
        "output": None,
        "final_score": None,
        "rounds": [],
        "n_rounds": 0,
        "usage": {"input_tokens": 0, "output_tokens": 0, "calls": 0, "usd": 0.0},
        "reason": problem.reason,
        "error": None,
        "run_id": None,
        "user_id": None,
        "metadata": {},
        "duration_s": None,
        "source": problem.source,
        "line": problem.line,
    }


@dataclass
class Summary:
    """Running totals over result records; add records one at a time, in flat memory."""

    counts: Counter[str] = field(default_factory=Counter)
    #: Critique rounds summed over runs that ran (rejected inputs excluded).
    rounds: int = 0
    runs: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    calls: int = 0
    usd: float = 0.0

    def add(self, record: Mapping[str, Any]) -> None:
        """Count one record."""
        status = record.get("status") or "unknown"
        self.counts[status] += 1
        if status == "rejected":
            return
        self.runs += 1
        self.rounds += int(record.get("n_rounds") or 0)
        usage = record.get("usage") or {}
        self.input_tokens += int(usage.get("input_tokens") or 0)
        self.output_tokens += int(usage.get("output_tokens") or 0)
        self.calls += int(usage.get("calls") or 0)
        self.usd += float(usage.get("usd") or 0.0)

    @property
    def total(self) -> int:
        """Records counted, rejected ones included."""
        return sum(self.counts.values())

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def mean_rounds(self) -> float | None:
        """Mean critique rounds per run, or None before any run."""
        return self.rounds / self.runs if self.runs else None

    @property
    def ok(self) -> bool:
        """True when no run failed and no input was rejected."""
        return not (self.counts["failed"] or self.counts["rejected"])
