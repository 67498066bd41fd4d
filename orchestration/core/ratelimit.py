"""The shape of a vendor's rate limit, as pure arithmetic: a smooth rate (GCRA).

A vendor that says "600 requests a minute" may enforce it as 10 a second, so a limit is
kept as a rate refilled continuously, never as a whole minute admitted at once. GCRA
keeps one number per dimension, the *theoretical arrival time* (TAT): each request
pushes it ``cost x interval`` later, and a request may go once the TAT, less the
burst tolerance, is not in the future. :func:`gcra_slot` is the rule;
``orchestration/state/lua/rate_acquire.lua`` applies the same rule atomically in Redis
(and books the slot), and the pure tests hold the two to the same table.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from orchestration.core import url_credentials

#: Seconds of the rate a burst may hold (at least one request). Half a second keeps the
#: vendor's own bucket (a second of the rate, as OpenAI and Anthropic enforce a minute)
#: half full, so the delay between a grant and its arrival never empties it.
BURST_S = 0.5
#: Seconds ahead a request may book its slot; one further away waits without a booking
#: and asks again (so a learned limit applies to it when it comes back).
HORIZON_S = 30.0
#: A limit nobody configured whose vendor has not answered yet (its headers teach the
#: real one): this many requests a minute, booked no further ahead than now.
PROBE_RPM = 240
#: A vendor's ``retry-after`` at least this long pauses the whole (provider, model, endpoint):
#: a shorter one only delays the call that got the 429 (the limiter keeps pacing the rest).
PAUSE_ALL_S = 5.0


@dataclass(frozen=True, slots=True)
class VendorLimits:
    """What a vendor's rate-limit headers said: requests and tokens per minute.

    Both None: the answer carried no rate-limit headers (the server sets none).
    """

    #: Requests per minute (``x-ratelimit-limit-requests``, ``anthropic-ratelimit-requests-limit``).
    rpm: int | None = None
    #: Tokens per minute (``x-ratelimit-limit-tokens``, ``anthropic-ratelimit-tokens-limit``).
    tpm: int | None = None


def effective(configured: int | None, learned: int | None) -> int | None:
    """The limit to pace at: the lower of what was configured and what the vendor said
    (a configured limit above the account's real one is corrected; one below it is a
    choice, e.g. to leave room for another team on the same account)."""
    if configured is None:
        return learned
    if learned is None:
        return configured
    return min(configured, learned)


def gcra_slot(tat: float, now: float, cost: float, interval: float, burst: float) -> float:
    """When a request of ``cost`` units may go, given the dimension's TAT (all seconds).

    ``interval`` is the seconds one unit takes at the rate; ``burst`` the seconds of
    rate a burst may hold. A request larger than the burst goes when the bucket is full.
    """
    need = cost * interval
    return max(now, max(tat, now) + need - max(burst, need))


def gcra_book(tat: float, slot: float, cost: float, interval: float) -> float:
    """The TAT after booking ``cost`` units at ``slot``."""
    return max(tat, slot) + cost * interval


def spread(wait_s: float, u: float) -> float:
    """``wait_s`` stretched by up to half (``u`` uniform in [0, 1)): calls told to wait
    alike come back spread out instead of at one instant."""
    return wait_s * (1.0 + 0.5 * u) if wait_s > 0 else 0.0


def rate_limited_reason(waited_s: float) -> str:
    """The interruption of a step that waited ``waited_s`` for rate limits, in all."""
    return f"rate_limited:waited_{round(waited_s)}s"


def limit_name(provider: str, model_name: str, base_url: str | None = None) -> str:
    """The name one rate limit is kept under: ``provider:model`` on the vendor's own
    endpoint, ``provider:model@URL`` on another (scheme, host, port and path: no
    credentials, query or trailing slash), so one team's limit on its server never paces
    another team's on theirs."""
    name = f"{provider}:{model_name}"
    if not base_url:
        return name
    parts = urlsplit(url_credentials.without_credentials(base_url))
    endpoint = urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))
    return f"{name}@{endpoint}"
