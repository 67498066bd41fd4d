"""SARIF 2.1.0 as GitHub code scanning takes it: one run, always, even with no results. Pure.

GitHub answers 422 to a log with no run, so a clean review still uploads one run with no
results, which is also what closes the alerts of an earlier upload. The run's
``automationDetails.id`` is ``CATEGORY/`` (the config's name or ``--category``, never a
model's: changing the critic must not orphan the open alerts), and each result has a
``partialFingerprints`` entry computed from its rule, its file and the text of its line
(not the line's number), so an alert follows its code when lines move across pushes.
GitHub's upload limits (:data:`MAX_RESULTS` results a run, 10 MB gzipped) are kept by
keeping the worst findings and counting the rest in the run's properties.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import quote

from duet.formats.findings import SEVERITIES, Finding

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
VERSION = "2.1.0"
#: The category (``automationDetails.id`` up to its last ``/``) when none is given.
DEFAULT_CATEGORY = "duet"
#: GitHub's hard limit on results in one run (docs: "SARIF support for code scanning").
MAX_RESULTS = 25_000
#: A finding's message is cut at this many characters: 25,000 results then stay well
#: under GitHub's 10 MB (gzipped) file limit.
MAX_MESSAGE_CHARS = 4_000
#: The ``partialFingerprints`` key of Duet's own fingerprint (versioned: a change of
#: how it is computed gets a new key rather than new alerts under the old one).
FINGERPRINT_KEY = "duetFindingHash/v1"
_LEVEL = {"error": "error", "warning": "warning", "note": "note"}
_DRIVE = re.compile(r"[A-Za-z]:")
_SLUG = re.compile(r"[^a-z0-9._/-]+")


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


def rule_id(rule: str) -> str:
    """A rule as an id a reader can filter on: lower case, words joined by ``-``
    (``SQL Injection`` -> ``sql-injection``), at most 64 characters."""
    slug = _SLUG.sub("-", rule.strip().lower()).strip("-/")[:64].strip("-/")
    return slug or "duet/review"


def fingerprint(f: Finding, line_text: str | None) -> str:
    """A hash of what identifies a finding whatever line it moved to: its rule, its file
    and the text of its first line (whitespace-insensitive); the message when the line is
    not known."""
    anchor = " ".join(line_text.split()) if line_text is not None else f.message.strip()
    key = "\0".join((rule_id(f.rule), f.path or f.input_id, anchor))
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:32]


def _uri(f: Finding) -> str:
    return f.path or f.input_id


def _location(f: Finding) -> list[dict[str, Any]]:
    uri = artifact_uri(_uri(f))
    if uri is None:
        return []
    physical: dict[str, Any] = {"artifactLocation": {"uri": uri, "uriBaseId": "%SRCROOT%"}}
    if f.line is not None:
        region: dict[str, Any] = {"startLine": f.line}
        if f.end_line is not None:
            region["endLine"] = f.end_line
        physical["region"] = region
    return [{"physicalLocation": physical}]


def worst_first(found: Iterable[Finding]) -> list[Finding]:
    """Findings by severity (errors first), then file and line: what a reader sees first."""
    return sorted(
        found,
        key=lambda f: (SEVERITIES.index(f.severity), _uri(f), f.line or 0, f.message),
    )


def sarif_log(
    found: Iterable[Finding],
    *,
    version: str = "0",
    category: str = DEFAULT_CATEGORY,
    critics: Iterable[str] = (),
    simulated: bool = False,
    read: Callable[[str], str | None] | None = None,
) -> dict[str, Any]:
    """A SARIF log of ``found``: one run of the tool ``duet``, with or without results.

    Args:
        category: the code scanning category (``automationDetails.id`` is ``CATEGORY/``).
        critics: the critic models that reviewed (the tool's properties name them).
        simulated: the critic was the offline ``sim`` model: said in the properties.
        read: a reviewed file's text by path (None when absent), for fingerprints.
    """
    items = worst_first(found)
    # GitHub refuses a result with no location: one whose path is no place in the
    # repository (``../x``, ``/etc``) is left out of the log and counted; the comment,
    # annotations and report still show it.
    placed = [f for f in items if artifact_uri(_uri(f)) is not None]
    kept, omitted = placed[:MAX_RESULTS], placed[MAX_RESULTS:]
    critic_names = sorted(set(critics) | {f.critic for f in kept})
    run = _run(kept, omitted, version, category, critic_names, simulated, read)
    if len(placed) < len(items):
        run["tool"]["driver"]["properties"]["unlocatedResults"] = len(items) - len(placed)
    return {"$schema": SCHEMA, "version": VERSION, "runs": [run]}


def _run(
    items: list[Finding],
    omitted: list[Finding],
    version: str,
    category: str,
    critics: list[str],
    simulated: bool,
    read: Callable[[str], str | None] | None,
) -> dict[str, Any]:
    worst: dict[str, str] = {}
    for f in items:
        rid = rule_id(f.rule)
        if rid not in worst or SEVERITIES.index(f.severity) < SEVERITIES.index(worst[rid]):
            worst[rid] = f.severity
    rules = sorted(worst)
    lines = _LineReader(read)
    seen: Counter[str] = Counter()
    results = []
    for f in items:
        rid = rule_id(f.rule)
        digest = fingerprint(f, lines.text(f.path, f.line))
        seen[digest] += 1  # the same finding twice in a file: told apart by occurrence
        message = f.message or "(no message)"
        if len(message) > MAX_MESSAGE_CHARS:
            message = message[: MAX_MESSAGE_CHARS - 1] + "…"
        results.append(
            {
                "ruleId": rid,
                "ruleIndex": rules.index(rid),
                "level": _LEVEL[f.severity],
                "message": {"text": message},
                "locations": _location(f),
                "partialFingerprints": {FINGERPRINT_KEY: f"{digest}:{seen[digest]}"},
                "properties": {"input": f.input_id, "critic": f.critic},
            }
        )
    properties: dict[str, Any] = {"critics": critics, "simulated": simulated}
    if omitted:
        properties["omittedResults"] = len(omitted)
    return {
        "tool": {
            "driver": {
                "name": "duet",
                "version": version,
                "rules": [
                    {
                        "id": r,
                        "name": r,
                        "shortDescription": {"text": r},
                        "defaultConfiguration": {"level": _LEVEL[worst[r]]},
                        "properties": {"tags": ["duet", worst[r]]},
                    }
                    for r in rules
                ],
                "properties": properties,
            }
        },
        "automationDetails": {"id": f"{category.strip().rstrip('/') or DEFAULT_CATEGORY}/"},
        "columnKind": "unicodeCodePoints",
        "results": results,
    }


class _LineReader:
    """The text of one line of a reviewed file, each file read once."""

    def __init__(self, read: Callable[[str], str | None] | None) -> None:
        self.read = read
        self.files: dict[str, list[str] | None] = {}

    def text(self, path: str | None, line: int | None) -> str | None:
        if self.read is None or path is None or line is None:
            return None
        if path not in self.files:
            content = self.read(path)
            self.files[path] = None if content is None else content.splitlines()
        lines = self.files[path]
        return lines[line - 1] if lines is not None and 0 < line <= len(lines) else None
