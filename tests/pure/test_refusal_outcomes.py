"""Refusals, content filters and context overflows are outcomes that interrupt the agent,
read the same from each vendor's reply shape (synchronous and in a vendor batch)."""

from __future__ import annotations

from typing import Any

import pytest

from orchestration import Agent, ProviderError
from orchestration.core.completion import UNFINISHED, refusal_error
from orchestration.core.loop import error_interruption, interruption
from workers.providers.anthropic import AnthropicProvider
from workers.providers.errors import classify_exception, error_for_status
from workers.providers.openai import OpenAIProvider
from workers.providers.sim import REFUSAL_TEXT, simulate

USAGE_OPENAI = {"prompt_tokens": 7, "completion_tokens": 3}
USAGE_ANTHROPIC = {"input_tokens": 5, "output_tokens": 3}


def _openai(message: dict[str, Any], finish: str) -> dict[str, Any]:
    return {"choices": [{"message": message, "finish_reason": finish}], "usage": USAGE_OPENAI}


def _anthropic(text: str, stop: str, **extra: Any) -> dict[str, Any]:
    content = [{"type": "text", "text": text}] if text else []
    return {"content": content, "stop_reason": stop, "usage": USAGE_ANTHROPIC, **extra}


OPENAI_SHAPES = [
    pytest.param(
        _openai({"content": None, "refusal": "I can't help."}, "stop"),
        False,
        "refusal",
        "I can't help.",
        id="openai-refusal",
    ),
    pytest.param(
        _openai({"content": None, "refusal": "No."}, "stop"),
        True,
        "refusal",
        "No.",
        id="openai-structured-refusal",
    ),
    pytest.param(
        _openai({"content": "Here is half"}, "content_filter"),
        False,
        "content_filter",
        "Here is half",
        id="openai-content-filter",
    ),
    pytest.param(
        _openai({"content": None}, "content_filter"),
        True,
        "content_filter",
        "",
        id="openai-content-filter-empty",
    ),
]
ANTHROPIC_SHAPES = [
    pytest.param(
        _anthropic("I won't do that.", "refusal"),
        False,
        "refusal",
        "I won't do that.",
        id="anthropic-refusal",
    ),
    pytest.param(
        _anthropic(
            "",
            "refusal",
            stop_details={"type": "refusal", "category": "cyber", "explanation": "Cyber harm."},
        ),
        True,
        "refusal",
        "Cyber harm.",
        id="anthropic-refusal-explained",
    ),
    pytest.param(
        _anthropic("cut off he", "model_context_window_exceeded"),
        False,
        "context_window",
        "cut off he",
        id="anthropic-context-window",
    ),
]


@pytest.mark.parametrize(("reply", "structured", "stop", "text"), OPENAI_SHAPES)
def test_openai_shapes_are_read_as_outcomes(
    reply: dict[str, Any], structured: bool, stop: str, text: str
) -> None:
    done = OpenAIProvider(base_url=None, api_key_env="KEY").read(reply, structured)
    assert (done.stop_reason, done.text, done.structured) == (stop, text, None)


@pytest.mark.parametrize(("reply", "structured", "stop", "text"), ANTHROPIC_SHAPES)
def test_anthropic_shapes_are_read_as_outcomes(
    reply: dict[str, Any], structured: bool, stop: str, text: str
) -> None:
    done = AnthropicProvider(base_url=None, api_key_env="KEY").read(reply, structured)
    assert (done.stop_reason, done.text, done.structured) == (stop, text, None)


def test_anthropic_refusal_beside_a_tool_call_has_no_structured_critique() -> None:
    reply = _anthropic("No.", "refusal")
    reply["content"].append({"type": "tool_use", "name": "critique", "input": {"score": 1.0}})
    done = AnthropicProvider(base_url=None, api_key_env="KEY").read(reply, True)
    assert (done.stop_reason, done.structured) == ("refusal", None)


def test_batch_results_carry_the_outcomes() -> None:
    openai = OpenAIProvider(base_url=None, api_key_env="KEY")
    line = {
        "custom_id": "a",
        "response": {
            "status_code": 200,
            "body": _openai({"content": None, "refusal": "No."}, "stop"),
        },
    }
    done = openai._outcome(line, False)
    assert not isinstance(done, ProviderError) and done.stop_reason == "refusal"
    overflow = {
        "custom_id": "b",
        "response": {
            "status_code": 400,
            "body": {
                "error": {
                    "message": "too long",
                    "type": "invalid_request_error",
                    "code": "context_length_exceeded",
                }
            },
        },
    }
    error = openai._outcome(overflow, False)
    assert isinstance(error, ProviderError) and error.kind == "context_window"
    anthropic = AnthropicProvider(base_url=None, api_key_env="KEY")
    result = {"type": "succeeded", "message": _anthropic("x", "model_context_window_exceeded")}
    done = anthropic._outcome("c", result, False)
    assert not isinstance(done, ProviderError) and done.stop_reason == "context_window"


def test_openai_context_overflow_error_is_a_context_window_outcome() -> None:
    error = error_for_status(
        400, None, "max context", provider="openai", code="context_length_exceeded"
    )
    assert (error.kind, error.transient) == ("context_window", False)
    assert error_interruption(error.kind) == "context_window"
    assert error_for_status(400, None, "x", provider="openai", code="other").kind == "bad_request"
    too_long = "prompt is too long: 210000 tokens > 200000 maximum"  # Anthropic's wording
    assert error_for_status(400, None, too_long, provider="anthropic").kind == "context_window"
    assert error_interruption("bad_request") == "provider_error:bad_request"


def test_an_sdk_status_error_with_the_context_code_is_a_context_window_outcome() -> None:
    class BadRequestError(Exception):  # the shape of openai.BadRequestError
        status_code, code, message = 400, "context_length_exceeded", "maximum context length"

    assert classify_exception(BadRequestError(), provider="openai").kind == "context_window"


@pytest.mark.parametrize("stop", ["refusal", "content_filter", "context_window"])
@pytest.mark.parametrize("phase", ["generate", "critique", "refine"])
def test_each_outcome_interrupts_every_phase(stop: str, phase: str) -> None:
    # a critique that holds a whole verdict is still not read: the critic did not answer
    assert interruption(phase, stop, complete_critique=True) == stop
    assert stop in UNFINISHED


def test_the_run_error_says_what_happened_with_the_models_text() -> None:
    assert refusal_error("refusal", "I can't.") == "the model refused: I can't."
    assert refusal_error("content_filter", "  ") == (
        "the vendor's content filter stopped the reply"
    )


@pytest.mark.parametrize("stop", ["refusal", "content_filter", "context_window"])
def test_sim_refuses_at_the_revision_asked(stop: str) -> None:
    model = f"sim:actor?refuse_at=1&refuse={stop}"
    first = simulate(model, [{"role": "user", "content": "task"}], 500)
    assert first.stop_reason == "end"
    second = simulate(model, [{"role": "user", "content": first.text}], 500)
    assert second.stop_reason == stop
    assert (second.text == REFUSAL_TEXT) == (stop == "refusal")


def test_sim_agent_accepts_the_options() -> None:
    Agent("x", model="sim?refuse_at=0&refuse=content_filter")


def test_report_says_a_run_was_refused_with_the_models_words_escaped() -> None:
    from duet.report.html import render_report

    refused = {
        "id": "r",
        "status": "interrupted",
        "final_score": None,
        "rounds": [],
        "n_rounds": 0,
        "usage": {},
        "reason": "critic:round_1:refusal",
        "error": "the model refused: <b>no</b>",
        "run_id": "run-r",
    }
    page = render_report([refused], title="t")
    section = page.split('id="inputs-not-approved"', 1)[1].split("</section>", 1)[0]
    assert "interrupted: refusal — the model refused: &lt;b&gt;no&lt;/b&gt;" in section
