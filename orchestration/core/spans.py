"""Where JSON objects are in free text, found in one pass and decoded once. Pure, no I/O.

A critic's reply is prose, code and JSON mixed. Decoding from every ``{`` is quadratic
(each failed attempt rescans the rest of the text), so :func:`find_objects` walks the
text once by bracket and string state, notes every balanced ``{...}``, and decodes only
the outermost ones; an outer span that is not an object (prose in braces) gives way to
the spans inside it. Nesting beyond ``jsonlimits.MAX_DEPTH`` or a span over :data:`MAX_CHARS`
is never decoded: such a span is skipped, with a note saying why.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from typing import Any

# The same depth limit as every other reader of untrusted JSON.
from orchestration.core.jsonlimits import MAX_DEPTH, depth_reason

#: Longest span decoded, in characters.
MAX_CHARS = 100_000

# The only characters the walk looks at: braces, brackets, quotes, escapes, line ends.
_SPECIAL = re.compile(r"[{}\[\]\"'\\\n]")
# A span that opens like a Python dict literal may hold single-quoted strings.
_LITERAL_OPEN = re.compile(r"\{\s*'")
# A span that opens like a JSON object: a key in quotes first.
_OBJECT_OPEN = re.compile(r"\{\s*[\"']")
_TRAILING_COMMA = re.compile(r",\s*([}\]])")


@dataclass(frozen=True, slots=True)
class Span:
    """A balanced ``text[start:end]`` that opens with ``{`` and closes with ``}``."""

    start: int
    end: int
    #: Nesting of braces and brackets inside it, itself counted (``{}`` is 1).
    depth: int
    #: Opened like a Python dict literal (``{'``), so single quotes delimit strings.
    literal: bool
    #: The balanced spans directly inside it, in order.
    children: tuple[Span, ...]


@dataclass(frozen=True, slots=True)
class Located:
    """An object decoded from ``text[start:end]``."""

    start: int
    end: int
    value: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Found:
    """What :func:`find_objects` found, and the work it took."""

    #: Decoded objects, outermost only, in text order.
    objects: tuple[Located, ...]
    #: Why spans were skipped undecoded (too deep, too long), each reason once.
    skipped: tuple[str, ...]
    #: Where those spans are: ``(start, end)`` pairs, in order.
    ignored: tuple[tuple[int, int], ...]
    #: Spans that open like a JSON object (``{"`` or ``{'``) yet decode as none (a string
    #: with an unescaped quote): ``(start, end)`` pairs, in order. The spans inside them
    #: were tried in their place.
    undecodable: tuple[tuple[int, int], ...]
    #: Characters the walk stopped at (at most the length of the text).
    steps: int
    #: Characters handed to a decoder (at most :data:`MAX_DEPTH` times the text's length).
    decoded: int


@dataclass(slots=True)
class _Frame:
    start: int
    literal: bool
    base: int
    peak: int
    children: list[Span] = field(default_factory=list)


def scan(text: str) -> tuple[list[Span], int]:
    """The maximal balanced spans of ``text`` in order, and the steps the walk took.

    Strings (``"..."``, and ``'...'`` inside a span opened as a dict literal) hide the
    braces in them; a line end closes a string, so one stray quote in prose costs at most
    the rest of its line. A ``{`` never closed leaves the spans inside it maximal.
    """
    top: list[Span] = []
    stack: list[_Frame] = []
    level = 0  # braces and brackets open inside the outermost frame
    quote = ""
    skip = -1
    steps = 0
    for match in _SPECIAL.finditer(text):
        steps += 1
        i = match.start()
        ch = text[i]
        if i < skip and ch != "\n":  # the character after a backslash in a string
            continue
        if quote:
            if ch == "\n" or ch == quote:
                quote = ""
            elif ch == "\\":
                skip = i + 2
            continue
        if ch == "{":
            level += 1
            literal = (stack[-1].literal if stack else False) or bool(_LITERAL_OPEN.match(text, i))
            stack.append(_Frame(i, literal, level, level))
        elif not stack:
            continue  # outside every span only an opening brace matters
        elif ch == "}":
            frame = stack.pop()
            level = frame.base - 1
            span = Span(
                frame.start,
                i + 1,
                frame.peak - frame.base + 1,
                frame.literal,
                tuple(frame.children),
            )
            if stack:
                stack[-1].children.append(span)
                stack[-1].peak = max(stack[-1].peak, frame.peak)
            else:
                top.append(span)
        elif ch == "[":
            level += 1
            stack[-1].peak = max(stack[-1].peak, level)
        elif ch == "]":
            level = max(level - 1, stack[-1].base)
        elif ch == '"' or (ch == "'" and stack[-1].literal):
            quote = ch
    for frame in stack:  # never closed: what closed inside it stands on its own
        top.extend(frame.children)
    return top, steps


def find_objects(text: str) -> Found:
    """Every outermost JSON object (or Python dict literal) in ``text``, decoded once."""
    spans, steps = scan(text)
    objects: list[Located] = []
    skipped: dict[str, None] = {}
    ignored: list[tuple[int, int]] = []
    undecodable: list[tuple[int, int]] = []
    decoded = 0
    # Innermost spans are only tried when the span around them is not an object; a
    # work list (not recursion) keeps a long chain of such spans off the call stack.
    todo = list(reversed(spans))
    while todo:
        span = todo.pop()
        if span.depth > MAX_DEPTH:
            skipped[f"a JSON object {depth_reason()} was ignored"] = None
            ignored.append((span.start, span.end))
            continue
        size = span.end - span.start
        if size > MAX_CHARS:
            skipped[f"a JSON object over {MAX_CHARS:,} characters was ignored"] = None
            ignored.append((span.start, span.end))
            continue
        decoded += size
        value = _decode(text[span.start : span.end])
        if isinstance(value, dict):
            objects.append(Located(span.start, span.end, value))
        else:
            if _OBJECT_OPEN.match(text, span.start):
                undecodable.append((span.start, span.end))
            todo.extend(reversed(span.children))
    return Found(
        tuple(objects),
        tuple(skipped),
        tuple(sorted(ignored)),
        tuple(sorted(undecodable)),
        steps,
        decoded,
    )


def _decode(span: str) -> object:
    """``span`` as JSON, else with trailing commas dropped, else as a Python literal."""
    for attempt in (span, _TRAILING_COMMA.sub(r"\1", span)):
        try:
            return json.loads(attempt)
        except (ValueError, RecursionError):
            pass
    try:
        # A dict literal with single quotes; literal_eval evaluates no code.
        return ast.literal_eval(span)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
