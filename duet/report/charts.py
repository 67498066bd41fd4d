"""Chart geometry for the HTML report: horizontal bars, a histogram, a line. Pure.

Each function turns numbers into the coordinates and labels of one inline SVG chart; the
markup (and every label's escaping) is the template's (``templates/charts.html.j2``), so the
page fetches nothing and needs no script.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

#: The colour of bars and lines that stand for no outcome in particular.
ACCENT = "#1565c0"
#: Longest bar label shown whole; a longer one is cut with an ellipsis (the tooltip keeps it).
LABEL_CHARS = 28


@dataclass(frozen=True)
class Bar:
    """One bar of a chart: where it is drawn, its label, value text and colour."""

    x: float
    y: float
    width: float
    height: float
    label: str
    short: str
    value: str
    colour: str


@dataclass(frozen=True)
class Chart:
    """One SVG chart: its size, CSS name, accessible label, bars and (a line chart) points."""

    name: str
    label: str
    width: float
    height: float
    bars: tuple[Bar, ...] = ()
    axis: str = ""
    axis_y: float = 0.0
    points: tuple[tuple[int, float, int, float, float], ...] = ()
    pad: float = 0.0


def hbars(bars: Sequence[tuple[str, float, str]], fmt: Callable[[Any], str], name: str) -> Chart:
    """Horizontal bars, one row each: label, bar, value."""
    label_w, bar_w, row_h = 200, 520, 24
    top = max((v for _, v, _ in bars), default=0) or 1
    rows = tuple(
        Bar(
            x=label_w,
            y=4 + i * row_h,
            width=bar_w * value / top,
            height=row_h - 8,
            label=label,
            short=label if len(label) <= LABEL_CHARS else label[: LABEL_CHARS - 1] + "…",
            value=fmt(value),
            colour=colour,
        )
        for i, (label, value, colour) in enumerate(bars)
    )
    return Chart(name, name, label_w + bar_w + 120, row_h * len(bars) + 8, rows)


def vbars(bars: Sequence[tuple[str, int]], axis: str, name: str) -> Chart:
    """Vertical bars (a histogram), with counts above and labels below."""
    width, height, pad = 640, 220, 30
    top = max((v for _, v in bars), default=0) or 1
    slot = (width - 2 * pad) / max(len(bars), 1)
    rows = []
    for i, (label, value) in enumerate(bars):
        h = (height - 2 * pad) * value / top
        x = pad + i * slot
        rows.append(Bar(x, height - pad - h, slot, h, label, label, str(value), ACCENT))
    return Chart(name, axis, width, height + 40, tuple(rows), axis, height - pad, pad=pad)


def line(points: Sequence[tuple[int, float, int]]) -> Chart:
    """Mean score (0..1) against round number, as a polyline with labelled points."""
    width, height, pad = 640, 220, 40
    xs = [p[0] for p in points]
    span = max(max(xs) - min(xs), 1)

    def at(n: int, score: float) -> tuple[float, float]:
        x = pad + (width - 2 * pad) * (n - min(xs)) / span
        return x, height - pad - (height - 2 * pad) * max(0.0, min(1.0, score))

    placed = tuple((n, s, c, *at(n, s)) for n, s, c in points)
    return Chart("rounds", "mean score by round", width, height, points=placed, pad=pad)
