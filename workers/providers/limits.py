"""Read the account's rate limits from a vendor's response headers, the same way for
every answer (a success or an error).

OpenAI sends ``x-ratelimit-limit-requests`` and ``x-ratelimit-limit-tokens`` (per
minute), with ``-remaining-`` and ``-reset-`` (a duration such as ``6m0s`` or ``12ms``)
beside them; Anthropic sends ``anthropic-ratelimit-requests-limit`` and per-token
families (``-tokens-``, ``-input-tokens-``, ``-output-tokens-``; ``-reset`` is an RFC 3339
time). Only the limits themselves are read: the fleet paces by them
(:mod:`orchestration.core.ratelimit`). Pure: a mapping of headers in, numbers out.
"""

from __future__ import annotations

from collections.abc import Mapping

from orchestration.core.ratelimit import VendorLimits


def _int(headers: Mapping[str, str], name: str) -> int | None:
    value = headers.get(name)
    if value is None:
        return None
    try:
        number = int(float(str(value).strip()))
    except (TypeError, ValueError):
        return None
    return number if number > 0 else None  # Azure sends -1 for "not enforced"


def read_limits(headers: Mapping[str, str] | None) -> VendorLimits | None:
    """The limits an answer's headers state (both None: it states none, so the server
    sets none); None when there are no headers to read.

    Anthropic counts input and output tokens apart; Duet paces their sum, by the most
    restrictive of its limits (``-tokens-limit``, else the lower of ``-input-tokens-limit``
    and ``-output-tokens-limit``): safe, if slower than the account allows when input
    dominates.
    """
    if headers is None:
        return None
    lower = {str(k).lower(): v for k, v in headers.items()}
    rpm = _int(lower, "x-ratelimit-limit-requests")
    tpm = _int(lower, "x-ratelimit-limit-tokens")
    if rpm is None and tpm is None:
        rpm = _int(lower, "anthropic-ratelimit-requests-limit")
        tpm = _int(lower, "anthropic-ratelimit-tokens-limit")
        if tpm is None:
            split = [
                _int(lower, f"anthropic-ratelimit-{kind}-tokens-limit")
                for kind in ("input", "output")
            ]
            tpm = min((v for v in split if v is not None), default=None)
    return VendorLimits(rpm=rpm, tpm=tpm)
