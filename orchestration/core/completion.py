"""What a model call returns, whoever the vendor: :class:`Completion`, and what it is sent. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, TypedDict

#: Normalised reasons a completion stopped. ``max_tokens`` interrupts the agent.
StopReason = Literal["end", "max_tokens", "other"]


class Message(TypedDict):
    """One turn of a conversation."""

    role: Literal["user", "assistant"]
    content: str


@dataclass(frozen=True, slots=True)
class Completion:
    """What a model call returns, whoever the vendor."""

    text: str
    input_tokens: int
    output_tokens: int
    stop_reason: StopReason
    #: The part of ``input_tokens`` read from a prompt cache.
    cached_input_tokens: int = 0
    #: The part of ``input_tokens`` written to a prompt cache (Anthropic).
    cache_write_tokens: int = 0
    #: The vendor's own stop reason, kept for diagnostics (``length``, ``end_turn``...).
    raw_stop_reason: str | None = None
    #: The critique as the vendor returned it natively (asked with ``structured=True``),
    #: or None when the reply did not hold it (then ``text`` is parsed).
    structured: dict[str, Any] | None = None
