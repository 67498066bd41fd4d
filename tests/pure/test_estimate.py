"""Token estimates without a tokenizer, and output limits that fit what a budget has left."""

from __future__ import annotations

import pytest

from orchestration.core.budget import Refusal
from orchestration.core.estimate import (
    MARGIN,
    MAX_BYTES_PER_TOKEN,
    MESSAGE_TOKENS,
    MIN_SAMPLES,
    REQUEST_TOKENS,
    START_BYTES_PER_TOKEN,
    TokenRatio,
    fit_output,
    observed_ratio,
    prompt_bytes,
)


@pytest.mark.parametrize(
    ("ratio", "expected"),
    [
        (TokenRatio(), START_BYTES_PER_TOKEN),  # nothing seen: one token per byte
        (TokenRatio(MIN_SAMPLES - 1, 4.0), START_BYTES_PER_TOKEN),  # too few samples
        (TokenRatio(MIN_SAMPLES, 4.0), 4.0 * (1 - MARGIN)),  # learned, less the margin
        (TokenRatio(50, 0.5), START_BYTES_PER_TOKEN),  # never above one token per byte
        (TokenRatio(50, 40.0), MAX_BYTES_PER_TOKEN),  # never past what a tokenizer packs
    ],
)
def test_bytes_per_token(ratio: TokenRatio, expected: float) -> None:
    assert ratio.bytes_per_token() == pytest.approx(expected)


@pytest.mark.parametrize("framing", [0, 3])  # the simulator has none; vendors a few a message
def test_estimate_is_an_upper_bound_and_tight(framing: int) -> None:
    seen = [(4000, 2), (800, 2), (1200, 4), (300, 1), (9000, 9)]

    def actual(nbytes: int, messages: int) -> int:
        return nbytes // 4 + framing * messages

    ratio = TokenRatio()
    for nbytes, messages in seen:
        r = observed_ratio(nbytes, actual(nbytes, messages))
        assert r is not None
        ratio = TokenRatio(ratio.samples + 1, min(ratio.min_bytes_per_token, r))
    for nbytes, messages in [*seen, (20_000, 3), (50, 1)]:
        estimate = ratio.input_tokens(nbytes, messages)
        assert actual(nbytes, messages) <= estimate  # safe
        slack = MESSAGE_TOKENS * messages + REQUEST_TOKENS
        assert estimate <= actual(nbytes, messages) * (1 + 3 * MARGIN) + slack  # and tight
    assert TokenRatio().input_tokens(4000, 2) == 4000 + 2 * MESSAGE_TOKENS + REQUEST_TOKENS


def test_observed_ratio_edge_cases() -> None:
    assert observed_ratio(0, 10) is None and observed_ratio(10, 0) is None
    assert observed_ratio(100, 20) == 5.0


def test_prompt_bytes_counts_utf8() -> None:
    assert prompt_bytes(["ab", "é", ""]) == 4


def _refusal(unit: str, limit: float, spent: float, reserved: float, requested: float) -> Refusal:
    return Refusal(
        scope="run:x", unit=unit, limit=limit, spent=spent, reserved=reserved, requested=requested
    )


@pytest.mark.parametrize(
    ("refusal", "expected", "wait"),
    [
        # 5000-token cap, 4400 spent, a 300-token prompt: 300 tokens of answer fit
        (_refusal("tokens", 5000, 4400, 0, 1324), 300, False),
        # others hold 100 of it: 200 fit now
        (_refusal("tokens", 5000, 4400, 100, 1324), 200, False),
        # the prompt alone does not fit, nothing in flight: interrupt
        (_refusal("tokens", 5000, 4800, 0, 1324), None, False),
        # ...with calls in flight holding room: wait for it
        (_refusal("tokens", 5000, 4600, 150, 1324), None, True),
        (_refusal("output_tokens", 2000, 1950, 0, 1024), 50, False),
        # USD: room 0.001 less 0.0003 of input at 0.00001 a token, one token kept back
        (_refusal("usd", 0.01, 0.009, 0, 0.02), 69, False),
        # a limit on calls or on input cannot be met by a shorter answer
        (_refusal("calls", 10, 10, 0, 1), None, False),
        (_refusal("input_tokens", 1000, 900, 0, 300), None, False),
    ],
)
def test_fit_output(refusal: Refusal, expected: int | None, wait: bool) -> None:
    fit = fit_output(
        refusal, input_tokens=300, input_usd=0.0003, usd_per_output_token=0.00001, max_tokens=1024
    )
    assert (fit.max_tokens, fit.wait) == (expected, wait)


def test_fit_never_exceeds_max_tokens() -> None:
    fit = fit_output(
        _refusal("tokens", 1e9, 0, 0, 0),
        input_tokens=10,
        input_usd=0,
        usd_per_output_token=0,
        max_tokens=64,
    )
    assert fit.max_tokens == 64
