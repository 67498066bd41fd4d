"""Metric labels stay bounded: sim options and rounds are dropped from label values."""

from __future__ import annotations

import pytest

from workers.metrics import model_label, reason_label


@pytest.mark.parametrize(
    ("name", "label"),
    [
        ("gpt-4o", "gpt-4o"),
        ("sim:actor?scores=0.2,0.95&latency_ms=20", "sim:actor"),
        ("sim", "sim"),
        ("llama3:8b", "llama3:8b"),
    ],
)
def test_model_label(name: str, label: str) -> None:
    assert model_label(name) == label


@pytest.mark.parametrize(
    ("reason", "label"),
    [
        (None, ""),
        ("", ""),
        ("actor:round_0:max_tokens", "actor:max_tokens"),
        ("critic:round_12:provider_error:auth", "critic:provider_error:auth"),
        ("budget:user:usd", "budget:user:usd"),
        ("coordinator:error", "coordinator:error"),
    ],
)
def test_reason_label(reason: str | None, label: str) -> None:
    assert reason_label(reason) == label
