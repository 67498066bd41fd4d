"""The stand-in's rate limit, enforced as the vendors say they may enforce theirs.

OpenAI and Anthropic state limits per minute but enforce them over shorter periods: 600
requests a minute may be refused as 10 a second. :class:`VendorLimit` is that: a bucket
of one second's worth of requests (and of tokens), refilled continuously; a request it
cannot hold gets HTTP 429 with ``retry-after`` in whole seconds (and OpenAI's
``retry-after-ms``). Every answer, refused or not, carries the vendor's rate-limit
headers: OpenAI's ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` (a reset is a
duration such as ``1s`` or ``250ms``), Anthropic's ``anthropic-ratelimit-{requests,tokens,
input-tokens,output-tokens}-{limit,remaining,reset}`` (a reset is an RFC 3339 time).
Tokens are counted when the request arrives, at its estimate: a quarter of its body's
characters plus its ``max_tokens``, as OpenAI counts them.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the limit says of one request: admitted or not, and the headers to send."""

    admitted: bool
    headers: dict[str, str]


def go_duration(seconds: float) -> str:
    """``seconds`` as OpenAI writes a reset: ``6m0s``, ``1s``, ``1.5s``, ``250ms``."""
    if seconds < 1:
        return f"{max(round(seconds * 1000), 0)}ms"
    minutes, rest = divmod(seconds, 60)
    text = f"{rest:.3f}".rstrip("0").rstrip(".") + "s"
    return f"{int(minutes)}m{text}" if minutes else text


class _Bucket:
    """One second of a per-minute limit, refilled continuously."""

    def __init__(self, per_minute: int, now: float) -> None:
        self.limit = per_minute
        self.rate = per_minute / 60.0
        self.capacity = max(self.rate, 1.0)
        self.level = self.capacity
        self.at = now

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.at) * self.rate)
        self.at = now

    def remaining(self) -> int:
        """The level as the vendor states it: the share of the minute's limit left, in
        whole requests (0 while the next one would be refused)."""
        return max(0, math.floor(math.floor(self.level) / self.capacity * self.limit))

    def reset_s(self) -> float:
        """Seconds until the bucket is full again."""
        return max(self.capacity - self.level, 0.0) / self.rate

    def wait_s(self, need: float) -> float:
        """Seconds until it holds ``need`` (at most a full bucket)."""
        return max(min(need, self.capacity) - self.level, 0.0) / self.rate


class VendorLimit:
    """Requests and tokens per minute, as a stand-in vendor enforces them. Thread-safe.

    Args:
        rpm: requests per minute (None: no request limit).
        tpm: tokens per minute (None: no token limit).
        clock: seconds, monotonic (``time.monotonic``).
    """

    def __init__(
        self,
        rpm: int | None,
        tpm: int | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        for name, value in (("rpm", rpm), ("tpm", tpm)):
            if value is not None and (isinstance(value, bool) or value < 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self._clock = clock
        self._lock = threading.Lock()
        now = clock()
        self.requests = _Bucket(rpm, now) if rpm else None
        self.tokens = _Bucket(tpm, now) if tpm else None

    def admit(self, tokens: int, *, anthropic: bool) -> Verdict:
        """Count a request of ``tokens`` if the limit holds it; the headers to answer with."""
        with self._lock:
            now = self._clock()
            buckets = [b for b in (self.requests, self.tokens) if b is not None]
            for bucket in buckets:
                bucket.refill(now)
            wait = 0.0
            if self.requests is not None:
                wait = self.requests.wait_s(1)
            if self.tokens is not None:
                wait = max(wait, self.tokens.wait_s(tokens))
            admitted = wait <= 0
            if admitted:
                if self.requests is not None:
                    self.requests.level -= 1
                if self.tokens is not None:
                    self.tokens.level -= tokens
            headers = self._headers(anthropic)
        if not admitted:
            headers["retry-after"] = str(max(1, math.ceil(wait)))
            if not anthropic:
                headers["retry-after-ms"] = str(max(1, math.ceil(wait * 1000)))
        return Verdict(admitted, headers)

    def _headers(self, anthropic: bool) -> dict[str, str]:
        headers: dict[str, str] = {}
        families = [("requests", self.requests), ("tokens", self.tokens)]
        if anthropic:
            families += [("input-tokens", self.tokens), ("output-tokens", self.tokens)]
        wall = datetime.now(timezone.utc)
        for family, bucket in families:
            if bucket is None:
                continue
            if anthropic:
                reset = (wall + timedelta(seconds=bucket.reset_s())).replace(microsecond=0)
                headers[f"anthropic-ratelimit-{family}-limit"] = str(bucket.limit)
                headers[f"anthropic-ratelimit-{family}-remaining"] = str(bucket.remaining())
                headers[f"anthropic-ratelimit-{family}-reset"] = reset.strftime(
                    "%Y-%m-%dT%H:%M:%SZ"
                )
            else:
                headers[f"x-ratelimit-limit-{family}"] = str(bucket.limit)
                headers[f"x-ratelimit-remaining-{family}"] = str(bucket.remaining())
                headers[f"x-ratelimit-reset-{family}"] = go_duration(bucket.reset_s())
        return headers


def estimate_tokens(body: dict[str, object], size: int) -> int:
    """A request's tokens as counted on arrival: ``size`` (its body's characters) / 4,
    plus its ``max_tokens`` (or ``max_completion_tokens``)."""
    out = body.get("max_tokens") or body.get("max_completion_tokens") or 0
    return size // 4 + (int(out) if isinstance(out, int | float) else 0)
