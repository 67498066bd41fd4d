"""A model call timeout the broker's visibility timeout does not outlast is refused at
start: at submit (a team's agents) and at a worker's start (the agents' default; see
tests/system/test_cli.py for the worker and the CLI), with one message naming the agent,
both timeouts and the variable to change."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from orchestration import Agent, Team
from orchestration.core.agents import DEFAULT_TIMEOUT_S, check_call_timeout
from orchestration.core.errors import ConfigError
from orchestration.settings import Settings, get_settings
from orchestration.state.broker import visibility_timeout_of


@pytest.fixture
def settings_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """Change DUET_* variables for this test (settings are read once per process)."""
    for name in (
        "DUET_REDIS_URL",
        "DUET_BROKER_URL",
        "DUET_VISIBILITY_TIMEOUT_S",
        "DUET_CHECK_TIMEOUTS",
    ):
        monkeypatch.delenv(name, raising=False)
    get_settings.cache_clear()
    yield monkeypatch
    get_settings.cache_clear()


def test_a_timeout_not_shorter_than_the_visibility_timeout_is_refused() -> None:
    check_call_timeout("actor (gpt-4.1)", 3599, 3600)  # shorter: fine
    with pytest.raises(ConfigError) as refused:
        check_call_timeout("actor (gpt-4.1)", 3600, 3600)
    message = str(refused.value)
    assert message.startswith(
        "actor (gpt-4.1): timeout_s 3600 s is not shorter than the "
        "broker's visibility timeout (3600 s, DUET_VISIBILITY_TIMEOUT_S)"
    )
    assert "Lower the agent's timeout_s, or raise DUET_VISIBILITY_TIMEOUT_S" in message


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, 3600),  # the embedded Redis is the broker
        ({"DUET_REDIS_URL": "redis://h:6379/0", "DUET_VISIBILITY_TIMEOUT_S": "90"}, 90),
        ({"DUET_REDIS_URL": "redis://h/0", "DUET_BROKER_URL": "rediss://b/0"}, 3600),
        ({"DUET_REDIS_URL": "redis://h/0", "DUET_BROKER_URL": "amqp://g:g@b//"}, None),
        ({"DUET_REDIS_URL": "redis://h/0", "DUET_CHECK_TIMEOUTS": "false"}, None),
    ],
)
def test_which_brokers_have_a_visibility_timeout(
    env: dict[str, str], expected: int | None, settings_env: pytest.MonkeyPatch
) -> None:
    for name, value in env.items():
        settings_env.setenv(name, value)
    assert visibility_timeout_of(Settings()) == expected


def test_a_team_is_refused_naming_its_agent(settings_env: pytest.MonkeyPatch) -> None:
    settings_env.setenv("DUET_VISIBILITY_TIMEOUT_S", "300")
    fine = Agent("Review.", model="sim", timeout_s=299)
    Team.actor_critic(actor=fine, critic=fine)
    slow = Agent("Review.", model="claude-sonnet-4-5", timeout_s=600)
    with pytest.raises(
        ConfigError,
        match=r"^critic \(claude-sonnet-4-5\): timeout_s 600 s is "
        r"not shorter than the broker's visibility timeout \(300 s",
    ):
        Team.actor_critic(actor=fine, critic=slow)
    # The agents' default (120 s) against a visibility timeout below it.
    settings_env.setenv("DUET_VISIBILITY_TIMEOUT_S", "100")
    get_settings.cache_clear()
    with pytest.raises(ConfigError, match=r"^actor \(sim\): timeout_s 120 s"):
        Team.actor_critic(actor=Agent("Fix.", model="sim"), critic=fine)
    assert DEFAULT_TIMEOUT_S == 120
