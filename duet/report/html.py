"""The HTML report of a batch: one self-contained page a reviewer triages from. Pure.

The inputs that need attention come first (:mod:`duet.report.inputs`), then the batch and
its charts (:mod:`duet.report.charts`). The page is rendered by Jinja2 templates with
autoescaping on (``templates/``), so every text from a record (user input, model output)
is escaped by the engine, never by hand; no script, style sheet or font is fetched.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from functools import cache
from typing import Any

import jinja2

from duet.report.charts import ACCENT, Chart, hbars, line, vbars
from duet.report.inputs import Triage, input_view, issue_groups, reason_groups, usd
from duet.report.records import LABELS, OUTCOMES, Summary, readable_date
from duet.report.toolviews import ToolRow, tool_rows, tool_totals

COLOURS = {
    "approved": "#2e7d32",
    "max_rounds_reached": "#f9a825",
    "interrupted": "#8e24aa",
    "failed": "#c62828",
    "cancelled": "#757575",
    "rejected": "#d84315",
}
#: Rows in the cost and slowest-input charts.
TOP = 15
#: Inputs not approved linked from the summary, worst first.
WORST_LINKED = 10


@cache
def _templates() -> jinja2.Environment:
    """The report's templates, autoescaping everything they are given."""
    return jinja2.Environment(
        loader=jinja2.PackageLoader("duet.report", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )


def render_report(
    records: Iterable[Mapping[str, Any]],
    *,
    title: str = "Duet batch report",
    inputs: Mapping[str, str] | None = None,
) -> str:
    """One self-contained HTML page about a batch, from its result records.

    Sections: summary (linking the worst inputs), the inputs not approved worst first (each
    with its final-round issues, final output and diff from its input), issues and reasons
    grouped across inputs, the batch (models, loop settings, dates, spend by role), outcome
    breakdown, final scores, score by round, rounds to approval, cost per input and slowest
    inputs. Charts are inline SVG, folding is ``<details>``: the page runs no script.

    Args:
        records: result records (:func:`~duet.report.records.result_record` /
            :func:`~duet.report.records.rejected_record`).
        title: the page title.
        inputs: input id -> the input's prompt, for the diff of each output from its
            input; an input not in it gets no diff.

    Returns:
        The HTML document.
    """
    rows = list(records)
    summary = Summary()
    for record in rows:
        summary.add(record)
    ran = [r for r in rows if r.get("status") != "rejected"]
    triage = Triage(rows, inputs or {})
    costs = _costs(ran)
    tools = tool_rows(ran)
    return (
        _templates()
        .get_template("report.html.j2")
        .render(
            title=title,
            css=_CSS,
            accent=ACCENT,
            summary=_summary_items(summary, ran, tools),
            simulated=summary.simulated,
            worst=[triage.ref_of(r) for r in triage.worst[:WORST_LINKED]],
            worst_total=len(triage.worst),
            inputs=[input_view(triage, r) for r in triage.worst],
            issue_groups=issue_groups(triage),
            reason_groups=reason_groups(triage),
            batch=_batch_items(rows),
            spend=_spend(rows),
            tools=tools,
            outcomes=hbars(
                [(LABELS[o], summary.counts[o], COLOURS[o]) for o in OUTCOMES], str, "outcomes"
            ),
            scores=_score_histogram(ran),
            by_round=_score_by_round(ran),
            approvals=_rounds_to_approval(ran),
            costs=hbars([(i, c, ACCENT) for i, c in costs[:TOP]], usd, "cost") if costs else None,
            mean_cost=usd(sum(c for _, c in costs) / len(costs)) if costs else "",
            slowest=_slowest(ran),
        )
    )


_CSS = (
    """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:1.5rem auto;max-width:1180px;
padding:0 1rem;color:#222;line-height:1.4}
h1{font-size:1.5rem;overflow-wrap:anywhere}h2{font-size:1.2rem;margin-top:2rem;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5rem 0}td,th{padding:.25rem .75rem;text-align:left;
vertical-align:top;border-bottom:1px solid #eee}td.n,th.n{text-align:right;
font-variant-numeric:tabular-nums;white-space:nowrap}table.groups{width:100%}
td.refs{font-size:.9em;max-width:28rem}.muted{color:#777}svg text{font-size:12px;fill:#333}
nav a,td.refs a{margin-right:.2rem}code{font-size:.9em}
details.input{border:1px solid #ddd;border-radius:6px;margin:.6rem 0;padding:.3rem .8rem}
details.input>summary{cursor:pointer;font-size:1.05rem;overflow-wrap:anywhere}
details.input .id{font-weight:600}.rank{color:#777;font-variant-numeric:tabular-nums}
.badge{font-size:.8rem;padding:.05rem .45rem;border-radius:.6rem;color:#fff;background:#757575}
"""
    + "".join(f".badge.{outcome}{{background:{colour}}}" for outcome, colour in COLOURS.items())
    + """
.score{color:#444;font-variant-numeric:tabular-nums}.meta{color:#555;font-size:.9em;margin:.3rem 0}
.why{color:#8e2424;margin:.3rem 0}ol.issues{margin:.3rem 0 .5rem;padding-left:1.6rem}
ol.issues li{margin:.15rem 0}details details{margin:.3rem 0}
pre{white-space:pre-wrap;overflow-wrap:anywhere;background:#f7f7f7;padding:.5rem;
max-height:36rem;overflow:auto;font-size:.85em}
.diff span{display:block}.diff .add{background:#e6ffec}.diff .del{background:#ffebe9}
.diff .hunk{color:#6f42c1}.diff .file{color:#777}
details.round>summary{cursor:pointer}.turn .meta{margin:.4rem 0 .1rem}
ol.calls{margin:.1rem 0 .4rem;padding-left:1.6rem}ol.calls li{margin:.25rem 0}
code.args{overflow-wrap:anywhere}.call.ok{color:#2e7d32}.call.error{color:#c62828}
.call.running{color:#757575}.cached{color:#1565c0}pre.result{max-height:14rem;margin:.2rem 0}
"""
)


def _num(value: float, digits: int = 2) -> str:
    return f"{value:,.{digits}f}"


def _summary_items(
    summary: Summary, ran: list[Mapping[str, Any]], tools: list[ToolRow]
) -> list[tuple[str, str]]:
    approved = summary.counts["approved"]
    scores = [r["final_score"] for r in ran if r.get("final_score") is not None]
    durations = [r["duration_s"] for r in ran if r.get("duration_s") is not None]
    mean = summary.mean_rounds
    cache_line = (
        [
            (
                "model-call cache",
                f"{summary.cached_calls:,} calls served from cache, {usd(summary.saved_usd)} saved",
            )
        ]
        if summary.cached_calls
        else []
    )
    return [
        ("inputs", f"{summary.total:,}"),
        ("approved", f"{approved:,} ({approved / summary.total:.0%})" if summary.total else "0"),
        ("mean rounds", _num(mean) if mean is not None else "-"),
        ("mean final score", _num(sum(scores) / len(scores)) if scores else "-"),
        (
            "tokens",
            f"{summary.tokens:,} ({summary.input_tokens:,} in, {summary.output_tokens:,} out)",
        ),
        ("model calls", f"{summary.calls:,}"),
        *_tool_line(tools),
        ("cost", usd(summary.usd)),
        *cache_line,
        ("mean run time", f"{sum(durations) / len(durations):.2f} s" if durations else "-"),
    ]


def _tool_line(tools: list[ToolRow]) -> list[tuple[str, str]]:
    """The summary's row of tool calls: how many, and how many failed or were served from
    the cache; none when no agent called a tool."""
    calls, errors, cached, seconds = tool_totals(tools)
    if not calls:
        return []
    more = f"{errors:,} error(s)" + (f", {cached:,} served from cache" if cached else "")
    return [("tool calls", f"{calls:,} ({more}; {seconds:,.2f} s)")]


def _score_histogram(ran: list[Mapping[str, Any]]) -> Chart | None:
    scores = [float(r["final_score"]) for r in ran if r.get("final_score") is not None]
    if not scores:
        return None
    bins = [0] * 10
    for s in scores:
        bins[min(9, max(0, int(s * 10)))] += 1
    labels = [f"{i / 10:.1f}" for i in range(10)]
    return vbars(list(zip(labels, bins, strict=True)), "final score (bin start)", "scores")


def _score_by_round(ran: list[Mapping[str, Any]]) -> Chart | None:
    by_round: dict[int, list[float]] = {}
    for record in ran:
        for rnd in record.get("rounds") or []:
            if rnd.get("score") is not None:
                by_round.setdefault(int(rnd["round"]), []).append(float(rnd["score"]))
    if not by_round:
        return None
    return line([(n, sum(v) / len(v), len(v)) for n, v in sorted(by_round.items())])


def _rounds_to_approval(ran: list[Mapping[str, Any]]) -> Chart | None:
    rounds = Counter(int(r.get("n_rounds") or 0) for r in ran if r.get("status") == "approved")
    if not rounds:
        return None
    bars = [(str(n), rounds[n]) for n in range(1, max(rounds) + 1)]
    return vbars(bars, "rounds until approved", "approval")


def _costs(ran: list[Mapping[str, Any]]) -> list[tuple[str, float]]:
    return sorted(
        ((str(r.get("id")), float((r.get("usage") or {}).get("usd") or 0.0)) for r in ran),
        key=lambda item: -item[1],
    )


def _slowest(ran: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    timed = sorted(
        (r for r in ran if r.get("duration_s") is not None), key=lambda r: -float(r["duration_s"])
    )[:TOP]
    return [
        {
            "id": r.get("id"),
            "outcome": LABELS.get(r["status"], r["status"]),
            "rounds": r.get("n_rounds", 0),
            "time": f"{float(r['duration_s']):.2f} s",
            "cost": usd(float((r.get("usage") or {}).get("usd") or 0)),
        }
        for r in timed
    ]


def _batch_items(rows: list[Mapping[str, Any]]) -> list[tuple[str, str]]:
    def seen(get: Callable[[Mapping[str, Any]], Any]) -> str:
        values = dict.fromkeys(str(v) for v in map(get, rows) if v not in (None, ""))
        return ", ".join(values) or "-"

    created = [str(r["created_at"]) for r in rows if r.get("created_at")]
    finished = [str(r["finished_at"]) for r in rows if r.get("finished_at")]
    return [
        ("batch", seen(lambda r: r.get("batch_id"))),
        ("actor model", seen(lambda r: (r.get("models") or {}).get("actor"))),
        ("critic model", seen(lambda r: (r.get("models") or {}).get("critic"))),
        ("max rounds", seen(lambda r: (r.get("loop") or {}).get("max_rounds"))),
        ("approval threshold", seen(lambda r: (r.get("loop") or {}).get("approval_threshold"))),
        ("first submitted", readable_date(min(created)) if created else "-"),
        ("last finished", readable_date(max(finished)) if finished else "-"),
    ]


def _spend(rows: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    roles: dict[str, Counter[str]] = {}
    for record in rows:
        for role, used in ((record.get("usage") or {}).get("by_role") or {}).items():
            tally = roles.setdefault(role, Counter())
            for k in ("input_tokens", "output_tokens", "calls"):
                tally[k] += int(used.get(k) or 0)
            tally["usd_micro"] += round(float(used.get("usd") or 0) * 1_000_000)
    return [
        {
            "role": role,
            "calls": t["calls"],
            "input_tokens": t["input_tokens"],
            "output_tokens": t["output_tokens"],
            "usd": usd(t["usd_micro"] / 1_000_000),
        }
        for role, t in sorted(roles.items())
    ]
