"""The worst case `duet run --dry-run` prints: every run to its last round, each call seeing
every earlier turn, one token per byte."""

from __future__ import annotations

from duet.commands.intake import worst_case
from orchestration import Agent, Team


def test_worst_case_of_one_run_per_role() -> None:
    spec = Team.actor_critic(
        actor=Agent("Fix.", model="sim", max_tokens=100),
        critic=Agent("Judge.", model="sim", max_tokens=50),
        max_rounds=2,
    ).spec
    # actor 14 (4 + 10), critic 126 (6 + 10 + 110), actor 184, critic 296, actor 354
    assert worst_case(spec, 10) == {
        "actor": (3, 14 + 184 + 354, 300),
        "critic": (2, 126 + 296, 100),
    }


def test_one_round_is_three_calls() -> None:
    spec = Team.actor_critic(
        actor=Agent("a", model="sim", max_tokens=1),
        critic=Agent("c", model="sim", max_tokens=1),
        max_rounds=1,
    ).spec
    assert {role: calls for role, (calls, _, _) in worst_case(spec, 0).items()} == {
        "actor": 2,
        "critic": 1,
    }
