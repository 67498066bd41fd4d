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


def test_an_agent_with_tools_takes_all_its_turns_in_the_worst_case() -> None:
    """A critic with tools and max_turns=3: three calls per critique, the second and
    third reading the turns before them and a tool result at its cap."""
    from orchestration.core.tools import MAX_RESULT_CHARS

    spec = Team.actor_critic(
        actor=Agent("Fix.", model="sim", max_tokens=100),
        critic=Agent("Judge.", model="sim", max_tokens=50, tools=["run_tests"], max_turns=3),
        max_rounds=1,
    ).spec
    plain = Team.actor_critic(
        actor=Agent("Fix.", model="sim", max_tokens=100),
        critic=Agent("Judge.", model="sim", max_tokens=50),
        max_rounds=1,
    ).spec
    calls, tokens_in, tokens_out = worst_case(spec, 10)["critic"]
    _, plain_in, _ = worst_case(plain, 10)["critic"]
    assert (calls, tokens_out) == (3, 150)
    assert tokens_in == 3 * plain_in + (1 + 2) * (50 + MAX_RESULT_CHARS)
    assert worst_case(spec, 10)["actor"] == worst_case(plain, 10)["actor"]
