"""Findings as reviewdog's rdjson, GitHub workflow annotations and a Markdown PR comment. Pure."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from duet.formats.findings import Finding

_RD_SEVERITY = {"error": "ERROR", "warning": "WARNING", "note": "INFO"}
_GH_COMMAND = {"error": "error", "warning": "warning", "note": "notice"}


def rdjson(found: Iterable[Finding]) -> dict[str, Any]:
    """reviewdog's Diagnostic format (``-f=rdjson``): a result of diagnostics."""
    diagnostics = []
    for f in found:
        diag: dict[str, Any] = {
            "message": f.message,
            "severity": _RD_SEVERITY[f.severity],
            "code": {"value": f.rule},
            "source": {"name": f"duet ({f.critic})"},
        }
        if f.path:
            location: dict[str, Any] = {"path": f.path}
            if f.line is not None:
                location["range"] = {"start": {"line": f.line}}
                if f.end_line is not None:
                    location["range"]["end"] = {"line": f.end_line}
            diag["location"] = location
        diagnostics.append(diag)
    return {"source": {"name": "duet"}, "diagnostics": diagnostics}


def escape_data(text: str) -> str:
    """A workflow command's message, escaped as the runner requires."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """A workflow command's property value: the message escapes plus ``:`` and ``,``."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def github_annotations(found: Iterable[Finding]) -> str:
    """``::error file=...,line=...::message`` lines, one per finding."""
    lines = []
    for f in found:
        props = []
        if f.path:
            props.append(f"file={escape_property(f.path)}")
            if f.line is not None:
                props.append(f"line={f.line}")
                if f.end_line is not None:
                    props.append(f"endLine={f.end_line}")
        props.append(f"title={escape_property(f'duet {f.rule}')}")
        lines.append(f"::{_GH_COMMAND[f.severity]} {','.join(props)}::{escape_data(f.message)}")
    return "".join(line + "\n" for line in lines)


def _cell(text: str) -> str:
    """Model text as one table cell: one line, no HTML, no table breaks, no @-mentions."""
    flat = " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
    return flat.replace("@", "@\u200b")


def markdown_summary(records: list[dict[str, Any]], found: list[Finding]) -> str:
    """A PR comment: how many inputs were approved, then a table of findings."""
    statuses = Counter(str(r.get("status")) for r in records)
    counts = Counter(f.severity for f in found)
    head = ", ".join(f"{n} {s}" for s, n in sorted(statuses.items())) or "nothing reviewed"
    out = [
        "## Duet code review",
        "",
        f"{len(records)} input(s) reviewed: {head}.",
        f"Findings: {counts['error']} error(s), {counts['warning']} warning(s), "
        f"{counts['note']} note(s).",
    ]
    if found:
        out += ["", "| severity | where | finding |", "|---|---|---|"]
        for f in found:
            where = f.path or f.input_id
            if f.line is not None:
                where += f":{f.line}"
            out.append(f"| {f.severity} | `{_cell(where)}` | {_cell(f.message)} |")
    return "\n".join(out) + "\n"
