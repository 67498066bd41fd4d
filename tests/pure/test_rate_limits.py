"""Rate limits as pure arithmetic: the GCRA rule, the limit a fleet paces at, the name a
limit is kept under, the vendors' headers read, and the stand-in's own bucket."""

from __future__ import annotations

import pytest

from duet.standin.ratelimit import VendorLimit, estimate_tokens, go_duration
from orchestration.core.ratelimit import (
    BURST_S,
    VendorLimits,
    effective,
    gcra_book,
    gcra_slot,
    limit_name,
    rate_limited_reason,
    spread,
)
from workers.providers.limits import read_limits


@pytest.mark.parametrize(
    ("tat", "now", "cost", "interval", "burst", "slot"),
    [
        (0.0, 10.0, 1, 0.1, 0.5, 10.0),  # an idle limit: now
        (10.4, 10.0, 1, 0.1, 0.5, 10.0),  # within the burst: now
        (10.5, 10.0, 1, 0.1, 0.5, 10.1),  # the burst is spent: the next interval
        (12.0, 10.0, 1, 0.1, 0.5, 11.6),  # booked ahead
        (0.0, 10.0, 300, 0.01, 0.5, 10.0),  # bigger than the burst: when the bucket is full
        (10.1, 10.0, 300, 0.01, 0.5, 10.1),
    ],
)
def test_gcra_slot(tat, now, cost, interval, burst, slot) -> None:
    assert gcra_slot(tat, now, cost, interval, burst) == pytest.approx(slot)


def test_booking_one_slot_after_another_paces_at_the_rate() -> None:
    tat, now, slots = 0.0, 100.0, []
    for _ in range(20):
        slot = gcra_slot(tat, now, 1, 0.1, BURST_S)
        tat = gcra_book(tat, slot, 1, 0.1)
        slots.append(slot)
    assert slots[:5] == [now] * 5  # half a second's burst
    gaps = {round(b - a, 9) for a, b in zip(slots[5:], slots[6:], strict=False)}
    assert gaps == {0.1}


@pytest.mark.parametrize(
    ("configured", "learned", "paced"),
    [(None, None, None), (600, None, 600), (None, 500, 500), (600, 500, 500), (400, 500, 400)],
)
def test_the_lower_of_configured_and_learned_paces(configured, learned, paced) -> None:
    assert effective(configured, learned) == paced


def test_a_limit_is_named_by_model_and_endpoint() -> None:
    assert limit_name("openai", "gpt-4.1") == "openai:gpt-4.1"
    a = limit_name("openai", "gpt-4.1", "http://h/a/v1/")
    b = limit_name("openai", "gpt-4.1", "http://h/b/v1")
    assert a == "openai:gpt-4.1@http://h/a/v1" and a != b
    # the same server whatever credentials (or query) the URL names
    assert limit_name("openai", "m", "https://h/v1?api-key=k#x") == "openai:m@https://h/v1"
    assert limit_name("openai", "m", "http://u:${P}@h/v1") == limit_name(
        "openai", "m", "http://h/v1"
    )


def test_waits_are_spread_and_reasons_say_how_long() -> None:
    assert spread(2.0, 0.0) == 2.0 and spread(2.0, 0.999) < 3.0 and spread(0.0, 0.5) == 0.0
    assert rate_limited_reason(1800.4) == "rate_limited:waited_1800s"


@pytest.mark.parametrize(
    ("headers", "limits"),
    [
        (None, None),
        ({"content-type": "application/json"}, VendorLimits()),
        (
            {"X-RateLimit-Limit-Requests": "5000", "x-ratelimit-limit-tokens": "160000"},
            VendorLimits(rpm=5000, tpm=160000),
        ),
        ({"x-ratelimit-limit-tokens": "-1", "x-ratelimit-limit-requests": "60"}, VendorLimits(60)),
        ({"x-ratelimit-limit-requests": "lots"}, VendorLimits()),
        (
            {
                "anthropic-ratelimit-requests-limit": "50",
                "anthropic-ratelimit-tokens-limit": "8000",
                "anthropic-ratelimit-input-tokens-limit": "40000",
                "anthropic-ratelimit-output-tokens-limit": "8000",
            },
            VendorLimits(rpm=50, tpm=8000),
        ),
        (
            {
                "anthropic-ratelimit-input-tokens-limit": "40000",
                "anthropic-ratelimit-output-tokens-limit": "8000",
            },
            VendorLimits(tpm=8000),
        ),
    ],
)
def test_vendor_headers_read(headers, limits) -> None:
    assert read_limits(headers) == limits


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.25, "250ms"), (1, "1s"), (1.5, "1.5s"), (360, "6m0s"), (61.25, "1m1.25s")],
)
def test_resets_are_written_as_openai_writes_them(seconds, text) -> None:
    assert go_duration(seconds) == text


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_the_stand_in_enforces_a_minute_per_second() -> None:
    """600 a minute: a bucket of 10, refilled at 10 a second; over it, 429 with
    ``retry-after: 1`` and OpenAI's ``retry-after-ms``."""
    clock = Clock()
    limit = VendorLimit(600, None, clock)
    verdicts = [limit.admit(1, anthropic=False) for _ in range(11)]
    assert [v.admitted for v in verdicts] == [True] * 10 + [False]
    refused = verdicts[-1].headers
    assert refused["retry-after"] == "1" and refused["retry-after-ms"] == "100"
    assert refused["x-ratelimit-remaining-requests"] == "0"
    clock.t = 0.1  # one request's worth refilled
    assert limit.admit(1, anthropic=True).admitted
    assert not limit.admit(1, anthropic=True).admitted
    clock.t = 10.0
    full = limit.admit(1, anthropic=True).headers
    assert full["anthropic-ratelimit-requests-limit"] == "600"
    assert full["anthropic-ratelimit-requests-remaining"] == "540"
    assert "retry-after" not in full


def test_the_stand_in_counts_tokens_at_their_estimate() -> None:
    clock = Clock()
    limit = VendorLimit(None, 6000, clock)  # 100 tokens a second
    assert limit.admit(80, anthropic=False).admitted
    assert not limit.admit(80, anthropic=False).admitted
    clock.t = 0.8
    assert limit.admit(80, anthropic=False).admitted
    assert estimate_tokens({"max_tokens": 50}, 400) == 150
    with pytest.raises(ValueError, match="rpm"):
        VendorLimit(0, None)
