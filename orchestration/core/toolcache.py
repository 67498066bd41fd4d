"""The tool-result cache's pure part: the key of a pure tool's call and its stored entry.

A pure tool's result depends on the tool (its name and a fingerprint of its definition),
its arguments and whatever it reads (for the review toolset: the repository and the
reviewed commit). The key is the sha256 of canonical JSON of those, prefixed ``tool:`` so
it never meets a model call's key in the store the two caches share.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

#: Bumped when what a key covers or what an entry holds changes (old entries then miss).
KEY_VERSION = 1
#: What every tool-result key starts with (``duet cache stats`` counts them with the rest).
PREFIX = "tool:"


@dataclass(frozen=True, slots=True)
class ToolIdentity:
    """What determines one pure call's result: the tool, its definition's fingerprint,
    the arguments as the tool's schema checked them, and what the tool reads."""

    tool: str
    fingerprint: str
    arguments: dict[str, Any]
    #: JSON-able description of what the call reads besides its arguments (None: nothing).
    reads: Any = None


@dataclass(frozen=True, slots=True)
class CachedResult:
    """A stored result: its text (scrubbed and capped as stored on the turn) and the
    seconds the call took when it ran."""

    result: str
    seconds: float


def canonical(value: Any) -> str:
    """``value`` as canonical JSON (sorted keys, no spaces); a value JSON cannot hold is
    keyed by its ``str``."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def tool_key(identity: ToolIdentity) -> str:
    """The cache key of a call: :data:`PREFIX` and the hex sha256 of canonical JSON."""
    doc = {
        "v": KEY_VERSION,
        "tool": identity.tool,
        "fingerprint": identity.fingerprint,
        "arguments": identity.arguments,
        "reads": identity.reads,
    }
    return PREFIX + hashlib.sha256(canonical(doc).encode()).hexdigest()


def entry_json(result: str, seconds: float) -> str:
    """The stored form of a result."""
    return canonical({"result": result, "seconds": round(seconds, 4)})


def entry_from(text: str | bytes) -> CachedResult | None:
    """The result stored as ``text``; None when it is not one (a damaged or old entry)."""
    try:
        data = json.loads(text)
        found = CachedResult(str(data["result"]), float(data.get("seconds") or 0.0))
    except (ValueError, TypeError, KeyError):
        return None
    return found if isinstance(data["result"], str) else None


__all__ = [
    "KEY_VERSION",
    "PREFIX",
    "CachedResult",
    "ToolIdentity",
    "canonical",
    "entry_from",
    "entry_json",
    "tool_key",
]
