"""Findings as reviewdog's rdjson, GitHub workflow annotations and a Markdown PR comment. Pure."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from typing import Any

from duet.formats.findings import SEVERITIES, Finding
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


#: The hidden first line of Duet's PR comment: the workflow finds its comment by it and
#: edits that one comment on every push instead of adding another.
MARKER = "<!-- duet-review -->"
#: The hidden line that carries the last reviewed commit (``duet review --since``).
SHA_MARKER = "<!-- duet-review-sha: {sha} -->"
_SHA_LINE = re.compile(r"<!-- duet-review-sha: ([0-9a-f]{7,64}) -->")
#: GitHub refuses a comment body longer than this many characters.
MAX_COMMENT_CHARS = 65_536
#: A finding's text is cut at this many characters in the comment.
MAX_CELL_CHARS = 600


def reviewed_sha(comment: str) -> str | None:
    """The last reviewed commit a PR comment's marker carries, or None."""
    found = _SHA_LINE.search(comment)
    return found[1] if found else None


#: What opens a link, an image or a code span (and the backslash): shown as is, escaped.
_MARKUP = re.compile(r"([\\`\[\]!])")
#: Text a renderer would make a link or a mention of; a zero-width space after its first
#: character breaks it.
_LINKLIKE = re.compile(r"(?i)://|www\.|@")


def _flat(text: str) -> str:
    """One line, cut at :data:`MAX_CELL_CHARS`, with no control character a terminal acts on."""
    flat = " ".join(text.split())
    if len(flat) > MAX_CELL_CHARS:
        flat = flat[: MAX_CELL_CHARS - 1] + "…"
    return escape_unsafe(flat)


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


def merged(found: Iterable[Finding]) -> list[tuple[Finding, int]]:
    """Identical findings (severity, place, message) as one, with how many there were,
    worst first."""
    counts: Counter[tuple[str, str, int, str]] = Counter()
    first: dict[tuple[str, str, int, str], Finding] = {}
    for f in found:
        key = (f.severity, f.path or f.input_id, f.line or 0, " ".join(f.message.split()))
        counts[key] += 1
        first.setdefault(key, f)
    order = sorted(counts, key=lambda k: (SEVERITIES.index(k[0]), k[1], k[2], k[3]))
    return [(first[k], counts[k]) for k in order]


def markdown_summary(
    records: list[dict[str, Any]],
    found: list[Finding],
    *,
    simulated: bool = False,
    link: str | None = None,
    limit: int = MAX_COMMENT_CHARS,
) -> str:
    """A PR comment under ``limit`` characters: the hidden marker (and the reviewed commit),
    how many inputs were approved, then the findings worst first, identical ones merged;
    those that do not fit are counted, with a pointer to the full list."""
    statuses = Counter(str(r.get("status")) for r in records)
    counts = Counter(f.severity for f in found)
    head = ", ".join(f"{n} {_cell(s)}" for s, n in sorted(statuses.items())) or "nothing reviewed"
    out = [MARKER]
    sha, reviewed = _reviewed(records)
    if sha:
        out.append(SHA_MARKER.format(sha=sha))
    out += ["## Duet code review", ""]
    if simulated:
        out += [
            "> **Simulated review**: the critic was Duet's offline `sim` model, not a real "
            "one; its verdicts, findings and costs are made up.",
            "",
        ]
    if reviewed:
        out.append(f"Reviewed {_code(reviewed)}.")
    out += [
        f"{len(records)} input(s) reviewed: {head}.",
        f"Findings: {counts['error']} error(s), {counts['warning']} warning(s), "
        f"{counts['note']} note(s).",
    ]
    rows = merged(found)
    if rows:
        out += ["", "| severity | where | finding |", "|---|---|---|"]
    where_all = (
        f"the full list: {link}" if link else "the full list: the SARIF upload (code scanning)"
    )
    size = sum(len(line) + 1 for line in out)
    reserve = 200 + len(where_all)
    shown = 0
    for f, n in rows:
        where = f.path or f.input_id
        if f.line is not None:
            where += f":{f.line}"
        times = f" (×{n})" if n > 1 else ""
        row = f"| {f.severity} | {_code(where)} | {_cell(f.message)}{times} |"
        if size + len(row) + 1 + reserve > limit:
            break
        out.append(row)
        size += len(row) + 1
        shown += 1
    if shown < len(rows):
        rest = Counter(f.severity for f, _ in rows[shown:])
        out += [
            "",
            f"… and {len(rows) - shown} more finding(s) not shown here "
            f"({rest['error']} error(s), {rest['warning']} warning(s), {rest['note']} note(s)): "
            f"see {where_all}.",
        ]
    return "\n".join(out) + "\n"


def _reviewed(records: list[dict[str, Any]]) -> tuple[str | None, str | None]:
    """The commit a ``--git`` review read (its HEAD) and its range, from the records."""
    for record in records:
        meta = record.get("metadata")
        if isinstance(meta, dict) and isinstance(meta.get("head_sha"), str):
            sha = meta["head_sha"]
            return (sha if re.fullmatch(r"[0-9a-f]{7,64}", sha) else None), str(
                meta.get("git_range") or ""
            ) or None
    return None, None
