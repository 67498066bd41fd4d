"""Result records of a batch, their summary, and the HTML report built from them. Pure.

A *result record* is one line of a results file (``duet run -o``, ``duet results``): a
plain JSON object per input; ``index`` is its position in the input file, so records
written as runs finish can be put back in input order (:func:`by_index`). Runs give
:func:`result_record`, inputs that were never run give :func:`rejected_record`, so every
input is accounted for. Everything else here is a pure function of those records.
"""

from __future__ import annotations

import html
import json
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from orchestration.core.completion import refusal_line

if TYPE_CHECKING:
    from duet.inputs import InputProblem
    from orchestration.core.architecture import LoopSpec
    from orchestration.core.results import RunResult

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
    return {"input_tokens": u.input_tokens, "output_tokens": u.output_tokens, "calls": u.calls,
            "usd": round(u.usd, 6),
            **({"cached_calls": u.cached_calls, "saved_usd": round(u.saved_usd, 6)}
               if getattr(u, "cached_calls", 0) else {})}  # fmt: skip


def result_record(
    result: RunResult, *, index: int | None = None, spec: LoopSpec | None = None
) -> dict[str, Any]:
    """The results-file record of a finished run.

    Args:
        result: the run's result.
        index: the input's position in the input file (rejected inputs included).
        spec: the loop the run ran, for the models and loop settings in the record.
    """
    total = result.usage.total
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
        "rounds": [
            {
                "round": r.round,
                "score": r.score,
                "issues": r.issues,
                "summary": r.summary,
                "findings": r.findings,
            }
            for r in result.rounds
        ],  # fmt: skip
        "n_rounds": len(result.rounds),
        #: The last critique's issues (what is still wrong with the output, if anything).
        "issues": list(result.rounds[-1].issues) if result.rounds else [],
        #: The same issues as located findings, when the critic gave locations.
        "findings": list(result.rounds[-1].findings) if result.rounds else [],
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
            {"max_rounds": spec.max_rounds, "approval_threshold": spec.approval_threshold}
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

    ``problem`` is the reader's :class:`~duet.inputs.InputProblem`, or the same fields as
    stored with a batch (``id``, ``source``, ``line``, ``reason``, ``index``).
    """
    if not isinstance(problem, Mapping):
        problem = {"id": problem.id, "source": problem.source, "line": problem.line,
                   "reason": problem.reason}  # fmt: skip
    return {
        "index": problem.get("index") if index is None else index,
        "id": problem["id"],
        "status": "rejected",
        "output": None,
        "final_score": None,
        "scored_output_round": None,
        "output_round": None,
        "rounds": [],
        "n_rounds": 0,
        "issues": [],
        "findings": [],
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
    #: Calls served from the model-call cache, and what they would have cost.
    cached_calls: int = 0
    saved_usd: float = 0.0
    #: Why inputs did not finish well: reason (or error) -> how many.
    reasons: Counter[str] = field(default_factory=Counter)

    def add(self, record: Mapping[str, Any]) -> None:
        """Count one record."""
        status = record.get("status") or "unknown"
        self.counts[status] += 1
        if status not in FINISHED_WELL:
            why = record.get("reason") or record.get("error") or status
            if status == "rejected":
                why = "rejected: " + re.sub(r"'[^']*'", "'…'", str(why))  # ids apart
            self.reasons[str(why)] += 1
        if status == "rejected":
            return
        self.runs += 1
        self.rounds += int(record.get("n_rounds") or 0)
        usage = record.get("usage") or {}
        self.input_tokens += int(usage.get("input_tokens") or 0)
        self.output_tokens += int(usage.get("output_tokens") or 0)
        self.calls += int(usage.get("calls") or 0)
        self.usd += float(usage.get("usd") or 0.0)
        self.cached_calls += int(usage.get("cached_calls") or 0)
        self.saved_usd += float(usage.get("saved_usd") or 0.0)

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
        """True when every input was accepted and every run finished without an
        interruption, a failure or a cancellation."""
        return all(self.counts[s] == 0 for s in self.counts if s not in FINISHED_WELL)


# --- CSV ------------------------------------------------------------------------------
#: Columns of a results CSV; nested fields (rounds, metadata) are JSON in their cell.
CSV_COLUMNS = (
    "index", "id", "status", "final_score", "n_rounds", "input_tokens", "output_tokens",
    "calls", "usd", "reason", "error", "run_id", "batch_id", "user_id", "actor_model",
    "critic_model", "created_at", "finished_at", "duration_s", "output", "issues", "rounds",
    "metadata",
)  # fmt: skip
#: The columns holding numbers; every other cell is text (an id ``007`` stays ``007``).
CSV_NUMBERS = frozenset(
    {"index", "final_score", "n_rounds", "input_tokens", "output_tokens", "calls", "usd",
     "duration_s"}
)  # fmt: skip
#: The columns holding JSON (lists and objects).
CSV_JSON = ("issues", "rounds", "metadata")


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
    return ["" if flat.get(c) is None else csv_cell(flat[c]) for c in CSV_COLUMNS]


# --- the HTML report ----------------------------------------------------------------
COLOURS = {
    "approved": "#2e7d32",
    "max_rounds_reached": "#f9a825",
    "interrupted": "#8e24aa",
    "failed": "#c62828",
    "cancelled": "#757575",
    "rejected": "#d84315",
}
_ACCENT = "#1565c0"
_TOP = 15  # rows in the cost and slowest-input charts


def render_report(records: Iterable[Mapping[str, Any]], *, title: str = "Duet batch report") -> str:
    """One self-contained HTML page about a batch, from its result records.

    Sections: summary, the batch (models, loop settings, dates, spend by role), outcome
    breakdown, why inputs did not finish well, the most frequent issues, distribution of
    final scores, score by round, rounds to approval, cost per input, slowest inputs, and
    every input not approved with its last score and issues. Charts are inline SVG: no
    scripts, styles or fonts are fetched.

    Args:
        records: result records (:func:`result_record` / :func:`rejected_record`).
        title: the page title.

    Returns:
        The HTML document.
    """
    rows = list(records)
    summary = Summary()
    for record in rows:
        summary.add(record)
    ran = [r for r in rows if r.get("status") != "rejected"]
    sections = [
        _section("Summary", _summary_html(summary, ran)),
        _section("Batch", _batch_html(rows)),
        _section("Outcomes", _outcomes_chart(summary)),
        _section("Why inputs did not finish well", _reasons_table(summary)),
        _section("Most frequent issues", _issues_table(ran)),
        _section("Final scores", _score_histogram(ran)),
        _section("Score by round", _score_by_round(ran)),
        _section("Rounds to approval", _rounds_to_approval(ran)),
        _section("Cost per input", _cost_chart(ran)),
        _section("Slowest inputs", _slowest_table(ran)),
        _section("Inputs not approved", _trouble_table(rows)),
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{_e(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        f"<h1>{_e(title)}</h1>\n" + "\n".join(sections) + "\n</body>\n</html>\n"
    )


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2rem auto;max-width:960px;color:#222}
h1{font-size:1.6rem}h2{font-size:1.2rem;margin-top:2rem;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5rem 0}td,th{padding:.25rem .75rem;text-align:left;
border-bottom:1px solid #eee}td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
.muted{color:#777}svg text{font-size:12px;fill:#333}
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _section(heading: str, body: str) -> str:
    slug = heading.lower().replace(" ", "-")
    return f'<section id="{_e(slug)}">\n<h2>{_e(heading)}</h2>\n{body}\n</section>'


def _num(value: float, digits: int = 2) -> str:
    return f"{value:,.{digits}f}"


def _usd(value: float) -> str:
    return f"${value:,.4f}"


def _summary_html(summary: Summary, ran: list[Mapping[str, Any]]) -> str:
    approved = summary.counts["approved"]
    scores = [r["final_score"] for r in ran if r.get("final_score") is not None]
    durations = [r["duration_s"] for r in ran if r.get("duration_s") is not None]
    mean = summary.mean_rounds
    items = [
        ("inputs", f"{summary.total:,}"),
        ("approved", f"{approved:,} ({approved / summary.total:.0%})" if summary.total else "0"),
        ("mean rounds", _num(mean) if mean is not None else "-"),
        ("mean final score", _num(sum(scores) / len(scores)) if scores else "-"),
        (
            "tokens",
            f"{summary.tokens:,} ({summary.input_tokens:,} in, {summary.output_tokens:,} out)",
        ),
        ("model calls", f"{summary.calls:,}"),
        ("cost", _usd(summary.usd)),
        *(
            [
                (
                    "model-call cache",
                    f"{summary.cached_calls:,} calls served from cache, "
                    f"{_usd(summary.saved_usd)} saved",
                )
            ]
            if summary.cached_calls
            else []
        ),
        ("mean run time", f"{sum(durations) / len(durations):.2f} s" if durations else "-"),
    ]
    body = "".join(f'<tr><th>{_e(k)}</th><td class="n">{_e(v)}</td></tr>' for k, v in items)
    return f"<table>{body}</table>"


def _outcomes_chart(summary: Summary) -> str:
    bars = [(LABELS[o], summary.counts[o], COLOURS[o]) for o in OUTCOMES]
    return _hbar_svg(bars, str, "outcomes")


def _score_histogram(ran: list[Mapping[str, Any]]) -> str:
    scores = [float(r["final_score"]) for r in ran if r.get("final_score") is not None]
    if not scores:
        return '<p class="muted">No scores yet.</p>'
    bins = [0] * 10
    for s in scores:
        bins[min(9, max(0, int(s * 10)))] += 1
    labels = [f"{i / 10:.1f}" for i in range(10)]
    return _vbar_svg(list(zip(labels, bins, strict=True)), "final score (bin start)", "scores")


def _score_by_round(ran: list[Mapping[str, Any]]) -> str:
    by_round: dict[int, list[float]] = {}
    for record in ran:
        for rnd in record.get("rounds") or []:
            if rnd.get("score") is not None:
                by_round.setdefault(int(rnd["round"]), []).append(float(rnd["score"]))
    if not by_round:
        return '<p class="muted">No critiques yet.</p>'
    points = [(n, sum(v) / len(v), len(v)) for n, v in sorted(by_round.items())]
    table = "".join(
        f'<tr><td class="n">{n}</td><td class="n">{_num(mean)}</td><td class="n">{count}</td></tr>'
        for n, mean, count in points
    )
    return _line_svg(points) + (
        '<table><tr><th class="n">round</th><th class="n">mean score</th>'
        f'<th class="n">runs</th></tr>{table}</table>'
    )


def _rounds_to_approval(ran: list[Mapping[str, Any]]) -> str:
    rounds = Counter(int(r.get("n_rounds") or 0) for r in ran if r.get("status") == "approved")
    if not rounds:
        return '<p class="muted">No input was approved.</p>'
    bars = [(str(n), rounds[n]) for n in range(1, max(rounds) + 1)]
    return _vbar_svg(bars, "rounds until approved", "approval")


def _cost_chart(ran: list[Mapping[str, Any]]) -> str:
    costs = sorted(
        ((str(r.get("id")), float((r.get("usage") or {}).get("usd") or 0.0)) for r in ran),
        key=lambda item: -item[1],
    )
    if not costs:
        return '<p class="muted">No runs.</p>'
    total = sum(c for _, c in costs)
    note = (
        f"<p>Mean {_usd(total / len(costs))} per input; the {min(_TOP, len(costs))} "
        "most expensive:</p>"
    )
    return note + _hbar_svg([(i, c, _ACCENT) for i, c in costs[:_TOP]], _usd, "cost")


def _slowest_table(ran: list[Mapping[str, Any]]) -> str:
    timed = sorted(
        (r for r in ran if r.get("duration_s") is not None), key=lambda r: -float(r["duration_s"])
    )[:_TOP]
    if not timed:
        return '<p class="muted">No timings.</p>'
    rows = "".join(
        f"<tr><td>{_e(r.get('id'))}</td><td>{_e(LABELS.get(r['status'], r['status']))}</td>"
        f'<td class="n">{r.get("n_rounds", 0)}</td><td class="n">{float(r["duration_s"]):.2f} s</td>'
        f'<td class="n">{_usd(float((r.get("usage") or {}).get("usd") or 0))}</td></tr>'
        for r in timed
    )
    return (
        '<table><tr><th>id</th><th>outcome</th><th class="n">rounds</th>'
        f'<th class="n">time</th><th class="n">cost</th></tr>{rows}</table>'
    )


def _trouble_table(rows: list[Mapping[str, Any]]) -> str:
    bad = [r for r in rows if r.get("status") != "approved"]
    if not bad:
        return '<p class="muted">None: every input was approved.</p>'
    body = "".join(
        f"<tr><td>{_e(r.get('id') if r.get('id') is not None else '')}</td>"
        f"<td>{_e(LABELS.get(r['status'], r['status']))}</td>"
        f'<td class="n">{_e(_score(r.get("final_score")))}</td>'
        f"<td>{_issues_list(_final_issues(r))}</td>"
        f"<td>{_e(_where(r))}</td><td>{_e(_why(r))}</td></tr>"
        for r in bad
    )
    return (
        '<table><tr><th>id</th><th>outcome</th><th class="n">last score</th><th>issues</th>'
        f"<th>where</th><th>why</th></tr>{body}</table>"
    )


def _score(value: Any) -> str:
    return "-" if value is None else f"{float(value):.2f}"


def _final_issues(record: Mapping[str, Any]) -> list[str]:
    if record.get("issues") is not None:
        return [str(i) for i in record["issues"]]
    rounds = record.get("rounds") or []
    return [str(i) for i in (rounds[-1].get("issues") or [])] if rounds else []


def _issues_list(issues: list[str]) -> str:
    if not issues:
        return '<span class="muted">-</span>'
    return "<ul>" + "".join(f"<li>{_e(i)}</li>" for i in issues) + "</ul>"


def _batch_html(rows: list[Mapping[str, Any]]) -> str:
    def seen(get: Callable[[Mapping[str, Any]], Any]) -> str:
        values = dict.fromkeys(str(v) for v in map(get, rows) if v not in (None, ""))
        return ", ".join(values) or "-"

    created = [str(r["created_at"]) for r in rows if r.get("created_at")]
    finished = [str(r["finished_at"]) for r in rows if r.get("finished_at")]
    items = [
        ("batch", seen(lambda r: r.get("batch_id"))),
        ("actor model", seen(lambda r: (r.get("models") or {}).get("actor"))),
        ("critic model", seen(lambda r: (r.get("models") or {}).get("critic"))),
        ("max rounds", seen(lambda r: (r.get("loop") or {}).get("max_rounds"))),
        ("approval threshold", seen(lambda r: (r.get("loop") or {}).get("approval_threshold"))),
        ("first submitted", readable_date(min(created)) if created else "-"),
        ("last finished", readable_date(max(finished)) if finished else "-"),
    ]
    body = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in items)
    roles: dict[str, Counter[str]] = {}
    for record in rows:
        for role, used in ((record.get("usage") or {}).get("by_role") or {}).items():
            tally = roles.setdefault(role, Counter())
            for k in ("input_tokens", "output_tokens", "calls"):
                tally[k] += int(used.get(k) or 0)
            tally["usd_micro"] += round(float(used.get("usd") or 0) * 1_000_000)
    spend = "".join(
        f'<tr><td>{_e(role)}</td><td class="n">{t["calls"]:,}</td>'
        f'<td class="n">{t["input_tokens"]:,}</td><td class="n">{t["output_tokens"]:,}</td>'
        f'<td class="n">{_usd(t["usd_micro"] / 1_000_000)}</td></tr>'
        for role, t in sorted(roles.items())
    )
    if spend:
        spend = (
            '<h3>Spend by role</h3><table><tr><th>role</th><th class="n">calls</th>'
            '<th class="n">input tokens</th><th class="n">output tokens</th>'
            f'<th class="n">cost</th></tr>{spend}</table>'
        )
    return f"<table>{body}</table>{spend}"


def _reasons_table(summary: Summary) -> str:
    if not summary.reasons:
        return '<p class="muted">Every input finished well.</p>'
    body = "".join(
        f'<tr><td>{_e(why)}</td><td class="n">{n:,}</td></tr>'
        for why, n in summary.reasons.most_common(_TOP)
    )
    return f'<table><tr><th>reason</th><th class="n">inputs</th></tr>{body}</table>'


def _issues_table(ran: list[Mapping[str, Any]]) -> str:
    """The issues still open at the end, counting each at most once per input: final-round
    issues only, so issues a later round fixed do not count."""
    counts: Counter[str] = Counter()
    wording: dict[str, str] = {}
    for record in ran:
        seen: set[str] = set()
        for issue in _final_issues(record):
            key = " ".join(str(issue).split()).casefold()
            if key and key not in seen:
                seen.add(key)
                wording.setdefault(key, str(issue))
        counts.update(seen)
    if not counts:
        return '<p class="muted">No issues raised.</p>'
    body = "".join(
        f'<tr><td>{_e(wording[key])}</td><td class="n">{n:,}</td></tr>'
        for key, n in counts.most_common(_TOP)
    )
    return f'<table><tr><th>issue</th><th class="n">inputs</th></tr>{body}</table>'


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


def _why(record: Mapping[str, Any]) -> str:
    """Why an input did not finish well: a refusal, filter or overflow said as such."""
    error, reason = record.get("error"), record.get("reason")
    return refusal_line(reason, error) or str(error or reason or "")


def _where(record: Mapping[str, Any]) -> str:
    if record.get("source"):
        line = record.get("line")
        return f"{record['source']}:{line}" if line is not None else str(record["source"])
    return str(record.get("run_id") or "")


# --- SVG charts -----------------------------------------------------------------------
def _hbar_svg(bars: Sequence[tuple[str, float, str]], fmt: Callable[[Any], str], name: str) -> str:
    """Horizontal bars, one row each: label, bar, value."""
    label_w, bar_w, row_h = 200, 520, 24
    top = max((v for _, v, _ in bars), default=0) or 1
    height = row_h * len(bars) + 8
    parts = [
        f'<svg class="chart {name}" xmlns="http://www.w3.org/2000/svg" width="{label_w + bar_w + 120}" '
        f'height="{height}" role="img" aria-label="{_e(name)}">'
    ]
    for i, (label, value, colour) in enumerate(bars):
        y = 4 + i * row_h
        width = bar_w * value / top
        short = label if len(label) <= 28 else label[:27] + "…"
        parts.append(
            f'<text x="{label_w - 8}" y="{y + 16}" text-anchor="end">{_e(short)}</text>'
            f'<rect x="{label_w}" y="{y + 3}" width="{width:.1f}" height="{row_h - 8}" fill="{colour}">'
            f"<title>{_e(label)}: {_e(fmt(value))}</title></rect>"
            f'<text x="{label_w + width + 6:.1f}" y="{y + 16}">{_e(fmt(value))}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _vbar_svg(bars: list[tuple[str, int]], axis: str, name: str) -> str:
    """Vertical bars (a histogram), with counts above and labels below."""
    width, height, pad = 640, 220, 30
    top = max((v for _, v in bars), default=0) or 1
    slot = (width - 2 * pad) / max(len(bars), 1)
    parts = [
        f'<svg class="chart {name}" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height + 40}" role="img" aria-label="{_e(axis)}">'
    ]
    for i, (label, value) in enumerate(bars):
        h = (height - 2 * pad) * value / top
        x = pad + i * slot
        y = height - pad - h
        parts.append(
            f'<rect x="{x + 4:.1f}" y="{y:.1f}" width="{slot - 8:.1f}" height="{h:.1f}" fill="{_ACCENT}">'
            f"<title>{_e(label)}: {value}</title></rect>"
            f'<text x="{x + slot / 2:.1f}" y="{y - 4:.1f}" text-anchor="middle">{value}</text>'
            f'<text x="{x + slot / 2:.1f}" y="{height - pad + 16}" text-anchor="middle">{_e(label)}</text>'
        )
    parts.append(
        f'<text x="{width / 2:.0f}" y="{height + 24}" text-anchor="middle">{_e(axis)}</text></svg>'
    )
    return "".join(parts)


def _line_svg(points: list[tuple[int, float, int]]) -> str:
    """Mean score (0..1) against round number, as a polyline with labelled points."""
    width, height, pad = 640, 220, 40
    xs = [p[0] for p in points]
    span = max(max(xs) - min(xs), 1)

    def at(n: int, score: float) -> tuple[float, float]:
        x = pad + (width - 2 * pad) * (n - min(xs)) / span
        return x, height - pad - (height - 2 * pad) * max(0.0, min(1.0, score))

    coords = [at(n, s) for n, s, _ in points]
    parts = [
        f'<svg class="chart rounds" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" role="img" aria-label="mean score by round">',
        f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" stroke="#999"/>',
        f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" stroke="#999"/>',
        f'<text x="{pad - 6}" y="{pad + 4}" text-anchor="end">1.0</text>',
        f'<text x="{pad - 6}" y="{height - pad + 4}" text-anchor="end">0.0</text>',
        '<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>'.format(
            _ACCENT, " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)
        ),
    ]
    for (n, score, count), (x, y) in zip(points, coords, strict=True):
        parts.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{_ACCENT}">'
            f"<title>round {n}: mean {score:.2f} over {count} runs</title></circle>"
            f'<text x="{x:.1f}" y="{y - 8:.1f}" text-anchor="middle">{score:.2f}</text>'
            f'<text x="{x:.1f}" y="{height - pad + 16}" text-anchor="middle">round {n}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)
