"""Result records of a batch, their summary, and the HTML report built from them. Pure.

A *result record* is one line of a results file (``duet run -o``, ``duet results``): a
plain JSON object per input, in input order. Runs give :func:`result_record`, inputs that
were never run give :func:`rejected_record`, so every input is accounted for. Everything
else here is a pure function of those records.
"""

from __future__ import annotations

import html
import json
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from duet.inputs import InputProblem
    from orchestration.core.results import RunResult

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
        "scored_output_round": result.scored_output_round,
        "output_round": result.output_round,
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
        "scored_output_round": None,
        "output_round": None,
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


# --- CSV ------------------------------------------------------------------------------
#: Columns of a results CSV; nested fields (rounds, metadata) are JSON in their cell.
CSV_COLUMNS = (
    "id", "status", "final_score", "n_rounds", "input_tokens", "output_tokens", "calls",
    "usd", "reason", "error", "run_id", "user_id", "duration_s", "output", "rounds", "metadata",
)  # fmt: skip


#: A cell starting with one of these is a formula to a spreadsheet (CSV injection).
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> Any:
    """A value made safe for a spreadsheet: text that a spreadsheet would run as a
    formula gets a leading apostrophe (shown as text, not evaluated). Numbers stay numbers."""
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value


def csv_row(record: Mapping[str, Any]) -> list[Any]:
    """One results-file record as a CSV row in :data:`CSV_COLUMNS` order, every text cell
    neutralised (:func:`csv_cell`)."""
    usage = record.get("usage") or {}
    flat = {
        **record,
        **{k: usage.get(k) for k in ("input_tokens", "output_tokens", "calls", "usd")},
    }
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

    Sections: summary, outcome breakdown, distribution of final scores, score by round,
    rounds to approval, cost per input, slowest inputs, and the inputs that did not
    finish well. Charts are inline SVG: no scripts, styles or fonts are fetched.

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
        _section("Outcomes", _outcomes_chart(summary)),
        _section("Final scores", _score_histogram(ran)),
        _section("Score by round", _score_by_round(ran)),
        _section("Rounds to approval", _rounds_to_approval(ran)),
        _section("Cost per input", _cost_chart(ran)),
        _section("Slowest inputs", _slowest_table(ran)),
        _section("Inputs that did not finish well", _trouble_table(rows)),
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
    bad = [r for r in rows if r.get("status") in ("interrupted", "failed", "cancelled", "rejected")]
    if not bad:
        return '<p class="muted">None.</p>'
    body = "".join(
        f"<tr><td>{_e(r.get('id') if r.get('id') is not None else '')}</td>"
        f"<td>{_e(LABELS.get(r['status'], r['status']))}</td>"
        f"<td>{_e(_where(r))}</td><td>{_e(r.get('error') or r.get('reason') or '')}</td></tr>"
        for r in bad
    )
    return f"<table><tr><th>id</th><th>outcome</th><th>where</th><th>why</th></tr>{body}</table>"


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
