"""Inline SVG charts for the HTML report: horizontal bars, a histogram, a line. Pure.

Each function returns one ``<svg>`` element as text, every label HTML-escaped, so the page
fetches nothing and needs no script.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from typing import Any

#: The colour of bars and lines that stand for no outcome in particular.
ACCENT = "#1565c0"


def esc(value: Any) -> str:
    """Text made safe inside HTML elements and quoted attributes."""
    return html.escape(str(value), quote=True)


def hbar_svg(bars: Sequence[tuple[str, float, str]], fmt: Callable[[Any], str], name: str) -> str:
    """Horizontal bars, one row each: label, bar, value."""
    label_w, bar_w, row_h = 200, 520, 24
    top = max((v for _, v, _ in bars), default=0) or 1
    height = row_h * len(bars) + 8
    parts = [
        f'<svg class="chart {name}" xmlns="http://www.w3.org/2000/svg" width="{label_w + bar_w + 120}" '
        f'height="{height}" role="img" aria-label="{esc(name)}">'
    ]
    for i, (label, value, colour) in enumerate(bars):
        y = 4 + i * row_h
        width = bar_w * value / top
        short = label if len(label) <= 28 else label[:27] + "…"
        parts.append(
            f'<text x="{label_w - 8}" y="{y + 16}" text-anchor="end">{esc(short)}</text>'
            f'<rect x="{label_w}" y="{y + 3}" width="{width:.1f}" height="{row_h - 8}" fill="{colour}">'
            f"<title>{esc(label)}: {esc(fmt(value))}</title></rect>"
            f'<text x="{label_w + width + 6:.1f}" y="{y + 16}">{esc(fmt(value))}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def vbar_svg(bars: list[tuple[str, int]], axis: str, name: str) -> str:
    """Vertical bars (a histogram), with counts above and labels below."""
    width, height, pad = 640, 220, 30
    top = max((v for _, v in bars), default=0) or 1
    slot = (width - 2 * pad) / max(len(bars), 1)
    parts = [
        f'<svg class="chart {name}" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height + 40}" role="img" aria-label="{esc(axis)}">'
    ]
    for i, (label, value) in enumerate(bars):
        h = (height - 2 * pad) * value / top
        x = pad + i * slot
        y = height - pad - h
        parts.append(
            f'<rect x="{x + 4:.1f}" y="{y:.1f}" width="{slot - 8:.1f}" height="{h:.1f}" fill="{ACCENT}">'
            f"<title>{esc(label)}: {value}</title></rect>"
            f'<text x="{x + slot / 2:.1f}" y="{y - 4:.1f}" text-anchor="middle">{value}</text>'
            f'<text x="{x + slot / 2:.1f}" y="{height - pad + 16}" text-anchor="middle">{esc(label)}</text>'
        )
    parts.append(
        f'<text x="{width / 2:.0f}" y="{height + 24}" text-anchor="middle">{esc(axis)}</text></svg>'
    )
    return "".join(parts)


def line_svg(points: list[tuple[int, float, int]]) -> str:
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
            ACCENT, " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)
        ),
    ]
    for (n, score, count), (x, y) in zip(points, coords, strict=True):
        parts.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{ACCENT}">'
            f"<title>round {n}: mean {score:.2f} over {count} runs</title></circle>"
            f'<text x="{x:.1f}" y="{y - 8:.1f}" text-anchor="middle">{score:.2f}</text>'
            f'<text x="{x:.1f}" y="{height - pad + 16}" text-anchor="middle">round {n}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)
