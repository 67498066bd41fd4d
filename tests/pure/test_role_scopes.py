"""A budget per agent: its scope within the run, which calls are charged to it, and how it
is set (``Agent(budget=)``, ``[actor] budget``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from duet.config import load_config
from orchestration import Agent, Budget
from orchestration.core.architecture import ActorCritic
from orchestration.core.budget import parse_scope, reason_for, role_scopes, scope
from orchestration.core.errors import ConfigError

RUN = ("run:r1", "batch:b1", "user:ann", "global:team", "actor:r1", "critic:r1")


def test_each_role_is_charged_its_own_scope_and_the_shared_ones() -> None:
    assert role_scopes(RUN, "actor") == RUN[:5]
    assert role_scopes(RUN, "critic") == (*RUN[:4], "critic:r1")
    assert role_scopes(("run:r1",), "critic") == ("run:r1",)


def test_an_agent_scope_is_a_scope_and_its_reason_names_the_role() -> None:
    assert scope("actor", "r1") == "actor:r1" and parse_scope("critic:r1") == ("critic", "r1")
    assert reason_for("actor:r1", "usd") == "budget:actor:usd"
    assert reason_for("critic:r1", "calls") == "budget:critic:calls"
    with pytest.raises(ConfigError):
        parse_scope("coordinator:r1")


def test_an_agent_budget_is_checked_and_kept_in_its_spec() -> None:
    agent = Agent("Write.", model="sim", budget={"max_calls": 2})  # type: ignore[arg-type]
    assert agent.spec.budget == Budget(max_calls=2)
    with pytest.raises(ConfigError, match="budget.max_calls"):
        Agent("Write.", model="sim", budget={"max_calls": -1})  # type: ignore[arg-type]


def test_a_budget_does_not_make_the_team_another() -> None:
    critic = Agent("Review.", model="sim:critic")
    plain = ActorCritic(actor=Agent("Write.", model="sim"), critic=critic).to_spec()
    capped = ActorCritic(
        actor=Agent("Write.", model="sim", budget=Budget(max_calls=2)), critic=critic
    ).to_spec()
    assert plain.team_id == capped.team_id  # the same conversations
    assert plain.spec_id != capped.spec_id  # but not the same stored spec


def test_a_config_gives_an_agent_its_budget(tmp_path: Path) -> None:
    file = tmp_path / "review.toml"
    file.write_text(
        '[actor]\ninstructions = "Write."\nmodel = "sim"\n'
        "[actor.budget]\nmax_tokens = 5000\n"
        '[critic]\ninstructions = "Review."\nmodel = "sim:critic"\n'
        "budget = { max_calls = 3 }\n"
    )
    actor, critic = load_config(file).build_agents()
    assert actor.spec.budget == Budget(max_tokens=5000)
    assert critic.spec.budget == Budget(max_calls=3)
    file.write_text(file.read_text().replace("max_calls = 3", "max_calls = 3, max_rounds = 1"))
    with pytest.raises(ConfigError, match="critic.budget.max_rounds"):
        load_config(file)
