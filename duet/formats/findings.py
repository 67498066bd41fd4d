"""The findings of a results record: its ``findings`` objects, or its issue strings.

A record may carry ``findings`` (``message``, ``path``, ``line``, ``end_line``,
``severity``, ``rule``); without them each issue string is a finding on the record's
file. A string ``PATH:LINE: [SEVERITY:] message`` (the compiler convention) gives its
location and severity. Pure.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from orchestration.core.findings import lines_in

SEVERITIES = ("error", "warning", "note")
#: Severity of a finding that names none.
DEFAULT_SEVERITY = "warning"
#: Rule id of a finding that names none.
DEFAULT_RULE = "duet/review"
_LOCATED = re.compile(
    r"^(?P<path>[^\s:][^:\n]*):(?P<line>\d+)(?:-(?P<end>\d+))?:\s*"
    r"(?:(?P<severity>error|warning|note):\s*)?(?P<message>.+)$",
    re.S | re.I,
)


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem found, where it is and how bad."""

    input_id: str
    message: str
    path: str | None
    line: int | None
    end_line: int | None
    severity: str
    rule: str
    critic: str


def record_path(record: dict[str, Any]) -> str | None:
    """The file a record reviewed: its git metadata's path, else its id without ``#hunkN``."""
    meta = record.get("metadata") or {}
    path = meta.get("path") if isinstance(meta, dict) else None
    if isinstance(path, str) and path:
        return path
    rid = record.get("id")
    return str(rid).split("#hunk", 1)[0] if rid not in (None, "") else None


def simulated(model: str) -> bool:
    """Whether ``model`` is the offline simulator (``sim``, ``sim:critic?...``): nothing it
    says was read by a real model."""
    return model == "sim" or model.startswith(("sim:", "sim?"))


def critics(records: Iterable[dict[str, Any]]) -> list[str]:
    """The critic models of ``records`` (rejected inputs, which ran nothing, name none)."""
    return sorted({critic_of(r) for r in records if r.get("models")})


def critic_of(record: dict[str, Any]) -> str:
    models = record.get("models") or {}
    return str(models.get("critic") or "unknown") if isinstance(models, dict) else "unknown"


def _line(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def _severity(value: Any) -> str:
    text = str(value).lower() if value is not None else ""
    return text if text in SEVERITIES else DEFAULT_SEVERITY


def _from_string(record: dict[str, Any], issue: str) -> Finding:
    found = _LOCATED.match(issue.strip())
    base = record_path(record)
    if found is None:
        return Finding(
            str(record.get("id")),
            issue,
            base,
            None,
            None,
            DEFAULT_SEVERITY,
            DEFAULT_RULE,
            critic_of(record),
        )
    line = int(found["line"])
    end = int(found["end"]) if found["end"] else None
    return Finding(
        str(record.get("id")),
        found["message"].strip(),
        found["path"].strip(),
        line,
        end if end is not None and end >= line else None,
        _severity(found["severity"]),
        DEFAULT_RULE,
        critic_of(record),
    )


def _from_object(record: dict[str, Any], obj: dict[str, Any]) -> Finding:
    path = obj.get("path") if isinstance(obj.get("path"), str) and obj.get("path") else None
    line = _line(obj.get("line"))
    end = _line(obj.get("end_line"))
    raw_rule = obj.get("rule")
    rule = raw_rule if isinstance(raw_rule, str) and raw_rule else DEFAULT_RULE
    return Finding(
        str(record.get("id")),
        str(obj.get("message") or ""),
        path or record_path(record),
        line,
        end if line is not None and end is not None and end >= line else None,
        _severity(obj.get("severity")),
        rule,
        critic_of(record),
    )


def _issues(record: dict[str, Any], everything: bool) -> Iterable[Any]:
    if not everything:
        return record.get("findings") or record.get("issues") or []
    rounds = record.get("rounds") or []
    return [i for r in rounds for i in (r.get("findings") or r.get("issues") or [])]


def findings(records: Iterable[dict[str, Any]], *, everything: bool = False) -> Iterator[Finding]:
    """The final round's findings of each record not approved; every round's of every
    record with ``everything``."""
    for record in records:
        if not everything and record.get("status") == "approved":
            continue
        for issue in _issues(record, everything):
            if isinstance(issue, dict):
                yield _from_object(record, issue)
            elif isinstance(issue, str) and issue.strip():
                yield _from_string(record, issue)


def in_files(found: Iterable[Finding], read: Callable[[str], str | None]) -> Iterator[Finding]:
    """``found`` with each line checked against its file (``read(path)``, None when it is
    not there): a line outside the file keeps the finding, at file level, never drops it."""
    texts: dict[str, str | None] = {}
    for finding in found:
        if finding.path is None or finding.line is None:
            yield finding
            continue
        if finding.path not in texts:
            texts[finding.path] = read(finding.path)
        text = texts[finding.path]
        if text is None:
            yield finding
            continue
        line, end = lines_in(finding.line, finding.end_line, text)
        yield dataclasses.replace(finding, line=line, end_line=end)


def at_least(severity: str, threshold: str) -> bool:
    """Whether ``severity`` is ``threshold`` or worse."""
    return SEVERITIES.index(severity) <= SEVERITIES.index(threshold)
