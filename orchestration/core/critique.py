"""What the critic returns (:class:`CriticOutput`) and how its reply is read. Pure, no I/O.

Critic models are asked for strict JSON, but they wrap it in prose, put it in a code fence,
write the score on a 10-point scale, or return no JSON at all. :func:`parse_critique` reads
all of those and never raises, so a sloppy critic costs one round, not the whole run.
"""

from __future__ import annotations

import ast
import json
import re
from decimal import Decimal
from itertools import islice
from numbers import Real
from typing import Any, NamedTuple, TypeGuard

from pydantic import BaseModel, ConfigDict, Field


class CriticOutput(BaseModel):
    """The critic's verdict on one output."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    score: float = Field(ge=0.0, le=1.0)
    """Quality in [0.0, 1.0]; at or above the approval threshold the loop stops."""
    issues: list[str]
    """Specific problems the actor should address, one per entry."""
    summary: str = ""
    """One-line overall assessment, passed to the actor as ``{critique}``."""


# A number as critics write it: "8", "8.5", ".5", "-3", "1e-1".
_NUM = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_SCORE_STR = re.compile(
    rf"\s*(?P<num>{_NUM})\s*"
    rf"(?:(?P<pct>%)|(?:/|\bout\s+of\b)\s*(?P<den>{_NUM}))?\s*",
    re.IGNORECASE,
)
# Value part of a score written in prose; fed back to parse_score.
_VALUE = rf"{_NUM}\s*(?:%|(?:/|\bout\s+of\b)\s*{_NUM})?"
# Between the word and its value: punctuation and markdown, at most one linking word. Free
# text is not allowed there, so "the score reflects 3 bugs" does not read 3 as the score.
_PUNCT = r"""[\s*_:="'`\-\u2013\u2014]*?"""
_GAP = rf"{_PUNCT}(?:(?:is|was|of|at|would\s+be|will\s+be)\b{_PUNCT})?"
# "Score: 9/10", "score = 0.85", "**Rating:** 85%", '"score": 0.8' (a truncated JSON reply).
_SCORE_AFTER_WORD = re.compile(rf"\b(?:score|rating)s?\b{_GAP}(?P<val>{_VALUE})", re.IGNORECASE)
# "I'd give it 8/10 as a score": a fraction or percentage shortly before the word.
_SCORE_BEFORE_WORD = re.compile(
    rf"(?P<val>{_NUM}\s*(?:%|(?:/|\bout\s+of\b)\s*{_NUM}))[^\n]{{0,40}}?\b(?:score|rating)",
    re.IGNORECASE,
)
_FENCE = re.compile(r"```[ \t]*(?:json[c5]?)?[ \t]*\r?\n?(.*?)```", re.IGNORECASE | re.DOTALL)
_TRAILING_COMMA = re.compile(r",\s*([}\]])")
# Where a JSON object with keys can start, and where a Python-style dict literal can.
_OBJECT_START = re.compile(r'\{(?=\s*")')
_LITERAL_START = re.compile(r"\{(?=\s*[\"'])")

_SCORE_KEYS = ("score", "rating")
_ISSUE_TEXT_KEYS = ("description", "issue", "text", "message")
#: Bounds on the scan, so a hostile or huge reply still parses in milliseconds.
_STRICT_MAX_FAILURES = 1_000
_LENIENT_MAX_CHARS = 8_000
_LENIENT_MAX_TRIES = 20
_SUMMARY_MAX_CHARS = 200

_decoder = json.JSONDecoder()


#: What :func:`parse_score` reads, named in the issue added for a score it cannot read.
SCALES = "0-1, 0-10, 0-100, a fraction such as 7/10, or a percentage"
_SHOWN_MAX_CHARS = 40


def parse_score(value: object) -> float:
    """Normalise a score as a critic wrote it to a float in [0.0, 1.0].

    Numbers in [0, 1] are kept; (1, 10] is read on a 10-point scale and (10, 100] on a
    100-point one. Strings may hold a number (``" 9 "``), a fraction with any positive
    denominator (``"7/10"``, ``"3/5"``, ``"7 out of 10"``) or a percentage (``"85%"``).
    A value outside every one of those scales (``150``, ``"1000"``, ``1e9``, ``-3``,
    ``"12/10"``, ``"120%"``) is not a score: it is not clamped into range, so a critic
    that writes ``"score": 1000`` does not pass any threshold.

    Args:
        value: whatever the critic put in its score field.

    Returns:
        The score in [0.0, 1.0]; 0.0 for anything that is not a score (out of range,
        booleans, None, NaN/infinity, text). Never raises.
    """
    score = read_score(value)
    return 0.0 if score is None else score


def read_score(value: object) -> float | None:
    """:func:`parse_score`, but ``None`` for a value that is not a score on a known scale."""
    try:
        return _read_score(value)
    except Exception:  # a score must never crash the loop; garbage reads as "not approved"
        return None


def _read_score(value: object) -> float | None:
    # bool is an int subclass: True must not read as a perfect score.
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int) and not 0 <= value <= 100:
        return None  # float() of a huge int overflows; out of range anyway
    if isinstance(value, (Real, Decimal)):
        return _on_scale(float(value))
    if not isinstance(value, str):
        return None
    match = _SCORE_STR.fullmatch(value)
    if match is None:
        return None
    number = float(match["num"])
    if match["pct"]:
        return _in_range(number / 100.0)
    if match["den"] is not None:
        denominator = float(match["den"])
        return _in_range(number / denominator) if denominator > 0 else None
    return _on_scale(number)


def _on_scale(number: float) -> float | None:
    if 1.0 < number <= 10.0:
        return number / 10.0
    if 10.0 < number <= 100.0:
        return number / 100.0
    return _in_range(number)


def _in_range(number: float) -> float | None:
    # NaN fails both comparisons, so a non-finite score is no score at all.
    if 0.0 <= number <= 1.0:
        return number + 0.0  # -0.0 reads as 0.0
    return None


def unreadable_score_issue(value: object) -> str:
    """The issue recorded when the critic's score is not on any scale the parser reads."""
    try:
        shown = repr(value.strip() if isinstance(value, str) else value)
    except ValueError:  # an int too long to print
        shown = f"a {type(value).__name__} too long to show"
    if len(shown) > _SHOWN_MAX_CHARS:
        shown = shown[: _SHOWN_MAX_CHARS - 1] + "…"
    return f"unreadable score {shown}: not on any scale the parser reads ({SCALES}); read as 0.0"


class Reading(NamedTuple):
    """A critic reply as read: the critique, and whether it held a whole scored object."""

    critique: CriticOutput
    #: The reply holds a complete JSON object with a score key, so a reply cut at
    #: ``max_tokens`` still said everything it meant to (see :func:`loop.interruption`).
    complete: bool


def parse_critique(text: object) -> CriticOutput:
    """Read a critic's reply into a :class:`CriticOutput`. Never raises.

    The JSON object is looked for in a fenced code block first, then anywhere in the
    reply (the first object that parses and has a ``"score"`` or ``"rating"`` key wins).
    Trailing commas and Python-style single quotes are tolerated. With no such object the
    whole reply becomes the single issue, the summary is its first line and the score is
    read from the text (``Score: 9/10``), or is 0.0 when there is none. A score that is
    not on any scale :func:`parse_score` reads is 0.0, and an issue says so.

    Args:
        text: the critic's reply. Non-strings are converted with ``str()``; ``None`` and
            bytes that are not UTF-8 are handled too.

    Returns:
        The parsed critique.
    """
    return read_critique(text).critique


def read_critique(text: object) -> Reading:
    """:func:`parse_critique`, also saying whether the reply held a whole scored object."""
    try:
        reply = _as_text(text)
        found = _find_object(reply)
        if found is not None:
            return Reading(_from_object(found, reply), _has_score(found))
        return Reading(_from_prose(reply), False)
    except Exception as e:  # last line of defence: the loop must keep going
        issue = f"unreadable critic reply ({type(e).__name__})"
        return Reading(CriticOutput(score=0.0, issues=[issue]), False)


def read_object(obj: dict[str, Any]) -> Reading:
    """A critique from an already decoded object (a vendor's structured output), its
    score and issues read as in a reply. Never raises."""
    try:
        return Reading(_from_object(obj, ""), _has_score(obj))
    except Exception as e:  # last line of defence: the loop must keep going
        issue = f"unreadable critic reply ({type(e).__name__})"
        return Reading(CriticOutput(score=0.0, issues=[issue]), False)


def _as_text(text: object) -> str:
    if text is None:
        return ""
    if isinstance(text, (bytes, bytearray)):
        return bytes(text).decode("utf-8", errors="replace")
    return text if isinstance(text, str) else str(text)


def _find_object(reply: str) -> dict[str, Any] | None:
    stripped = reply.strip()
    # Fast path: the critic did as told and the whole reply is one JSON object.
    if stripped.startswith("{"):
        try:
            obj = json.loads(stripped)
        except (ValueError, RecursionError):
            pass
        else:
            if _has_score(obj):
                return obj
    # A fenced block is the critic's own statement of "this is the answer", so it wins
    # over objects quoted in the surrounding prose.
    fallback = None
    for text in (*_FENCE.findall(reply), reply):
        scored, with_issues = _scan(text)
        if scored is not None:
            return scored
        fallback = fallback or with_issues
    # No object with a score: an object with issues still beats reading prose.
    return fallback


def _scan(text: str) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The first object in ``text`` with a score, and the first with issues (fallback)."""
    with_issues = None

    def check(obj: object) -> bool:
        nonlocal with_issues
        if not isinstance(obj, dict):
            return False
        if _key(obj, _SCORE_KEYS) is not None:
            return True
        if with_issues is None and _key(obj, ("issues",)) is not None:
            with_issues = obj
        return False

    # raw_decode fails within a few characters on prose and code, and starting inside
    # objects also finds a score nested in a wrapper. A failure costs O(position) (the
    # error computes a line number), so only '{"' starts are tried and failures are capped.
    failures = 0
    for match in _OBJECT_START.finditer(text):
        try:
            obj, _ = _decoder.raw_decode(text, match.start())
        except (ValueError, RecursionError):  # RecursionError: nesting deeper than the stack
            failures += 1
            if failures >= _STRICT_MAX_FAILURES:
                break
            continue
        if check(obj):
            return obj, with_issues
    # The lenient pass walks characters in Python, so it only tries objects that open like
    # a dict literal ("{'" or '{"'), and only a bounded number of them.
    for match in islice(_LITERAL_START.finditer(text), _LENIENT_MAX_TRIES):
        obj = _lenient(text, match.start())
        if check(obj):
            return obj, with_issues
    return None, with_issues


def _lenient(text: str, start: int) -> dict[str, Any] | None:
    span = _balanced(text, start)
    if span is None:
        return None
    fixed = _TRAILING_COMMA.sub(r"\1", span)
    try:
        obj = json.loads(fixed)
    except (ValueError, RecursionError):
        try:
            # Single-quoted dicts are Python literals; literal_eval evaluates no code.
            obj = ast.literal_eval(span)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return None
    return obj if isinstance(obj, dict) else None


def _balanced(text: str, start: int) -> str | None:
    """The ``{...}`` starting at ``start``, skipping braces inside quoted strings."""
    depth = 0
    quote = ""
    escaped = False
    for i in range(start, min(len(text), start + _LENIENT_MAX_CHARS)):
        ch = text[i]
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start : i + 1]
    return None


def _has_score(obj: object) -> TypeGuard[dict[str, Any]]:
    return isinstance(obj, dict) and _key(obj, _SCORE_KEYS) is not None


def _key(obj: dict[str, Any], names: tuple[str, ...]) -> str | None:
    """The key of ``obj`` matching one of ``names`` (case-insensitive), in names' order."""
    lowered = {k.lower(): k for k in obj if isinstance(k, str)}
    for name in names:
        if name in lowered:
            return lowered[name]
    return None


def _from_object(obj: dict[str, Any], reply: str) -> CriticOutput:
    score_key = _key(obj, _SCORE_KEYS)
    if score_key is not None:
        score, unreadable = _score_of(obj[score_key])
    else:
        score, unreadable = _score_from_text(reply)
    issues_key = _key(obj, ("issues",))
    summary_key = _key(obj, ("summary",))
    summary = obj[summary_key] if summary_key is not None else None
    issues = _issues(obj[issues_key]) if issues_key is not None else []
    return CriticOutput(
        score=score,
        issues=issues + unreadable,
        summary="" if summary is None else str(summary).strip(),
    )


def _score_of(value: object) -> tuple[float, list[str]]:
    """The score and, when the value is not a score, the one issue saying so."""
    score = read_score(value)
    return (0.0, [unreadable_score_issue(value)]) if score is None else (score, [])


def _issues(raw: object) -> list[str]:
    items = raw if isinstance(raw, (list, tuple)) else [raw]
    issues = []
    for item in items:
        text = _issue_text(item).strip()
        if text:
            issues.append(text)
    return issues


def _issue_text(item: object) -> str:
    if item is None:
        return ""
    if isinstance(item, str):
        return item
    if isinstance(item, dict):
        key = _key(item, _ISSUE_TEXT_KEYS)
        text = item[key] if key is not None else None
        if isinstance(text, str) and text.strip():
            return text
    return str(item)


def _from_prose(reply: str) -> CriticOutput:
    stripped = reply.strip()
    if not stripped:
        return CriticOutput(score=0.0, issues=[], summary="")
    first_line = stripped.splitlines()[0].strip()
    if len(first_line) > _SUMMARY_MAX_CHARS:
        first_line = first_line[: _SUMMARY_MAX_CHARS - 1].rstrip() + "…"
    score, unreadable = _score_from_text(stripped)
    return CriticOutput(score=score, issues=[stripped, *unreadable], summary=first_line)


def _score_from_text(text: str) -> tuple[float, list[str]]:
    match = _SCORE_AFTER_WORD.search(text) or _SCORE_BEFORE_WORD.search(text)
    return _score_of(match["val"]) if match else (0.0, [])
