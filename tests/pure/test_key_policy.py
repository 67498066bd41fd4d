"""The workers' allowlist of key variables and hosts, as one table (issue 33, row 6)."""

from __future__ import annotations

import pytest

from orchestration.core.agents import Agent
from orchestration.core.key_policy import KeyPolicy, parse_key_hosts
from orchestration.settings import Settings

POLICY = KeyPolicy.with_extra(
    {
        "TEAM_B_API_KEY": ["gw.team-b.example"],
        "GATEWAY_PASSWORD": ["gw.internal:8443"],
        "LOCAL_KEY": ["http://127.0.0.1"],
    }
)


@pytest.mark.parametrize(
    ("model", "base_url", "api_key_env", "refused"),
    [
        ("gpt-4o", None, None, None),
        ("claude-x", None, None, None),
        ("openai:m", "https://api.openai.com/v1", "OPENAI_API_KEY", None),
        ("openai:m", "https://gw.team-b.example/v1", "TEAM_B_API_KEY", None),
        ("openai:m", "http://127.0.0.1:8765/v1", "LOCAL_KEY", None),
        ("anthropic:m", "https://bot:${GATEWAY_PASSWORD}@gw.internal:8443", None, None),
        ("openai:m", "https://evil.example/v1", None, None),  # keyless: nothing is sent
        ("openai:m", "https://evil.example/v1", "DB_PASSWORD", "DB_PASSWORD is not on"),
        ("gpt-4o", None, "DB_PASSWORD", "DB_PASSWORD is not on"),
        ("openai:m", "https://evil.example/v1", "TEAM_B_API_KEY", "TEAM_B_API_KEY may not"),
        ("openai:m", "http://gw.team-b.example/v1", "TEAM_B_API_KEY", "TEAM_B_API_KEY may not"),
        ("openai:m", "https://evil.example/v1", "OPENAI_API_KEY", "OPENAI_API_KEY may not"),
        ("anthropic:m", "http://${ANTHROPIC_API_KEY}@evil.example", None, "ANTHROPIC_API_KEY"),
        ("anthropic:m", "https://u:${GATEWAY_PASSWORD}@gw.internal", None, "may not be sent"),
        ("openai:m", "https://gw.team-b.example.evil.example/v1", "TEAM_B_API_KEY", "may not"),
        ("sim", None, None, None),
    ],
)
def test_a_variable_goes_only_where_the_operator_allowed(
    model: str, base_url: str | None, api_key_env: str | None, refused: str | None
) -> None:
    agent = Agent("a", model=model, base_url=base_url, api_key_env=api_key_env).spec
    problem = POLICY.agent_problem(agent)
    if refused is None:
        assert problem is None
    else:
        assert problem is not None and refused in problem, problem
        assert "DUET_KEY_HOSTS" in problem


def test_the_setting_reads_json_and_the_short_form_alike() -> None:
    short = parse_key_hosts("TEAM_B_API_KEY=gw.b.example, http://10.0.0.2:80 ; X_KEY=h")
    as_json = parse_key_hosts(
        '{"TEAM_B_API_KEY": ["gw.b.example", "http://10.0.0.2:80"], "X_KEY": ["h"]}'
    )
    assert short == as_json
    assert (
        KeyPolicy.with_extra(short).to_json()
        == KeyPolicy.from_json(KeyPolicy.with_extra(as_json).to_json()).to_json()
    )


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("NOT A NAME=h", "not an environment variable name"),
        ("K=ftp://h", "not host, host:port"),
        ("K=h:99999", "not host, host:port"),
        ("K", "is not NAME=host"),
    ],
)
def test_a_bad_setting_is_refused_naming_it(
    value: str, says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DUET_KEY_HOSTS", value)
    with pytest.raises(ValueError, match=says):
        Settings()
