"""The HTML report of a batch: one self-contained page a reviewer triages from. Pure.

The inputs that need attention come first (:mod:`duet.report.inputs`), then the batch and
its charts (:mod:`duet.report.charts`). No script, style sheet or font is fetched, and every
text from a record (user input, model output) is escaped.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from duet.report.charts import ACCENT, esc, hbar_svg, line_svg, vbar_svg
from duet.report.inputs import (
    Triage,
    inputs_section,
    issues_section,
    reasons_section,
    usd,
)
from duet.report.records import LABELS, OUTCOMES, Summary, readable_date

COLOURS = {
    "approved": "#2e7d32",
    "max_rounds_reached": "#f9a825",
    "interrupted": "#8e24aa",
    "failed": "#c62828",
    "cancelled": "#757575",
    "rejected": "#d84315",
}
_TOP = 15  # rows in the cost and slowest-input charts
#: Inputs not approved linked from the summary, worst first.
_WORST_LINKED = 10


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
    sections = [
        _section("Summary", _summary_html(summary, ran) + _worst_links(triage)),
        _section("Inputs not approved", inputs_section(triage)),
        _section("Most frequent issues", issues_section(triage)),
        _section("Why inputs did not finish well", reasons_section(triage)),
        _section("Batch", _batch_html(rows)),
        _section("Outcomes", _outcomes_chart(summary)),
        _section("Final scores", _score_histogram(ran)),
        _section("Score by round", _score_by_round(ran)),
        _section("Rounds to approval", _rounds_to_approval(ran)),
        _section("Cost per input", _cost_chart(ran)),
        _section("Slowest inputs", _slowest_table(ran)),
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{esc(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        f"<h1>{esc(title)}</h1>\n" + "\n".join(sections) + "\n</body>\n</html>\n"
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
"""
)


def _section(heading: str, body: str) -> str:
    slug = heading.lower().replace(" ", "-")
    return f'<section id="{esc(slug)}">\n<h2>{esc(heading)}</h2>\n{body}\n</section>'


def _num(value: float, digits: int = 2) -> str:
    return f"{value:,.{digits}f}"


def _worst_links(triage: Triage) -> str:
    if not triage.worst:
        return ""
    links = " ".join(
        f'<a href="#{triage.anchor(r)}">{esc(triage.ref_of(r).label)}</a>'
        for r in triage.worst[:_WORST_LINKED]
    )
    more = len(triage.worst) - _WORST_LINKED
    return (
        f'<p><a href="#inputs-not-approved">{len(triage.worst):,} input(s) not approved</a>, '
        f"worst first: {links}"
        + (f' <span class="muted">and {more:,} more</span>' if more > 0 else "")
        + "</p><nav>Also: "
        '<a href="#most-frequent-issues">issues across inputs</a> · '
        '<a href="#why-inputs-did-not-finish-well">reasons</a> · <a href="#batch">batch</a> · '
        '<a href="#cost-per-input">cost</a></nav>'
    )


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
        ("cost", usd(summary.usd)),
        *(
            [
                (
                    "model-call cache",
                    f"{summary.cached_calls:,} calls served from cache, "
                    f"{usd(summary.saved_usd)} saved",
                )
            ]
            if summary.cached_calls
            else []
        ),
        ("mean run time", f"{sum(durations) / len(durations):.2f} s" if durations else "-"),
    ]
    body = "".join(f'<tr><th>{esc(k)}</th><td class="n">{esc(v)}</td></tr>' for k, v in items)
    warning = (
        f'<p class="simulated"><strong>Simulated review</strong>: {summary.simulated:,} run(s) '
        "had the offline <code>sim</code> model as critic; their verdicts, findings and costs "
        "are made up.</p>"
        if summary.simulated
        else ""
    )
    return f"{warning}<table>{body}</table>"


def _outcomes_chart(summary: Summary) -> str:
    bars = [(LABELS[o], summary.counts[o], COLOURS[o]) for o in OUTCOMES]
    return hbar_svg(bars, str, "outcomes")


def _score_histogram(ran: list[Mapping[str, Any]]) -> str:
    scores = [float(r["final_score"]) for r in ran if r.get("final_score") is not None]
    if not scores:
        return '<p class="muted">No scores yet.</p>'
    bins = [0] * 10
    for s in scores:
        bins[min(9, max(0, int(s * 10)))] += 1
    labels = [f"{i / 10:.1f}" for i in range(10)]
    return vbar_svg(list(zip(labels, bins, strict=True)), "final score (bin start)", "scores")


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
    return line_svg(points) + (
        '<table><tr><th class="n">round</th><th class="n">mean score</th>'
        f'<th class="n">runs</th></tr>{table}</table>'
    )


def _rounds_to_approval(ran: list[Mapping[str, Any]]) -> str:
    rounds = Counter(int(r.get("n_rounds") or 0) for r in ran if r.get("status") == "approved")
    if not rounds:
        return '<p class="muted">No input was approved.</p>'
    bars = [(str(n), rounds[n]) for n in range(1, max(rounds) + 1)]
    return vbar_svg(bars, "rounds until approved", "approval")


def _cost_chart(ran: list[Mapping[str, Any]]) -> str:
    costs = sorted(
        ((str(r.get("id")), float((r.get("usage") or {}).get("usd") or 0.0)) for r in ran),
        key=lambda item: -item[1],
    )
    if not costs:
        return '<p class="muted">No runs.</p>'
    total = sum(c for _, c in costs)
    note = (
        f"<p>Mean {usd(total / len(costs))} per input; the {min(_TOP, len(costs))} "
        "most expensive:</p>"
    )
    return note + hbar_svg([(i, c, ACCENT) for i, c in costs[:_TOP]], usd, "cost")


def _slowest_table(ran: list[Mapping[str, Any]]) -> str:
    timed = sorted(
        (r for r in ran if r.get("duration_s") is not None), key=lambda r: -float(r["duration_s"])
    )[:_TOP]
    if not timed:
        return '<p class="muted">No timings.</p>'
    rows = "".join(
        f"<tr><td>{esc(r.get('id'))}</td><td>{esc(LABELS.get(r['status'], r['status']))}</td>"
        f'<td class="n">{r.get("n_rounds", 0)}</td><td class="n">{float(r["duration_s"]):.2f} s</td>'
        f'<td class="n">{usd(float((r.get("usage") or {}).get("usd") or 0))}</td></tr>'
        for r in timed
    )
    return (
        '<table><tr><th>id</th><th>outcome</th><th class="n">rounds</th>'
        f'<th class="n">time</th><th class="n">cost</th></tr>{rows}</table>'
    )


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
    body = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in items)
    roles: dict[str, Counter[str]] = {}
    for record in rows:
        for role, used in ((record.get("usage") or {}).get("by_role") or {}).items():
            tally = roles.setdefault(role, Counter())
            for k in ("input_tokens", "output_tokens", "calls"):
                tally[k] += int(used.get(k) or 0)
            tally["usd_micro"] += round(float(used.get("usd") or 0) * 1_000_000)
    spend = "".join(
        f'<tr><td>{esc(role)}</td><td class="n">{t["calls"]:,}</td>'
        f'<td class="n">{t["input_tokens"]:,}</td><td class="n">{t["output_tokens"]:,}</td>'
        f'<td class="n">{usd(t["usd_micro"] / 1_000_000)}</td></tr>'
        for role, t in sorted(roles.items())
    )
    if spend:
        spend = (
            '<h3>Spend by role</h3><table><tr><th>role</th><th class="n">calls</th>'
            '<th class="n">input tokens</th><th class="n">output tokens</th>'
            f'<th class="n">cost</th></tr>{spend}</table>'
        )
    return f"<table>{body}</table>{spend}"
