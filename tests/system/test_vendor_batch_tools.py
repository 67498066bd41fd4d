"""Agents with tools in vendor-batch mode: each turn is one vendor batch round trip (the
stand-in's batch APIs, through the real SDKs), each tool call a task between them; the
budget is charged once per turn."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from duet.standin.server import FakeLLM
from orchestration import Agent, Team
from orchestration.client.handles import store
from orchestration.core import events as ev
from orchestration.core.budget import Budget
from orchestration.state.budgets import BudgetLedger
from orchestration.state.turns import TurnStore
from tests.support import tools_worker

pytestmark = pytest.mark.system

CRITIC = 'Find bugs. Reply with JSON: {"score": 0..1, "issues": [...], "summary": "..."}.'
SYNC_PATHS = {"/v1/chat/completions", "/v1/messages"}


@pytest.fixture(scope="module")
def cluster(redis_url: str, stand_in: FakeLLM, tool_log: Path) -> Iterator[str]:
    with tools_worker(
        redis_url,
        "vbtools",
        str(tool_log),
        stand_in,
        DUET_VENDOR_BATCH_GATHER_S="0.5",
        DUET_VENDOR_BATCH_POLL_MAX_S="0.5",
    ):
        yield redis_url


def _ran(log: Path) -> int:
    return log.read_text().count("run_tests ") if log.exists() else 0


@pytest.mark.parametrize("model", ["gpt-4o", "claude-haiku-4-5"])
def test_a_critic_with_tools_takes_one_vendor_batch_per_turn(
    cluster: str, stand_in: FakeLLM, tool_log: Path, model: str
) -> None:
    """Turn 1 goes out in a vendor batch and asks for run_tests; the tool task runs it;
    turn 2 goes out in another batch with the tool's result and gives the verdict."""
    stand_in.reset()
    scope = f"vbt-{uuid.uuid4().hex[:8]}"
    ledger = BudgetLedger(store().r)
    ledger.set_limits(f"global:{scope}", Budget(max_usd=50.0))
    critic = Agent(CRITIC, model=model, execution="vendor_batch", tools=["run_tests"])
    team = Team.actor_critic(
        actor=Agent("Write the code.", model="sim"),
        critic=critic,
        max_rounds=1,
        approval_threshold=0.9,
        persistent_subagents=False,
        global_budgets=[scope],
    )
    ran = _ran(tool_log)
    result = team.run_sync("Write a function that parses ints.", timeout=120)
    assert result.status == "max_rounds_reached", (result.interruption_reason, result.error)
    critic_usage = result.usage.by_role["critic"]
    assert critic_usage.turns == 2 and critic_usage.tool_calls == 1
    assert any("tests: 2 passed, 1 failed" in i for i in result.rounds[0].issues)
    assert _ran(tool_log) - ran == 1
    stats = stand_in.stats()
    assert stats["batches"]["batches"] == 2  # one vendor batch round trip per turn
    assert stats["batches"]["batch_requests"] == 2
    assert not SYNC_PATHS & set(stats["by_path"]), "no synchronous model call"
    types = [e.type for e in result.events]
    assert types.count(ev.TOOL_CALL) == 1 and types.count(ev.TOOL_RESULT) == 1
    turns = TurnStore(redis.Redis.from_url(cluster, decode_responses=True)).turns(
        result.run_id, "r1.critique"
    )
    assert len(turns) == 1 and turns[0].results[0]["ok"] is True
    assert turns[0].data.get("calls") == 1
    # each turn is charged once: the budget counts both calls and holds nothing
    state = ledger.get(f"global:{scope}")
    assert state.spent.calls == result.usage.total.calls == 4  # draft, 2 turns, revision
    assert state.reserved.calls == 0 and state.open_reservations == 0
    assert state.spent.input_tokens == result.usage.total.input_tokens


def test_max_turns_in_vendor_batch_mode_interrupts_without_running_the_tool(
    cluster: str, stand_in: FakeLLM, tool_log: Path
) -> None:
    stand_in.reset()
    critic = Agent(
        CRITIC, model="gpt-4o", execution="vendor_batch", tools=["run_tests"], max_turns=1
    )
    team = Team.actor_critic(
        actor=Agent("Write the code.", model="sim"),
        critic=critic,
        max_rounds=1,
        persistent_subagents=False,
    )
    ran = _ran(tool_log)
    result = team.run_sync("Write a function that adds.", timeout=120)
    assert result.status == "interrupted"
    assert result.interruption_reason == "critic:round_1:max_turns"
    assert stand_in.stats()["batches"]["batches"] == 1
    assert _ran(tool_log) == ran
    assert ev.TOOL_RESULT not in [e.type for e in result.events]
