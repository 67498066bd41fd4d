"""The triage sections of the HTML report: the inputs not approved worst first, each with
its final-round issues, final output and diff from its input; the issues and the reasons
grouped across inputs, linked to those inputs. Pure; every text from a record is escaped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from duet.report.charts import esc
from duet.report.records import LABELS, readable_date, reason_of, record_kept_note
from duet.report.triage import (
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


def usd(value: float) -> str:
    return f"${value:,.4f}"


def score(value: Any) -> str:
    return "-" if value is None else f"{float(value):.2f}"


@dataclass(frozen=True)
class Ref:
    """An input as a group table names it: its label, and its anchor when it has one."""

    label: str
    anchor: str | None


class Triage:
    """The records of a page, with the worst-first ranks and anchors the sections share."""

    def __init__(self, rows: Sequence[Mapping[str, Any]], inputs: Mapping[str, str]) -> None:
        self.rows = rows
        self.inputs = inputs
        self.worst = worst_first(rows)
        self._rank = {id(r): n for n, r in enumerate(self.worst, 1)}
        self.short_runs = shortest_unique(str(r["run_id"]) for r in rows if r.get("run_id"))

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

    def links(self, keys: Sequence[str]) -> str:
        """The inputs named, worst first (those not approved by rank, then the rest)."""
        ranked = sorted(
            keys, key=lambda k: self._rank.get(id(self.rows[int(k)]), len(self.rows) + 1)
        )
        refs = [self.ref(k) for k in ranked[:LINKED]]
        shown = ", ".join(
            f'<a href="#{r.anchor}">{esc(r.label)}</a>' if r.anchor else esc(r.label) for r in refs
        )
        more = len(ranked) - len(refs)
        return shown + (f' <span class="muted">and {more:,} more</span>' if more > 0 else "")


def issues_section(triage: Triage) -> str:
    """The final-round issues of every input, similar wordings as one row, most inputs first."""
    groups = group_issues(
        (str(n), issue)
        for n, record in enumerate(triage.rows)
        if record.get("status") != "rejected"
        for issue in final_issues(record)
    )
    if not groups:
        return '<p class="muted">No issues raised.</p>'
    body = "".join(
        f"<tr><td>{esc(g.text)}{_wordings(g.wordings)}</td>"
        f'<td class="n">{len(g.inputs):,}</td><td class="refs">{triage.links(g.inputs)}</td></tr>'
        for g in groups
    )
    return (
        '<p class="muted">Issues of each input\'s final critique round (those a later round '
        "fixed are left out), similar wordings in one row; an input counts once a row.</p>"
        '<table class="groups"><tr><th>issue</th><th class="n">inputs</th><th>which</th></tr>'
        f"{body}</table>"
    )


def _wordings(wordings: list[str]) -> str:
    if len(wordings) < 2:
        return ""
    items = "".join(f"<li>{esc(w)}</li>" for w in wordings[1:])
    return (
        f"<details><summary>{len(wordings) - 1:,} similar wording(s)</summary>"
        f"<ul>{items}</ul></details>"
    )


def reasons_section(triage: Triage) -> str:
    """Why inputs did not finish well, one row per kind of reason."""
    groups = group_reasons(
        (str(n), why) for n, r in enumerate(triage.rows) if (why := reason_of(r)) is not None
    )
    if not groups:
        return '<p class="muted">Every input finished well.</p>'
    rows = []
    for g in groups:
        shown = g.examples[:3]
        examples = ""
        if shown != [g.kind]:
            items = "".join(f"<li>{esc(x)}</li>" for x in shown)
            extra = len(g.examples) - len(shown)
            more = f'<li class="muted">and {extra:,} more</li>' if extra > 0 else ""
            examples = f'<ul class="examples">{items}{more}</ul>'
        rows.append(
            f"<tr><td><code>{esc(g.kind)}</code>{examples}</td>"
            f'<td class="n">{len(g.inputs):,}</td><td class="refs">{triage.links(g.inputs)}</td></tr>'
        )
    return (
        '<table class="groups"><tr><th>reason</th><th class="n">inputs</th><th>which</th></tr>'
        f"{''.join(rows)}</table>"
    )


def inputs_section(triage: Triage) -> str:
    """Every input not approved, worst first, each a collapsible block."""
    if not triage.worst:
        return '<p class="muted">None: every input was approved.</p>'
    intro = (
        f"<p>{len(triage.worst):,} input(s), worst first: no score at all, then by last score, "
        "then by reason. Each shows its final-round issues; its final output and what it "
        "changed from the input are folded.</p>"
    )
    return intro + "\n".join(_input_block(triage, r) for r in triage.worst)


def _input_block(triage: Triage, record: Mapping[str, Any]) -> str:
    anchor = triage.anchor(record) or ""
    status = str(record.get("status"))
    ident = record.get("id") if record.get("id") is not None else ""
    why = why_line(record)
    head = (
        f'<span class="rank">#{anchor.removeprefix("input-")}</span> '
        f'<span class="id">{esc(ident)}</span> '
        f'<span class="badge {esc(status)}">{esc(LABELS.get(status, status))}</span> '
        f'<span class="score">{"best" if record.get("keep") == "best" else "last"} score '
        f"{esc(score(record.get('final_score')))}</span>"
    )
    issues = final_issues(record)
    issues_html = (
        '<ol class="issues">' + "".join(f"<li>{esc(i)}</li>" for i in issues) + "</ol>"
        if issues
        else ""
        if status == "rejected"
        else '<p class="muted">No issues in the final round.</p>'
    )
    return (
        f'<details class="input" id="{anchor}" data-id="{esc(ident)}" open>'
        f"<summary>{head}</summary>\n"
        f'<div class="body">{_meta(triage, record)}'
        + (f'<p class="why">{esc(why)}</p>' if why else "")
        + (f'<p class="kept">Kept: {esc(kept)}.</p>' if (kept := record_kept_note(record)) else "")
        + f"{issues_html}{_output(record)}{_diff(triage, record)}</div></details>"
    )


def why_line(record: Mapping[str, Any]) -> str:
    """Why an input did not finish well: a refusal, filter or overflow said as such."""
    error, reason = record.get("error"), record.get("reason")
    return refusal_line(reason, error) or str(error or reason or "")


def _meta(triage: Triage, record: Mapping[str, Any]) -> str:
    parts = []
    if record.get("source"):
        line = record.get("line")
        parts.append(esc(f"{record['source']}:{line}" if line is not None else record["source"]))
    run = record.get("run_id")
    if run:
        parts.append(
            f'run <code title="{esc(run)}">{esc(triage.short_runs.get(str(run), run))}</code>'
        )
    if record.get("n_rounds"):
        parts.append(f"{int(record['n_rounds'])} round(s)")
    used = (record.get("usage") or {}).get("usd")
    if used:
        parts.append(usd(float(used)))
    if record.get("duration_s") is not None:
        parts.append(f"{float(record['duration_s']):.2f} s")
    if record.get("finished_at"):
        parts.append("finished " + esc(readable_date(str(record["finished_at"]))))
    parts.append('<a href="#summary">summary</a>')
    return '<p class="meta">' + " · ".join(parts) + "</p>"


def _output(record: Mapping[str, Any]) -> str:
    output = record.get("output")
    if output is None:
        return "" if record.get("status") == "rejected" else '<p class="muted">No output.</p>'
    shown, cut = clipped(str(output), OUTPUT_CHARS)
    note = f'\n<span class="muted">… {cut:,} more characters</span>' if cut else ""
    lines = str(output).count("\n") + 1
    title = "Kept output" if record.get("keep") == "best" else "Final output"
    return (
        f"<details><summary>{title} ({lines:,} line(s))</summary>"
        f'<pre class="text">{esc(shown)}{note}</pre></details>'
    )


def _diff(triage: Triage, record: Mapping[str, Any]) -> str:
    output, ident = record.get("output"), record.get("id")
    prompt = triage.inputs.get(str(ident)) if ident is not None else None
    if output is None:
        return ""
    if prompt is None:
        return '<p class="muted">Diff from the input: the input is not at hand.</p>'
    lines = input_diff(prompt, str(output), None if ident is None else str(ident))
    if not lines:
        return '<p class="muted">The output is the input unchanged.</p>'
    added = sum(1 for x in lines[2:] if x.startswith("+"))
    removed = sum(1 for x in lines[2:] if x.startswith("-"))
    shown, cut = clipped_lines(lines, DIFF_LINES)
    body = "".join(_diff_line(x) for x in shown)  # each line a block of its own
    note = f'\n<span class="muted">… {cut:,} more lines</span>' if cut else ""
    return (
        f"<details><summary>Diff from the input (+{added:,} −{removed:,})</summary>"
        f'<pre class="diff">{body}{note}</pre></details>'
    )


def _diff_line(line: str) -> str:
    kind = {"+": "add", "-": "del", "@": "hunk"}.get(line[:1])
    if line.startswith(("+++", "---")):
        kind = "file"
    return f'<span class="{kind or "same"}">{esc(line)}</span>'
