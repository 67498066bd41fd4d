"""Model-call cache lookups are counted: duet_model_cache_hits_total / misses."""

from __future__ import annotations

from orchestration import Agent
from workers import metrics


def test_hits_and_misses_are_counted() -> None:
    agent = Agent("x", model="openai:gpt-4.1", base_url="http://llm.local/v1").spec
    hits = metrics.CACHE_HITS.labels("openai", metrics.model_label("gpt-4.1"))
    misses = metrics.CACHE_MISSES.labels("openai", metrics.model_label("gpt-4.1"))
    h, m = hits._value.get(), misses._value.get()
    metrics.StepObserver().call_cached(agent, True)
    metrics.StepObserver().call_cached(agent, False)
    metrics.StepObserver().call_cached(agent, False)
    assert (hits._value.get() - h, misses._value.get() - m) == (1, 2)
