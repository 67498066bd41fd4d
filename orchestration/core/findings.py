"""Critic findings with optional locations: ``{message, path?, line?, end_line?, severity?,
rule?}`` or a plain string (the seed's form). Pure, no I/O.

Model output is untrusted: every field is checked and bounded, and a bad field is dropped
with a note in the finding's message rather than losing the finding. See docs/cli.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Severity = Literal["error", "warning", "note"]

MESSAGE_MAX_CHARS = 4000
PATH_MAX_CHARS = 512
RULE_MAX_CHARS = 128
MAX_LINE = 10_000_000

_SEVERITIES: dict[str, Severity] = {
    "error": "error",
    "critical": "error",
    "high": "error",
    "blocker": "error",
    "major": "error",
    "warning": "warning",
    "warn": "warning",
    "medium": "warning",
    "minor": "note",
    "low": "note",
    "note": "note",
    "info": "note",
    "suggestion": "note",
}
_MESSAGE_KEYS = ("message", "description", "issue", "text")


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem the critic found; ``path``/``line`` say where when it knows."""

    message: str
    path: str | None = None
    line: int | None = None
    end_line: int | None = None
    severity: Severity = "warning"
    rule: str | None = None

    def as_text(self) -> str:
        """The finding as one issue string (``path:line: message``) for string views."""
        where = self.path or ""
        if where and self.line is not None:
            where += f":{self.line}"
            if self.end_line is not None and self.end_line != self.line:
                where += f"-{self.end_line}"
        return f"{where}: {self.message}" if where else self.message

    def as_dict(self) -> dict[str, Any]:
        """The finding as JSON-ready data (every key present, ``None`` when unknown)."""
        return dataclasses.asdict(self)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _get(obj: Mapping[str, Any], names: tuple[str, ...]) -> Any:
    lowered = {k.lower(): k for k in obj if isinstance(k, str)}
    for name in names:
        if name in lowered:
            return obj[lowered[name]]
    return None


def _line(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"not a line number: {value!r}")
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and 1 <= value <= MAX_LINE:
        return value
    raise ValueError(f"not a line number: {_clip(repr(value), 40)}")


def severity_of(value: object) -> Severity:
    """``error``, ``warning`` or ``note`` for what a critic wrote; ``warning`` by default."""
    if isinstance(value, str):
        return _SEVERITIES.get(value.strip().lower(), "warning")
    return "warning"


def parse_finding(item: object) -> Finding | None:
    """A :class:`Finding` from a string or an object; ``None`` when it says nothing.

    A bad field (a line that is not a positive integer, a path that is not a string) is
    dropped and named at the end of the message, so the finding is never lost. Never raises.
    """
    if item is None:
        return None
    if isinstance(item, str):
        text = item.strip()
        return Finding(_clip(text, MESSAGE_MAX_CHARS)) if text else None
    if not isinstance(item, Mapping):
        text = str(item).strip()
        return Finding(_clip(text, MESSAGE_MAX_CHARS)) if text else None
    message = _get(item, _MESSAGE_KEYS)
    if not isinstance(message, str) or not message.strip():
        return None if not item else Finding(_clip(str(dict(item)), MESSAGE_MAX_CHARS))
    bad: list[str] = []
    path = _get(item, ("path", "file"))
    if path is not None and not (isinstance(path, str) and path.strip()):
        bad.append("path")
        path = None
    lines: dict[str, int | None] = {}
    for key, names in (("line", ("line", "start_line")), ("end_line", ("end_line",))):
        try:
            lines[key] = _line(_get(item, names))
        except ValueError:
            bad.append(key)
            lines[key] = None
    line, end_line = lines["line"], lines["end_line"]
    if line is None or (end_line is not None and end_line < line):
        if end_line is not None and line is not None:
            bad.append("end_line")
        end_line = None
    rule = _get(item, ("rule", "rule_id"))
    if rule is not None and not isinstance(rule, str):
        bad.append("rule")
        rule = None
    text = message.strip()
    if bad:
        text += f" (ignored invalid {', '.join(bad)})"
    return Finding(
        message=_clip(text, MESSAGE_MAX_CHARS),
        path=_clip(path.strip(), PATH_MAX_CHARS) if path else None,
        line=line if path or line else None,
        end_line=end_line,
        severity=severity_of(_get(item, ("severity", "level"))),
        rule=_clip(rule.strip(), RULE_MAX_CHARS) if rule and rule.strip() else None,
    )


def parse_findings(raw: object) -> list[Finding]:
    """Findings from a critic's ``issues`` value (a list of strings/objects, or one)."""
    items = raw if isinstance(raw, (list, tuple)) else [raw]
    return [f for item in items if (f := parse_finding(item)) is not None]


def lines_in(line: int | None, end_line: int | None, text: str) -> tuple[int | None, int | None]:
    """``(line, end_line)`` checked against a file's ``text``: a line outside it gives
    ``(None, None)`` (a file-level finding), an end past it is cut to the last line."""
    count = len(text.splitlines()) or 1
    if line is None or line > count:
        return None, None
    return line, min(end_line, count) if end_line is not None else None


def locate(finding: Finding, files: Mapping[str, str]) -> Finding:
    """``finding`` with its lines checked against ``files`` (path -> text): a line outside
    the file makes it a file-level finding (lines dropped, the finding kept)."""
    if finding.path is None or finding.line is None or finding.path not in files:
        return finding
    line, end = lines_in(finding.line, finding.end_line, files[finding.path])
    if (line, end) == (finding.line, finding.end_line):
        return finding
    return dataclasses.replace(finding, line=line, end_line=end)
