"""The dead-letter stream: broker messages no worker could take, kept with the reason.

A message that is not JSON or lacks Celery's envelope (``orchestration.core.envelope``)
is moved here by the broker channel instead of ending the worker; ``duet dead`` lists,
shows and purges them. A capped stream (:data:`MAX_LETTERS`, texts cut at
:data:`MAX_TEXT`), so a flood of junk cannot fill Redis.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestration.state import keys

#: Most letters kept (older ones are trimmed, approximately, as XADD MAXLEN ~ does).
MAX_LETTERS = 10_000
#: Most characters of a message's text kept.
MAX_TEXT = 64 * 1024


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One dead-lettered message."""

    #: The stream entry id (``<ms>-<n>``): when it was moved here.
    id: str
    #: The broker queue it was popped from.
    queue: str
    #: Why no worker could take it.
    reason: str
    #: Its text as popped (cut at :data:`MAX_TEXT`).
    text: str
    #: Its full length in characters.
    size: int


def add(pipe: Any, queue: str, text: str, reason: str) -> None:
    """Queue the XADD of one letter on ``pipe`` (a pipeline or client)."""
    pipe.xadd(
        keys.dead_letters(),
        {"queue": queue, "reason": reason, "text": text[:MAX_TEXT], "size": len(text)},
        maxlen=MAX_LETTERS,
        approximate=True,
    )


def _letter(entry_id: Any, fields: dict[Any, Any]) -> DeadLetter:
    f = {_s(k): _s(v) for k, v in fields.items()}
    return DeadLetter(
        _s(entry_id),
        f.get("queue", ""),
        f.get("reason", ""),
        f.get("text", ""),
        int(f.get("size") or 0),
    )


def _s(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def newest(client: Any, limit: int = 100) -> list[DeadLetter]:
    """Up to ``limit`` letters, newest first."""
    return [_letter(i, f) for i, f in client.xrevrange(keys.dead_letters(), count=limit)]


def count(client: Any) -> int:
    """How many letters are kept."""
    return int(client.xlen(keys.dead_letters()))


def get(client: Any, letter_id: str) -> DeadLetter | None:
    """The letter with stream id ``letter_id``, or None."""
    found = client.xrange(keys.dead_letters(), letter_id, letter_id, count=1)
    return _letter(*found[0]) if found else None


def purge(client: Any, letter_ids: list[str] | None = None) -> int:
    """Delete the letters ``letter_ids`` (all when None); how many were deleted."""
    if letter_ids is None:
        n = count(client)
        client.delete(keys.dead_letters())
        return n
    return int(client.xdel(keys.dead_letters(), *letter_ids)) if letter_ids else 0


__all__ = ["DeadLetter", "MAX_LETTERS", "MAX_TEXT", "add", "count", "get", "newest", "purge"]
