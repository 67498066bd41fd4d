"""How deep JSON text nests, found in one linear scan before it is parsed.

``json.loads`` recurses once per level: a line of user data nested a thousand deep ends
the whole process with RecursionError. Every reader of user JSON asks :func:`too_deep`
first, so such a line is a bad input with a reason, and the scan costs O(n) on any text.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

#: Deepest nesting of arrays and objects accepted in user JSON (metadata, records).
MAX_DEPTH = 64
#: What the scan looks at: brackets, and quotes and backslashes to skip strings.
_TOKENS = re.compile(r'[\[\]{}"\\]')


def too_deep(text: str, limit: int = MAX_DEPTH) -> bool:
    """Whether ``text`` nests arrays or objects deeper than ``limit`` (brackets inside
    strings do not count). Malformed text is scanned all the same; the parser says what
    else is wrong with it."""
    if text.count("[") + text.count("{") <= limit:
        return False  # the usual case: too few openers to nest that deep
    depth, in_string, escaped_at = 0, False, -1
    for match in _TOKENS.finditer(text):
        at, c = match.start(), match.group()
        if at == escaped_at:
            continue
        if in_string:
            if c == "\\":
                escaped_at = at + 1
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
            if depth > limit:
                return True
        elif c in "]}":
            depth -= 1
    return False


def value_too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether a value given as Python objects (a library caller's metadata) nests
    mappings or lists deeper than ``limit``; a cycle counts as too deep. Walked without
    recursion, stopping below ``limit``."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth >= limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def depth_reason(limit: int = MAX_DEPTH) -> str:
    """The words for a too-deep text, the same wherever it is found."""
    return f"nested deeper than {limit} levels"
