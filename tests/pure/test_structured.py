"""Structured critiques: which agents ask for them, and reading the native object."""

from __future__ import annotations

import pytest

from orchestration.core.agents import Agent
from orchestration.core.structured import (
    CRITIQUE_SCHEMA,
    read_structured,
    structured_critique,
    supports_structured,
)


@pytest.mark.parametrize(
    ("model", "kwargs", "expected"),
    [
        ("gpt-4o", {}, True),
        ("gpt-4o-mini-2024-07-18", {}, True),
        ("gpt-4.1-nano", {}, True),
        ("gpt-5", {}, True),
        ("o3-mini", {}, True),
        ("o4-mini", {}, True),
        ("gpt-4o-2024-05-13", {}, False),  # before JSON-schema output
        ("o1-mini", {}, False),
        ("chatgpt-4o-latest", {}, False),
        ("claude-haiku-4-5", {}, True),
        ("claude-3-5-haiku-20241022", {}, True),
        ("anthropic:claude-opus-4-7", {}, True),
        ("openai:llama3.1", {"base_url": "http://h/v1"}, False),  # a compatible server may not
        ("openai:llama3.1", {"base_url": "http://h/v1", "structured_output": True}, True),
        ("gpt-4o", {"structured_output": False}, False),
        ("sim", {"structured_output": True}, False),  # the simulator writes text
    ],
)
def test_who_is_asked_natively(model: str, kwargs: dict, expected: bool) -> None:
    assert structured_critique(Agent("judge", model=model, **kwargs).spec) is expected


def test_unknown_provider_is_not_supported() -> None:
    assert not supports_structured("mistral", "gpt-4o")


def test_schema_is_strict() -> None:
    assert CRITIQUE_SCHEMA["required"] == ["score", "issues", "summary"]
    assert CRITIQUE_SCHEMA["additionalProperties"] is False
    assert set(CRITIQUE_SCHEMA["properties"]) == set(CRITIQUE_SCHEMA["required"])


def test_native_object_is_read_as_is() -> None:
    reading = read_structured({"score": 0.8, "issues": ["a", "b"], "summary": "ok"})
    assert reading is not None and reading.complete
    assert (reading.critique.score, reading.critique.issues, reading.critique.summary) == (
        0.8,
        ["a", "b"],
        "ok",
    )


def test_native_score_on_another_scale_is_normalised() -> None:
    reading = read_structured({"score": 8, "issues": [], "summary": ""})
    assert reading is not None and reading.critique.score == 0.8


@pytest.mark.parametrize("obj", [None, "text", ["score"], {"issues": []}, {1: 2}])
def test_no_native_object_falls_back(obj: object) -> None:
    assert read_structured(obj) is None
