"""A budget per agent on a real worker: each role's calls charged to its own scope within
the run (``actor:<run id>``, ``critic:<run id>``), reserved and settled as the run's own;
running out interrupts the run ``budget:<role>:<unit>``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from orchestration import Agent, Budget, Team, get_budget
from orchestration.core.errors import ConfigError
from orchestration.core.results import RunResult
from tests.support import celery_worker, client_pointed_at

pytestmark = pytest.mark.system

CRITIC = 'Find bugs. Reply with JSON: {"score": 0..1, "issues": [...], "summary": "..."}.'


@pytest.fixture(scope="module")
def worker_url(redis_url: str) -> Iterator[str]:
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    client.close()
    with celery_worker(redis_url, name="agent-budgets"), client_pointed_at(redis_url):
        yield redis_url


def _run(
    actor: Budget | None = None, critic: Budget | None = None, max_rounds: int = 3
) -> RunResult:
    team = Team.actor_critic(
        actor=Agent("Write the code.", model="sim", budget=actor),
        critic=Agent(CRITIC, model="sim:critic?scores=0.2", budget=critic),
        max_rounds=max_rounds,
        approval_threshold=0.9,
        persistent_subagents=False,
    )
    return team.run_sync("Write a function that parses ints.", timeout=60)


def _charged(role: str, result: RunResult) -> tuple[int, int, int]:
    spent = get_budget(f"{role}:{result.run_id}").spent
    used = result.usage.by_role.get(role)
    assert used is not None
    assert spent.calls == used.calls, (role, spent, used)  # exactly the calls made
    assert (spent.input_tokens, spent.output_tokens) == (used.input_tokens, used.output_tokens)
    return spent.calls, spent.input_tokens, spent.output_tokens


def test_a_critic_out_of_calls_interrupts_the_run_naming_its_role(worker_url: str) -> None:
    """One critique allowed: the round after it is not started, ``budget:critic:calls``;
    the critic's scope holds its one call and nothing of the actor's."""
    result = _run(critic=Budget(max_calls=1))
    assert result.status == "interrupted"
    assert result.interruption_reason == "budget:critic:calls"
    assert _charged("critic", result)[0] == 1
    assert result.usage.by_role["actor"].calls == 2  # draft and one revision: not capped
    assert result.output is not None  # the run keeps its last revision


def test_an_actor_budget_cuts_its_reply_and_is_charged_to_the_token(worker_url: str) -> None:
    """Room for 40 output tokens in the actor's scope: its draft's ``max_tokens`` is
    lowered to fit, the reply is cut there and the run ends ``budget:actor:output_tokens``
    with exactly those tokens charged; the critic never runs."""
    result = _run(actor=Budget(max_output_tokens=40))
    assert result.status == "interrupted"
    assert result.interruption_reason == "budget:actor:output_tokens"
    assert _charged("actor", result) == (1, result.tokens_in, 40)
    assert "critic" not in result.usage.by_role


def test_each_role_is_charged_only_its_own_calls(worker_url: str) -> None:
    result = _run(actor=Budget(max_calls=10), critic=Budget(max_calls=10), max_rounds=2)
    assert result.status == "max_rounds_reached", (result.interruption_reason, result.error)
    assert _charged("actor", result)[0] == 3
    assert _charged("critic", result)[0] == 2


def test_an_agent_budget_in_usd_on_a_model_without_a_price_is_refused(worker_url: str) -> None:
    """Its limit would never trip: refused at submit, naming the model; nothing runs."""
    unpriced = Agent(
        "Write.",
        model="openai:house-llm",
        base_url="http://127.0.0.1:9/v1",
        budget=Budget(max_usd=1.0),
    )
    with pytest.raises(ConfigError, match="no known price for model 'openai:house-llm'"):
        Team.actor_critic(actor=unpriced, critic=Agent(CRITIC, model="sim:critic")).submit(
            "Write a function that parses ints."
        )
