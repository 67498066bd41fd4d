"""Findings as reviewdog's rdjson, GitHub workflow annotations and a Markdown PR comment. Pure."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from typing import Any

from duet.formats.findings import Finding
from orchestration.logjson import escape_unsafe

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
    """A workflow command's message, escaped as the runner requires, with every other
    control character a terminal acts on shown as a visible escape (``\\x1b``)."""
    return escape_unsafe(text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A"))


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


#: What opens a link, an image or a code span (and the backslash): shown as is, escaped.
_MARKUP = re.compile(r"([\\`\[\]!])")
#: Text a renderer would make a link or a mention of; a zero-width space after its first
#: character breaks it.
_LINKLIKE = re.compile(r"(?i)://|www\.|@")


def _flat(text: str) -> str:
    """One line with no control character a terminal acts on."""
    return escape_unsafe(" ".join(text.split()))


def _cell(text: str) -> str:
    """Model text as one table cell: one line, no HTML, no image, no link (nor text a
    renderer would make one), no table break, no @-mention: every character shown as is."""
    flat = _MARKUP.sub(r"\\\1", _flat(text))
    flat = flat.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _LINKLIKE.sub(lambda m: m[0][:1] + "\u200b" + m[0][1:], flat.replace("|", "\\|"))


def _code(text: str) -> str:
    """Text as one code span no backtick inside can end: its fence is longer than any
    backtick run in it (and padded where the text starts or ends with one)."""
    flat = _flat(text).replace("|", "\\|")
    ticks = "`" * (max((len(r) for r in re.findall(r"`+", flat)), default=0) + 1)
    pad = " " if flat[:1] == "`" or flat[-1:] == "`" or (flat[:1] == flat[-1:] == " ") else ""
    return f"{ticks}{pad}{flat}{pad}{ticks}"


def markdown_summary(records: list[dict[str, Any]], found: list[Finding]) -> str:
    """A PR comment: how many inputs were approved, then a table of findings."""
    statuses = Counter(str(r.get("status")) for r in records)
    counts = Counter(f.severity for f in found)
    head = ", ".join(f"{n} {_cell(s)}" for s, n in sorted(statuses.items())) or "nothing reviewed"
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
            out.append(f"| {f.severity} | {_code(where)} | {_cell(f.message)} |")
    return "\n".join(out) + "\n"
