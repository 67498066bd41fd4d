"""The one backoff policy (orchestration.backoff): waits double up to the cap, the jitter
takes its share at random, and a loop in place stops before its patience runs out."""

from __future__ import annotations

import pytest

from orchestration import backoff
from orchestration.backoff import IN_PLACE, INFRA, OUTAGE, Backoff, vendor_backoff


@pytest.mark.parametrize(
    ("policy", "attempt", "longest", "shortest"),
    [
        (IN_PLACE, 0, 0.2, 0.2),
        (IN_PLACE, 3, 1.6, 1.6),
        (IN_PLACE, 10, 5.0, 5.0),  # capped
        (OUTAGE, 0, 0.05, 0.05),
        (OUTAGE, 5, 1.0, 1.0),
        (INFRA, 0, 1.0, 0.5),  # half jittered
        (INFRA, 4, 16.0, 8.0),
        (INFRA, 9, 30.0, 15.0),
        (INFRA, 10_000, 30.0, 15.0),  # no overflow
        (vendor_backoff(0.5, 20.0), 2, 2.0, 0.0),  # full jitter
        (vendor_backoff(0.5, 20.0), 8, 20.0, 0.0),
    ],
)
def test_waits_double_to_the_cap_and_the_jitter_takes_its_share(
    monkeypatch: pytest.MonkeyPatch, policy: Backoff, attempt: int, longest: float, shortest: float
) -> None:
    monkeypatch.setattr(backoff.random, "random", lambda: 0.0)
    assert policy.delay(attempt) == pytest.approx(longest)
    monkeypatch.setattr(backoff.random, "random", lambda: 1.0)
    assert policy.delay(attempt) == pytest.approx(shortest)


def test_jittered_waits_spread() -> None:
    waits = {INFRA.delay(3) for _ in range(50)}
    assert len(waits) > 1 and all(4.0 <= w <= 8.0 for w in waits)


def test_a_loop_in_place_retries_the_errors_it_names_until_its_patience(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slept: list[float] = []
    told: list[float] = []
    monkeypatch.setattr("tenacity.nap.time.sleep", slept.append)
    calls = 0

    def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise ConnectionError("away")
        return "done"

    loop = IN_PLACE.retrying((ConnectionError,), 10.0, lambda _, wait: told.append(wait))
    assert loop(flaky) == "done"
    assert slept == told == [0.2, 0.4]

    def dead() -> None:
        raise ConnectionError("gone")

    slept.clear()
    # Waits of 0.2 ... 5 s never sleep, so the patience is spent by the waits' own sum
    # only on the real clock: a patience shorter than the first wait gives up at once.
    with pytest.raises(ConnectionError):
        IN_PLACE.retrying((ConnectionError,), 0.1, lambda *_: None)(dead)
    assert slept == []

    def wrong() -> None:
        raise ValueError("not ours")

    with pytest.raises(ValueError):
        IN_PLACE.retrying((ConnectionError,), 10.0, lambda *_: None)(wrong)
