"""What a reviewer triages a batch from, shaped from its result records. Pure, no HTML.

The inputs not approved worst first (:func:`worst_first`), the final-round issues of every
input grouped by similarity of wording (:func:`group_issues`), the reasons inputs did not
finish well grouped by kind (:func:`group_reasons`), and what an output changed from its
input (:func:`input_diff`). The HTML report (:mod:`duet.report.html`) only renders these.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from duet.formats.patch import fenced_file
from duet.intake.files import DIRECTORY_PROMPT_TEMPLATE
from duet.report.records import reason_of

#: Two issues whose normalised words overlap this much (Jaccard) are one issue.
SAME_WORDS = 0.6
#: ...or whose normalised text is this alike (difflib ratio).
SAME_TEXT = 0.8
#: Distinct wordings compared with each other at most; rarer ones each stay a group of their
#: own, so a batch with a great many distinct issues is grouped in bounded time.
MAX_COMPARED = 2000


def final_issues(record: Mapping[str, Any]) -> list[str]:
    """The issues of a record's final critique round (those a later round fixed are gone)."""
    if record.get("issues") is not None:
        return [str(i) for i in record["issues"]]
    rounds = record.get("rounds") or []
    return [str(i) for i in (rounds[-1].get("issues") or [])] if rounds else []


def worst_first(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The records not approved, worst first: no score at all (never ran, or failed before a
    critique), then by last score ascending, then by reason, then in input order."""
    bad = [r for r in records if r.get("status") != "approved"]

    def key(pair: tuple[int, Mapping[str, Any]]) -> tuple[bool, float, str, int]:
        n, record = pair
        score = record.get("final_score")
        return (score is not None, float(score or 0.0), reason_of(record) or "", n)

    return [record for _, record in sorted(enumerate(bad), key=key)]


# --- issues grouped by similarity ------------------------------------------------------
_LOCATION = re.compile(r"^[^\s:][^:\n]*:\d+(?:-\d+)?:\s*(?:(?:error|warning|note):\s*)?", re.I)
_QUOTES = str.maketrans({c: "'" for c in '‘’‚‛“”„‟`´"'})
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_NON_WORD = re.compile(r"[^\w']+")


def normalise_issue(text: str) -> str:
    """An issue's wording with what varies between inputs taken out: a leading
    ``PATH:LINE:`` location, case, quote style, numbers (each ``0``) and punctuation."""
    text = _LOCATION.sub("", text.strip(), count=1).casefold().translate(_QUOTES)
    return " ".join(_NON_WORD.sub(" ", _NUMBER.sub("0", text)).split())


def similar(a: str, b: str) -> bool:
    """Whether two normalised issues say the same thing: most of their words are shared,
    or their text is nearly the same."""
    if a == b:
        return True
    words_a, words_b = set(a.split()), set(b.split())
    if words_a and words_b and len(words_a & words_b) / len(words_a | words_b) >= SAME_WORDS:
        return True
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    return matcher.real_quick_ratio() >= SAME_TEXT and matcher.ratio() >= SAME_TEXT


@dataclass
class IssueGroup:
    """Issues of several inputs that say the same thing."""

    #: The wording shown: the one most inputs used.
    text: str
    #: The inputs (their keys) with an issue in the group, in the order first met.
    inputs: list[str] = field(default_factory=list)
    #: Every distinct wording in the group, the shown one first.
    wordings: list[str] = field(default_factory=list)


def group_issues(items: Iterable[tuple[str, str]]) -> list[IssueGroup]:
    """``(input key, issue)`` pairs as groups of similar issues, most inputs first.

    Each distinct wording (after :func:`normalise_issue`) joins the first group, taken in
    order of how many inputs raised it, whose shown wording is :func:`similar` to it; an
    input counts once per group however many of its issues fall in it.
    """
    by_key: dict[str, dict[str, list[str]]] = {}  # normalised -> wording -> inputs
    for input_key, issue in items:
        norm = normalise_issue(issue)
        if norm:
            inputs = by_key.setdefault(norm, {}).setdefault(" ".join(issue.split()), [])
            if input_key not in inputs:
                inputs.append(input_key)

    def reach(norm: str) -> int:
        return len({i for inputs in by_key[norm].values() for i in inputs})

    order = sorted(by_key, key=lambda k: -reach(k))  # stable: first met first among equals
    groups: list[tuple[str, dict[str, list[str]]]] = []
    for n, norm in enumerate(order):
        home = None
        if n < MAX_COMPARED:
            home = next((g for g in groups if similar(g[0], norm)), None)
        if home is None:
            groups.append((norm, dict(by_key[norm])))
        else:
            for wording, inputs in by_key[norm].items():
                home[1].setdefault(wording, []).extend(inputs)
    result = []
    for _, wordings in groups:
        ranked = sorted(wordings, key=lambda w: -len(wordings[w]))
        inputs = list(dict.fromkeys(i for w in wordings for i in wordings[w]))
        result.append(IssueGroup(ranked[0], inputs, ranked))
    return sorted(result, key=lambda g: -len(g.inputs))


# --- reasons grouped by kind ----------------------------------------------------------
_ROUND = re.compile(r":round_\d+:")


def reason_kind(reason: str) -> str:
    """What a reason says with its particulars taken out: the round of a step's reason
    (``actor:round_2:missing_key`` -> ``actor:round_*:missing_key``) and every number
    (``prompt is 51,200 characters`` -> ``prompt is N characters``)."""
    return _NUMBER.sub("N", _ROUND.sub(":round_*:", reason))


@dataclass
class ReasonGroup:
    """Inputs that did not finish well for the same kind of reason."""

    kind: str
    #: The inputs (their keys), in the order given.
    inputs: list[str] = field(default_factory=list)
    #: The distinct reasons of the kind, as they were written, first met first.
    examples: list[str] = field(default_factory=list)


def group_reasons(items: Iterable[tuple[str, str]]) -> list[ReasonGroup]:
    """``(input key, reason)`` pairs grouped by :func:`reason_kind`, most inputs first."""
    groups: dict[str, ReasonGroup] = {}
    for input_key, reason in items:
        kind = reason_kind(reason)
        group = groups.setdefault(kind, ReasonGroup(kind))
        group.inputs.append(input_key)
        if reason not in group.examples:
            group.examples.append(reason)
    return sorted(groups.values(), key=lambda g: -len(g.inputs))


# --- what the output changed ------------------------------------------------------------
def input_text(prompt: str, input_id: str | None) -> str:
    """The text an input gave, without the header a directory's prompt template adds."""
    header = DIRECTORY_PROMPT_TEMPLATE.split("{prompt}", 1)[0]
    header = header.replace("{input_id}", str(input_id))
    return prompt[len(header) :] if input_id is not None and prompt.startswith(header) else prompt


def input_diff(prompt: str, output: str, input_id: str | None = None) -> list[str]:
    """A unified diff from an input to its output, one line per item (no line ends).

    When the output holds a fenced code block (a fix, by the actor's convention) the code is
    compared: the block's content against the input's own first code block, or the whole
    input when it has none (a file of a directory).
    """
    before, after = input_text(prompt, input_id), output
    new = fenced_file(output)
    if new is not None:
        after = new
        before = fenced_file(before) or before
    lines = difflib.unified_diff(
        before.splitlines(), after.splitlines(), "input", "output", lineterm=""
    )
    return list(lines)


def clipped(text: str, limit: int) -> tuple[str, int]:
    """``text`` cut to ``limit`` characters, and how many were cut."""
    return (text, 0) if len(text) <= limit else (text[:limit], len(text) - limit)


def clipped_lines(lines: Sequence[str], limit: int) -> tuple[Sequence[str], int]:
    """The first ``limit`` lines, and how many were left out."""
    return (lines, 0) if len(lines) <= limit else (lines[:limit], len(lines) - limit)
