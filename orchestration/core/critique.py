"""What the critic returns (:class:`CriticOutput`) and how its reply is read. Pure, no I/O.

Critic models are asked for strict JSON, but they wrap it in prose, put it in a code fence,
write the score on a 10-point scale, quote the output they review, or return no JSON at
all. :func:`parse_critique` reads all of those and never raises, so a sloppy critic costs
one round, not the whole run. The verdict is the critic's *last* JSON object: text it quotes
comes before it (or between the run's markers, see :mod:`orchestration.core.quoting`, or
between backticks), so nothing in the reviewed output can stand in for it. It is read
strictly: prose after it never changes its score, and a verdict that does not decode is an
unparseable verdict (0.0), never an object quoted inside it. See docs/verdicts.md.
"""

from __future__ import annotations

import re
from decimal import Decimal
from numbers import Real
from typing import Any, NamedTuple, TypeGuard

from pydantic import BaseModel, ConfigDict, Field

from orchestration.core.findings import Finding, parse_findings
from orchestration.core.quoting import unquoted
from orchestration.core.spans import Located, find_objects


class CriticOutput(BaseModel):
    """The critic's verdict on one output."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    score: float = Field(ge=0.0, le=1.0)
    """Quality in [0.0, 1.0]; at or above the approval threshold the loop stops."""
    issues: list[str]
    """Specific problems the actor should address, one per entry."""
    summary: str = ""
    """One-line overall assessment, passed to the actor as ``{critique}``."""
    findings: list[Finding] = []
    """Every issue as a :class:`Finding` when the critic gave any with a location,
    severity or rule (:mod:`orchestration.core.findings`); ``issues`` holds each as text."""


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
# The value must not start inside a longer number: trying every digit of a long run as a
# start, each failing only after the whole run, made a reply of digits quadratic.
_SCORE_BEFORE_WORD = re.compile(
    rf"(?<![\d.])(?P<val>{_NUM}\s*(?:%|(?:/|\bout\s+of\b)\s*{_NUM}))"
    rf"[^\n]{{0,40}}?\b(?:score|rating)",
    re.IGNORECASE,
)

_SCORE_KEYS = ("score", "rating")
# A score key as a JSON object writes it: what makes an undecodable object a verdict.
_SCORE_KEY_WRITTEN = re.compile(r"""["'](?:score|rating)["']\s*:""", re.IGNORECASE)
# Inline code: text between single backticks on one line.
_CODE_SPAN = re.compile(r"`[^`\n]+`")
#: The one issue of a reply whose JSON verdict does not decode (read as 0.0, never as an
#: object quoted inside it).
UNPARSEABLE_VERDICT = (
    "unparseable verdict: the critic's JSON verdict is not valid JSON (a quote inside a "
    "string not escaped?); read as 0.0"
)
_SUMMARY_MAX_CHARS = 200


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
    #: The verdict is a complete JSON object with a score key, so a reply cut at
    #: ``max_tokens`` still said everything it meant to (see :func:`loop.interruption`).
    complete: bool


def parse_critique(text: object, boundary: str | None = None) -> CriticOutput:
    """Read a critic's reply into a :class:`CriticOutput`. Never raises.

    The verdict is the *last* complete JSON object in the reply with a ``"score"`` or
    ``"rating"`` key (at its top or nested in a wrapper), fenced or not: a critic quotes
    the output it reviews before it gives its verdict. Prose after that object never
    changes its score (an issue notes a different score it names). An object between
    backticks on one line is quoted, and text between the run's ``boundary`` markers is
    quoted and never read. A JSON verdict that does not decode (a string holding an
    unescaped quote) is an unparseable verdict: score 0.0 and the issue
    :data:`UNPARSEABLE_VERDICT`, never an object found inside it. Objects with
    different scores add an issue saying so; an object nested too deep or too long is
    not decoded, and an issue says so. Trailing commas and Python-style single quotes are
    tolerated. With no scored object the whole reply becomes the single issue, the
    summary is its first line and the score is the last one written in the text
    (``Score: 9/10``), or 0.0 when there is none. A score that is not on any scale
    :func:`parse_score` reads is 0.0, and an issue says so.

    Args:
        text: the critic's reply. Non-strings are converted with ``str()``; ``None`` and
            bytes that are not UTF-8 are handled too.
        boundary: the run's quoting token (see :mod:`orchestration.core.quoting`), if any.

    Returns:
        The parsed critique.
    """
    return read_critique(text, boundary).critique


def read_critique(text: object, boundary: str | None = None) -> Reading:
    """:func:`parse_critique`, also saying whether the reply held a whole scored object."""
    try:
        return _read(unquoted(_as_text(text), boundary))
    except Exception as e:  # last line of defence: the loop must keep going
        issue = f"unreadable critic reply ({type(e).__name__})"
        return Reading(CriticOutput(score=0.0, issues=[issue]), False)


def _read(reply: str) -> Reading:
    found = find_objects(reply)
    notes = list(found.skipped)
    # What was too deep or too long to decode is no verdict, nor is a score written in it.
    reply = _blanked(reply, found.ignored)
    inline = _code_spans(reply)
    broken = [
        b
        for b in found.undecodable
        if _SCORE_KEY_WRITTEN.search(reply, b[0], b[1]) and not _inside_any(b, inline)
    ]
    # An object quoted inline (`...`) or inside a verdict that did not decode is no verdict.
    quoted = [*inline, *broken]
    objects = tuple(o for o in found.objects if not _inside(o, quoted))
    verdicts = [(loc, v) for loc in objects if (v := _scored(loc.value)) is not None]
    if broken and (not verdicts or broken[-1][0] > verdicts[-1][0].start):
        return Reading(CriticOutput(score=0.0, issues=[UNPARSEABLE_VERDICT, *notes]), False)
    if not verdicts:
        with_issues = [o.value for o in objects if _key(o.value, ("issues",)) is not None]
        critique = _from_object(with_issues[-1], reply) if with_issues else _from_prose(reply)
        return Reading(_with_notes(critique, notes), False)
    last, verdict = verdicts[-1]
    scores = [read_score(v[_key(v, _SCORE_KEYS) or ""]) for _, v in verdicts]
    critique = _from_object(verdict, reply)
    shown = list(dict.fromkeys(f"{s:g}" for s in scores if s is not None))
    if len(shown) > 1:
        notes.insert(
            0,
            f"the reply held conflicting scores ({', '.join(shown)}); the "
            f"critic's last one, {critique.score:g}, was read as its verdict",
        )
    # Prose after the verdict never changes it ("...and the score would be 0.95").
    prose = read_score(_last_prose_score(_after(reply, last, objects)))
    if prose is not None and prose != critique.score:
        notes.append(
            f"a score written after the critic's JSON verdict ({prose:g}) was not read; "
            f"the verdict's {critique.score:g} stands"
        )
    return Reading(_with_notes(critique, notes), True)


def _code_spans(reply: str) -> list[tuple[int, int]]:
    """Where ``reply`` quotes inline, between backticks on one line."""
    return [m.span() for m in _CODE_SPAN.finditer(reply)]


def _inside(obj: Located, spans: list[tuple[int, int]]) -> bool:
    """Whether ``obj`` lies within one of ``spans`` (and is not that span itself)."""
    return _inside_any((obj.start, obj.end), spans)


def _inside_any(span: tuple[int, int], spans: list[tuple[int, int]]) -> bool:
    """Whether ``span`` lies within one of ``spans`` (and is not that span itself)."""
    return any(start <= span[0] and span[1] <= end and (start, end) != span for start, end in spans)


def _scored(value: dict[str, Any]) -> dict[str, Any] | None:
    """``value`` when it has a score, else the first object nested in it that has one."""
    todo: list[Any] = [value]
    while todo:
        item = todo.pop()
        if isinstance(item, dict):
            if _has_score(item):
                return item
            todo.extend(reversed(list(item.values())))
        elif isinstance(item, list):
            todo.extend(reversed(item))
    return None


def _after(reply: str, last: Located, objects: tuple[Located, ...]) -> str:
    """The reply after ``last``, leaving out the objects that follow it."""
    parts, pos = [], last.end
    for obj in objects:
        if obj.start >= pos:
            parts.append(reply[pos : obj.start])
            pos = obj.end
    parts.append(reply[pos:])
    return "\n".join(parts)


def _blanked(reply: str, spans: tuple[tuple[int, int], ...]) -> str:
    """``reply`` with each of ``spans`` turned to spaces (the positions stay)."""
    if not spans:
        return reply
    parts, pos = [], 0
    for start, end in spans:
        parts += [reply[pos:start], " " * (end - start)]
        pos = end
    parts.append(reply[pos:])
    return "".join(parts)


def _with_notes(critique: CriticOutput, notes: list[str]) -> CriticOutput:
    if not notes:
        return critique
    return critique.model_copy(update={"issues": [*critique.issues, *notes]})


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
    findings = parse_findings(obj[issues_key]) if issues_key is not None else []
    return CriticOutput(
        score=score,
        issues=[f.as_text() for f in findings] + unreadable,
        summary="" if summary is None else str(summary).strip(),
        # Only located findings are kept as objects: string issues stay the seed's shape.
        findings=findings if any(f != Finding(f.message) for f in findings) else [],
    )


def _score_of(value: object) -> tuple[float, list[str]]:
    """The score and, when the value is not a score, the one issue saying so."""
    score = read_score(value)
    return (0.0, [unreadable_score_issue(value)]) if score is None else (score, [])


def _from_prose(reply: str, score_text: str | None = None) -> CriticOutput:
    """The whole reply as the one issue; the score read from ``score_text`` (default: the
    reply)."""
    stripped = reply.strip()
    if not stripped:
        return CriticOutput(score=0.0, issues=[], summary="")
    first_line = stripped.splitlines()[0].strip()
    if len(first_line) > _SUMMARY_MAX_CHARS:
        first_line = first_line[: _SUMMARY_MAX_CHARS - 1].rstrip() + "…"
    score, unreadable = _score_from_text(stripped if score_text is None else score_text)
    return CriticOutput(score=score, issues=[stripped, *unreadable], summary=first_line)


def _score_from_text(text: str) -> tuple[float, list[str]]:
    value = _last_prose_score(text)
    return _score_of(value) if value is not None else (0.0, [])


def _last_prose_score(text: str) -> str | None:
    """The score written last in ``text`` (``Score: 9/10``, ``8/10 as a score``), as
    written; None when there is none."""
    best: re.Match[str] | None = None
    for pattern in (_SCORE_AFTER_WORD, _SCORE_BEFORE_WORD):
        for match in pattern.finditer(text):
            if best is None or match.start("val") > best.start("val"):
                best = match
    return None if best is None else best["val"]
