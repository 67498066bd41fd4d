"""The fleet's learned bytes-per-token ratios: samples counted, the smallest kept, races lost
by nobody."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from orchestration.core.estimate import MIN_SAMPLES, START_BYTES_PER_TOKEN
from orchestration.state import tokenratio
from orchestration.state.tokenratio import TokenRatios


@pytest.fixture(params=["fakeredis", "redis"])
def ratios(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> TokenRatios:
    monkeypatch.setattr(tokenratio, "CACHE_S", 0.0)  # read through, to see every change
    client: Any = request.getfixturevalue(
        "fake_redis" if request.param == "fakeredis" else "redis_client"
    )
    return TokenRatios(client)


def test_conservative_until_enough_samples(ratios: TokenRatios) -> None:
    assert ratios.get("openai", "m").bytes_per_token() == START_BYTES_PER_TOKEN
    for _ in range(MIN_SAMPLES - 1):
        ratios.record("openai", "m", 4000, 1000)
    assert ratios.get("openai", "m").bytes_per_token() == START_BYTES_PER_TOKEN
    ratios.record("openai", "m", 4000, 1000)
    got = ratios.get("openai", "m")
    assert got.samples == MIN_SAMPLES and got.min_bytes_per_token == 4.0
    assert START_BYTES_PER_TOKEN < got.bytes_per_token() < 4.0


def test_smallest_ratio_is_kept_and_models_are_apart(ratios: TokenRatios) -> None:
    for size, tokens in [(4000, 1000), (3000, 1000), (5000, 1000)]:
        ratios.record("openai", "m", size, tokens)
    assert ratios.get("openai", "m").min_bytes_per_token == 3.0
    assert ratios.get("openai", "other").samples == 0
    ratios.record("openai", "m", 0, 10)  # says nothing
    assert ratios.get("openai", "m").samples == 3


def test_concurrent_records_keep_the_smallest(redis_client: Any) -> None:
    ratios = TokenRatios(redis_client)
    sizes = list(range(2000, 4000, 10))

    def record(some: list[int]) -> None:
        for size in some:
            ratios.record("anthropic", "m", size, 1000)

    # 20 threads (not one per size: the client's pool has fewer connections than 200).
    threads = [threading.Thread(target=record, args=(sizes[i::20],)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    tokenratio.CACHE_S, saved = 0.0, tokenratio.CACHE_S
    try:
        assert ratios.get("anthropic", "m").min_bytes_per_token == 2.0
    finally:
        tokenratio.CACHE_S = saved
