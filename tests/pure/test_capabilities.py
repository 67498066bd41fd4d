"""Which settings each model family takes: one table, checked when an agent is set up (a
setting the model cannot take is refused with its key path) and read when a request is
built (never sent)."""

from __future__ import annotations

from pathlib import Path

import pytest

from duet.config import load_config
from orchestration import Agent
from orchestration.core.capabilities import FAMILIES, family_of, temperature_problem
from orchestration.core.errors import ConfigError
from workers.providers.anthropic import AnthropicProvider
from workers.providers.openai import OpenAIProvider

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("provider", "model", "family", "limit"),
    [
        ("anthropic", "claude-opus-4-7", "Anthropic Claude models", "max_tokens"),
        ("anthropic", "claude-haiku-9-future", "Anthropic Claude models", "max_tokens"),
        ("anthropic", "my-gateway-model", "Anthropic Claude models", "max_tokens"),
        ("openai", "o1", "OpenAI reasoning models", "max_completion_tokens"),
        ("openai", "o3-mini", "OpenAI reasoning models", "max_completion_tokens"),
        ("openai", "o4-mini-2031-01-01", "OpenAI reasoning models", "max_completion_tokens"),
        ("openai", "GPT-5.2-pro", "OpenAI reasoning models", "max_completion_tokens"),
        ("openai", "gpt-4.1", "OpenAI chat models", "max_tokens"),
        ("openai", "chatgpt-4o-latest", "OpenAI chat models", "max_tokens"),
        ("openai", "llama-3-70b", "OpenAI chat models", "max_tokens"),
        ("sim", "sim:critic", "the offline simulator", "max_tokens"),
    ],
)
def test_a_model_follows_its_familys_rule(
    provider: str, model: str, family: str, limit: str
) -> None:
    found = family_of(provider, model)
    assert (found.name, found.token_limit) == (family, limit)


def test_a_provider_outside_the_table_is_an_error() -> None:
    with pytest.raises(ValueError, match="no model family for provider 'bedrock'"):
        family_of("bedrock", "x")


@pytest.mark.parametrize(
    ("provider", "model", "temperature", "problem"),
    [
        ("anthropic", "claude-opus-4-7", 0.2, "claude-opus-4-7 takes no temperature"),
        ("anthropic", "claude-opus-4-7", 0.0, "claude-opus-4-7 takes no temperature"),
        ("openai", "o3", 1.0, "o3 takes no temperature: OpenAI reasoning models"),
        ("openai", "gpt-5-mini", 0.5, "gpt-5-mini takes no temperature"),
        ("openai", "gpt-4o", 2.5, "gpt-4o takes a temperature from 0 to 2, got 2.5"),
        ("openai", "gpt-4o", 0.0, None),
        ("openai", "gpt-4o", 2.0, None),
        ("anthropic", "claude-opus-4-7", None, None),
        ("openai", "o3", None, None),
    ],
)
def test_temperature_problems(
    provider: str, model: str, temperature: float | None, problem: str | None
) -> None:
    found = temperature_problem(provider, model, temperature)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found, found


def test_the_table_agrees_with_the_installed_sdks_request_types() -> None:
    from anthropic.types.message_create_params import MessageCreateParamsBase
    from openai.types.chat.completion_create_params import CompletionCreateParamsBase

    anthropic_keys = set(MessageCreateParamsBase.__annotations__)
    openai_keys = set(CompletionCreateParamsBase.__annotations__)
    assert not {"temperature", "top_p", "top_k"} & anthropic_keys
    assert family_of("anthropic", "claude-opus-4-7").temperature is None
    assert {"temperature", "max_tokens", "max_completion_tokens"} <= openai_keys
    for family in FAMILIES:
        keys = {"anthropic": anthropic_keys, "openai": openai_keys}.get(family.provider)
        if keys is not None:
            assert family.token_limit in keys, family.name


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("claude-opus-4-7", "temperature: claude-opus-4-7 takes no temperature"),
        ("anthropic:claude-next", "temperature: claude-next takes no temperature"),
        ("o4-mini", "temperature: o4-mini takes no temperature"),
    ],
)
def test_agent_refuses_a_temperature_its_model_cannot_take(model: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        Agent("x", model=model, temperature=0.2)


def test_a_config_file_names_the_key_path(tmp_path: Path) -> None:
    path = tmp_path / "review.toml"
    path.write_text(
        '[actor]\ninstructions = "Fix."\nmodel = "claude-opus-4-7"\ntemperature = 0.2\n'
        '[critic]\ninstructions = "Judge."\nmodel = "gpt-4.1"\ntemperature = 0.0\n'
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert "actor.temperature: claude-opus-4-7 takes no temperature" in str(caught.value)
    assert "critic" not in str(caught.value)


def test_the_shipped_vendor_example_sets_only_what_its_models_take() -> None:
    spec = (
        load_config(ROOT / "examples" / "review-openai-anthropic.toml")
        .build_architecture()
        .to_spec()
    )
    assert spec.actor.temperature is None and spec.critic.temperature == 0.0


@pytest.mark.parametrize(
    ("cls", "model"),
    [(AnthropicProvider, "claude-opus-4-7"), (OpenAIProvider, "o3"), (OpenAIProvider, "gpt-5")],
)
def test_a_stored_spec_with_a_refused_temperature_sends_none(cls: type, model: str) -> None:
    # A spec stored before the rule (it is refused at set-up now) still sends no temperature.
    spec = Agent("x", model=model).spec.model_copy(update={"temperature": 0.3})
    body = cls(base_url=None, api_key_env="KEY").request(spec, [{"role": "user", "content": "q"}])
    assert "temperature" not in body


def test_a_chat_model_gets_its_temperature() -> None:
    spec = Agent("x", model="gpt-4.1", temperature=0.3).spec
    body = OpenAIProvider(base_url=None, api_key_env="KEY").request(
        spec, [{"role": "user", "content": "q"}]
    )
    assert (body["temperature"], body["max_tokens"]) == (0.3, 1024)
