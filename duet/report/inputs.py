"""The triage sections of the HTML report, shaped for the template: the inputs not approved
worst first, each with its final-round issues, final output and diff from its input; the
issues and the reasons grouped across inputs, linked to those inputs. Pure, no markup.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from duet.report.records import LABELS, readable_date, reason_of, record_kept_note
from duet.report.toolviews import CallBudget, round_views
from duet.report.triage import (
    IssueGroup,
    ReasonGroup,
    clipped,
    clipped_lines,
    final_issues,
    group_issues,
    group_reasons,
    input_diff,
    worst_first,
)
from duet.short_ids import shortest_unique
from orchestration.core.completion import refusal_line

#: Most characters of an output, and lines of a diff, put on the page (the results file
#: keeps them whole); keeps a report of large files a size a browser opens at once.
OUTPUT_CHARS = 60_000
DIFF_LINES = 1_500
#: Inputs linked from one row of a group table before "and N more".
LINKED = 12
#: Examples of one kind of reason shown under it.
REASON_EXAMPLES = 3


def usd(value: float) -> str:
    return f"${value:,.4f}"


def score(value: Any) -> str:
    return "-" if value is None else f"{float(value):.2f}"


@dataclass(frozen=True)
class Ref:
    """An input as a group table names it: its label, and its anchor when it has one."""

    label: str
    anchor: str | None


@dataclass(frozen=True)
class Links:
    """The inputs a row names, worst first, and how many more it does not list."""

    refs: tuple[Ref, ...]
    more: int


class Triage:
    """The records of a page, with the worst-first ranks and anchors the sections share."""

    def __init__(self, rows: Sequence[Mapping[str, Any]], inputs: Mapping[str, str]) -> None:
        self.rows = rows
        self.inputs = inputs
        self.worst = worst_first(rows)
        self._rank = {id(r): n for n, r in enumerate(self.worst, 1)}
        self.short_runs = shortest_unique(str(r["run_id"]) for r in rows if r.get("run_id"))
        #: Tool calls the page may still list (inputs are shaped worst first).
        self.calls = CallBudget()

    def anchor(self, record: Mapping[str, Any]) -> str | None:
        rank = self._rank.get(id(record))
        return None if rank is None else f"input-{rank}"

    def ref(self, key: str) -> Ref:
        """The input whose key (its position in the rows) is ``key``."""
        return self.ref_of(self.rows[int(key)])

    def ref_of(self, record: Mapping[str, Any]) -> Ref:
        rank = self._rank.get(id(record))
        label = str(record.get("id") if record.get("id") is not None else "(no id)")
        return Ref(f"#{rank} {label}" if rank else label, self.anchor(record))

    def links(self, keys: Sequence[str]) -> Links:
        """The inputs named, worst first (those not approved by rank, then the rest)."""
        ranked = sorted(
            keys, key=lambda k: self._rank.get(id(self.rows[int(k)]), len(self.rows) + 1)
        )
        refs = tuple(self.ref(k) for k in ranked[:LINKED])
        return Links(refs, len(ranked) - len(refs))


@dataclass(frozen=True)
class Group:
    """One row of a group table: what it says, its other wordings, the inputs it names."""

    text: str
    others: tuple[str, ...]
    count: int
    links: Links
    more_examples: int = 0


def issue_groups(triage: Triage) -> list[Group]:
    """The final-round issues of every input, similar wordings as one row, most inputs first."""
    groups: list[IssueGroup] = group_issues(
        (str(n), issue)
        for n, record in enumerate(triage.rows)
        if record.get("status") != "rejected"
        for issue in final_issues(record)
    )
    return [
        Group(g.text, tuple(g.wordings[1:]), len(g.inputs), triage.links(g.inputs)) for g in groups
    ]


def reason_groups(triage: Triage) -> list[Group]:
    """Why inputs did not finish well, one row per kind of reason with a few examples."""
    groups: list[ReasonGroup] = group_reasons(
        (str(n), why) for n, r in enumerate(triage.rows) if (why := reason_of(r)) is not None
    )
    rows = []
    for g in groups:
        shown = g.examples[:REASON_EXAMPLES]
        examples = () if shown == [g.kind] else tuple(shown)
        more = len(g.examples) - len(shown) if examples else 0
        rows.append(Group(g.kind, examples, len(g.inputs), triage.links(g.inputs), more))
    return rows


def why_line(record: Mapping[str, Any]) -> str:
    """Why an input did not finish well: a refusal, filter or overflow said as such."""
    error, reason = record.get("error"), record.get("reason")
    return refusal_line(reason, error) or str(error or reason or "")


@dataclass(frozen=True)
class Shown:
    """A long text as the page shows it: the part shown and how much was cut."""

    text: str
    cut: int
    lines: int = 0


@dataclass(frozen=True)
class Diff:
    """An output's diff from its input: lines with their kind, counts, or why there is none."""

    lines: tuple[tuple[str, str], ...] = ()
    added: int = 0
    removed: int = 0
    cut: int = 0
    note: str = ""


def input_view(triage: Triage, record: Mapping[str, Any]) -> dict[str, Any]:
    """What the page shows of one input not approved (``templates/inputs.html.j2``)."""
    status = str(record.get("status"))
    run = record.get("run_id")
    used = (record.get("usage") or {}).get("usd")
    line = record.get("line")
    source = record.get("source")
    return {
        "anchor": triage.anchor(record) or "",
        "ident": record.get("id") if record.get("id") is not None else "",
        "status": status,
        "label": LABELS.get(status, status),
        "score_kind": "best" if record.get("keep") == "best" else "last",
        "score": score(record.get("final_score")),
        "source": (f"{source}:{line}" if line is not None else str(source)) if source else "",
        "run": str(run) if run else "",
        "short_run": triage.short_runs.get(str(run), str(run)) if run else "",
        "rounds": int(record["n_rounds"]) if record.get("n_rounds") else 0,
        "usd": usd(float(used)) if used else "",
        "duration": (
            f"{float(record['duration_s']):.2f} s" if record.get("duration_s") is not None else ""
        ),
        "finished": readable_date(str(record["finished_at"])) if record.get("finished_at") else "",
        "why": why_line(record),
        "kept": record_kept_note(record) or "",
        "issues": final_issues(record),
        "tool_rounds": round_views(record, triage.calls),
        "output": _output(record),
        "output_title": "Kept output" if record.get("keep") == "best" else "Final output",
        "diff": _diff(triage, record),
    }


def _output(record: Mapping[str, Any]) -> Shown | None:
    output = record.get("output")
    if output is None:
        return None
    shown, cut = clipped(str(output), OUTPUT_CHARS)
    return Shown(shown, cut, str(output).count("\n") + 1)


def _diff(triage: Triage, record: Mapping[str, Any]) -> Diff | None:
    output, ident = record.get("output"), record.get("id")
    prompt = triage.inputs.get(str(ident)) if ident is not None else None
    if output is None:
        return None
    if prompt is None:
        return Diff(note="Diff from the input: the input is not at hand.")
    lines = input_diff(prompt, str(output), None if ident is None else str(ident))
    if not lines:
        return Diff(note="The output is the input unchanged.")
    added = sum(1 for x in lines[2:] if x.startswith("+"))
    removed = sum(1 for x in lines[2:] if x.startswith("-"))
    shown, cut = clipped_lines(lines, DIFF_LINES)
    return Diff(tuple((_line_kind(x), x) for x in shown), added, removed, cut)


def _line_kind(line: str) -> str:
    if line.startswith(("+++", "---")):
        return "file"
    return {"+": "add", "-": "del", "@": "hunk"}.get(line[:1], "same")
