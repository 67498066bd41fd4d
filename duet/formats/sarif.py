"""SARIF 2.1.0 (what GitHub code scanning uploads): one run per critic model. Pure."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote

from duet.formats.findings import Finding

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
VERSION = "2.1.0"
_LEVEL = {"error": "error", "warning": "warning", "note": "note"}
_DRIVE = re.compile(r"[A-Za-z]:")


def artifact_uri(path: str) -> str | None:
    """``path`` as a relative URI reference under the repository root, percent-encoded;
    None for anything else (absolute, ``..``, ``.`` or empty segments, a drive, a
    backslash, a NUL), so a finding cannot point a viewer outside the repository."""
    parts = path.split("/")
    if "\0" in path or "\\" in path or _DRIVE.match(path):
        return None
    if any(part in ("", ".", "..") for part in parts):
        return None  # also "/abs", "a//b" and every "scheme://..."
    return quote(path, safe="/", errors="surrogateescape")


def _location(f: Finding) -> list[dict[str, Any]]:
    uri = artifact_uri(f.path) if f.path else None
    if uri is None:
        return []
    physical: dict[str, Any] = {"artifactLocation": {"uri": uri}}
    if f.line is not None:
        region: dict[str, Any] = {"startLine": f.line}
        if f.end_line is not None:
            region["endLine"] = f.end_line
        physical["region"] = region
    return [{"physicalLocation": physical}]


def sarif_log(found: Iterable[Finding], *, version: str = "0") -> dict[str, Any]:
    """A SARIF log of ``found``, a run per critic model (the tool's name says which)."""
    runs: dict[str, list[Finding]] = {}
    for f in found:
        runs.setdefault(f.critic, []).append(f)
    return {
        "$schema": SCHEMA,
        "version": VERSION,
        "runs": [_run(critic, items, version) for critic, items in runs.items()],
    }


def _run(critic: str, items: list[Finding], version: str) -> dict[str, Any]:
    rules = sorted({f.rule for f in items})
    return {
        "tool": {
            "driver": {
                "name": "duet",
                "version": version,
                "rules": [{"id": r, "shortDescription": {"text": r}} for r in rules],
                "properties": {"critic": critic},
            }
        },
        "automationDetails": {"id": f"duet/{critic}/"},
        "results": [
            {
                "ruleId": f.rule,
                "ruleIndex": rules.index(f.rule),
                "level": _LEVEL[f.severity],
                "message": {"text": f.message or "(no message)"},
                "locations": _location(f),
                "properties": {"input": f.input_id},
            }
            for f in items
        ],
    }
