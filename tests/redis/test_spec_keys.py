"""A worker treats as secret, from its first task, the values of the key-shaped variables
of its environment and of every variable a stored spec names (not only once it made the
adapter of a spec naming it)."""

from __future__ import annotations

from typing import Any

import pytest

from orchestration import Agent, Team
from orchestration.state.runs import RunStore
from workers import secrets, spec_keys

CRED = "vendor-cred-7d1f3a9e"
SHAPED = "acme-key-2c8e5b4f"


def test_a_variable_a_stored_spec_names_is_secret(
    redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DUET_TEST_VENDOR_CRED", CRED)
    assert CRED in secrets.redact(f"echo {CRED}")  # no spec named it yet
    team = Team.actor_critic(
        actor=Agent("a", model="openai:gpt-4o-mini", api_key_env="DUET_TEST_VENDOR_CRED"),
        critic=Agent("b", model="sim"),
    )
    RunStore(redis_client).save_spec(team.spec)
    assert spec_keys.register_stored(redis_client) >= 1
    assert secrets.redact(f"echo {CRED}") == "echo [REDACTED]"
    assert secrets.scrub_output(f"echo {CRED}") == "echo [REDACTED]"


def test_a_variable_a_stored_spec_s_base_url_names_is_secret(
    redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    value = "gateway-pass-3a7c9e1f"
    monkeypatch.setenv("DUET_TEST_STORED_GW_PASS", value)
    assert value in secrets.redact(f"echo {value}")  # no spec named it yet
    team = Team.actor_critic(
        actor=Agent(
            "a", model="openai:m", base_url="https://bot:${DUET_TEST_STORED_GW_PASS}@gw.example/v1"
        ),
        critic=Agent("b", model="sim"),
    )
    RunStore(redis_client).save_spec(team.spec)
    assert spec_keys.register_stored(redis_client) >= 1
    assert secrets.redact(f"echo {value}") == "echo [REDACTED]"


def test_key_shaped_variables_are_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACME_API_KEY", SHAPED)
    monkeypatch.setenv("DUET_TEST_THING_TOKEN", SHAPED + "-t")
    monkeypatch.setenv("DUET_TEST_PLAIN", "plain-value-123456")
    secrets.scan_environment()
    assert secrets.scrub_output(f"a {SHAPED} b") == "a [REDACTED] b"
    assert secrets.scrub_output(f"a {SHAPED}-t b") == "a [REDACTED] b"
    assert secrets.scrub_output("plain-value-123456") == "plain-value-123456"


def test_named_variables_reads_any_depth_and_ignores_bad_json() -> None:
    spec = '{"a": [{"api_key_env": "X_VAR"}], "b": {"c": {"api_key_env": null}}}'
    assert spec_keys.named_variables(spec) == {"X_VAR"}
    assert spec_keys.named_variables("not json") == set()
