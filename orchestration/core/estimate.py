"""How many tokens a call may use, without a tokenizer, and output limits that fit a budget.

Pure: no I/O. Tokenizer files cannot be fetched at run time, so a prompt's input tokens
are estimated from its UTF-8 size and a *bytes per token* ratio learned per model from
earlier calls' reported usage (kept in Redis by :mod:`orchestration.state.tokenratio`):

- a model starts at one token per byte (:data:`START_BYTES_PER_TOKEN`), an upper bound
  for byte-level BPE tokenizers, until :data:`MIN_SAMPLES` calls have reported usage;
- then the *smallest* ratio seen (the most tokens per byte) is used, less a margin
  (:data:`MARGIN`), never more than a real tokenizer could pack (:data:`MAX_BYTES_PER_TOKEN`);
- a ratio is observed as the prompt's bytes over *all* its reported input tokens, framing
  included, so it errs low; framing tokens per message and per request
  (:data:`MESSAGE_TOKENS`, :data:`REQUEST_TOKENS`) are added to every estimate on top.

:func:`fit_output` decides how far a call's ``max_tokens`` may be lowered so that its
worst case fits what a budget has left, instead of not making the call at all.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from orchestration.core.budget import OUTPUT_TOKENS, TOKENS, USD, Refusal

#: Bytes per token assumed before a model has reported usage: one token per byte.
START_BYTES_PER_TOKEN = 1.0
#: Calls a model must have reported before its learned ratio is used.
MIN_SAMPLES = 3
#: The learned ratio is lowered by this fraction: more tokens estimated than seen.
MARGIN = 0.10
#: No tokenizer packs more bytes into a token than this on ordinary text.
MAX_BYTES_PER_TOKEN = 8.0
#: Framing tokens per message (role, separators) and per request (reply priming).
MESSAGE_TOKENS = 4
REQUEST_TOKENS = 8


@dataclass(frozen=True, slots=True)
class TokenRatio:
    """What a model's reported usage says about its tokenizer."""

    #: Calls that reported usage.
    samples: int = 0
    #: The smallest bytes-per-token ratio any of them showed.
    min_bytes_per_token: float = MAX_BYTES_PER_TOKEN

    def bytes_per_token(self) -> float:
        """The ratio estimates use: the start value until enough samples, then the
        smallest seen less the margin (never above :data:`MAX_BYTES_PER_TOKEN`)."""
        if self.samples < MIN_SAMPLES:
            return START_BYTES_PER_TOKEN
        learned = self.min_bytes_per_token * (1 - MARGIN)
        return max(START_BYTES_PER_TOKEN, min(learned, MAX_BYTES_PER_TOKEN))

    def input_tokens(self, prompt_bytes: int, messages: int) -> int:
        """Input tokens of a prompt of ``prompt_bytes`` in ``messages`` messages (an upper
        estimate)."""
        text = math.ceil(max(prompt_bytes, 0) / self.bytes_per_token())
        return text + MESSAGE_TOKENS * max(messages, 0) + REQUEST_TOKENS


def observed_ratio(prompt_bytes: int, input_tokens: int) -> float | None:
    """The bytes-per-token ratio one call showed, counting every reported input token as
    text (framing included, so it errs low: estimates err high); None when its usage says
    nothing."""
    if prompt_bytes <= 0 or input_tokens <= 0:
        return None
    return prompt_bytes / input_tokens


def prompt_bytes(parts: Iterable[str]) -> int:
    """UTF-8 size of a prompt's texts (instructions, messages, tool or schema JSON)."""
    return sum(len(part.encode()) for part in parts)


@dataclass(frozen=True, slots=True)
class Fit:
    """How a call fits a budget that cannot hold its worst case."""

    #: The output limit that fits (>= 1), or None.
    max_tokens: int | None
    #: When nothing fits: True if calls in flight hold room that may come back (wait),
    #: False if the budget is spent (interrupt).
    wait: bool = False


def fit_output(
    refusal: Refusal,
    *,
    input_tokens: int,
    input_usd: float,
    usd_per_output_token: float,
    max_tokens: int,
) -> Fit:
    """The largest output limit that fits where ``refusal`` found no room.

    The room is what the refusing scope has neither spent nor lent to calls in flight.
    Only a limit on ``tokens``, ``output_tokens`` or ``usd`` can be met by asking for a
    shorter answer; ``input_tokens`` and ``calls`` cannot.

    Args:
        refusal: why the call's worst case was refused.
        input_tokens: the call's estimated input tokens.
        input_usd: what that input costs at the dearest input rate.
        usd_per_output_token: the output rate (0 when unpriced).
        max_tokens: the call's own output limit.
    """
    room = refusal.limit - refusal.spent - refusal.reserved
    if refusal.unit == TOKENS:
        fits = room - input_tokens
    elif refusal.unit == OUTPUT_TOKENS:
        fits = room
    elif refusal.unit == USD and usd_per_output_token > 0:
        # one token less: the ledger rounds each charge up to a micro-dollar
        fits = (room - input_usd) / usd_per_output_token - 1
    else:
        fits = 0
    output = min(max_tokens, math.floor(fits))
    if output >= 1:
        return Fit(output)
    return Fit(None, wait=refusal.reserved > 0)
