"""What a model call returns, whoever the vendor: :class:`Completion`, and what it is sent. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, TypedDict

from orchestration.core.ratelimit import VendorLimits

#: Normalised reasons a completion stopped. ``max_tokens`` interrupts the agent, and so
#: does every reason in :data:`REFUSED`.
StopReason = Literal["end", "max_tokens", "other", "refusal", "content_filter", "context_window"]

#: The model refused, the vendor's filter stopped the reply, or the conversation did not
#: fit the context window: an outcome, never an answer (its text goes to the run's error).
REFUSED: frozenset[str] = frozenset({"refusal", "content_filter", "context_window"})
#: Stop reasons whose text is no whole answer, so never a conversation turn.
UNFINISHED: frozenset[str] = REFUSED | {"max_tokens"}
#: What a run's error says before the model's own text, per :data:`REFUSED` reason.
REFUSAL_WORDS: dict[str, str] = {
    "refusal": "the model refused",
    "content_filter": "the vendor's content filter stopped the reply",
    "context_window": "the conversation does not fit the model's context window",
}


def refusal_error(stop_reason: str, text: str) -> str:
    """The run error of an answer stopped for ``stop_reason`` (in :data:`REFUSED`)."""
    words = REFUSAL_WORDS[stop_reason]
    return f"{words}: {text}" if text.strip() else words


def refusal_line(reason: str | None, error: str | None) -> str | None:
    """``interrupted: refusal — the model refused: ...`` for a run whose interruption
    reason (``actor:round_1:refusal``) is one of :data:`REFUSED`; None for any other."""
    kind = (reason or "").rpartition(":")[2]
    if kind not in REFUSED:
        return None
    return f"interrupted: {kind} — {error or REFUSAL_WORDS[kind]}"


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
    #: The account's rate limits as the answer's headers said them (None: not read, or
    #: none sent): the fleet's limiter learns them.
    limits: VendorLimits | None = None
