"""Agents with tools on real workers: each turn a step task, each tool call a task on the
``tools`` queue, the critic ending on its verdict; the stand-in checks every tool request
against the vendors' SDK types."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
import redis

from duet.standin.server import FakeLLM
from orchestration import Agent, Team
from orchestration.core import events as ev
from orchestration.core.errors import ConfigError
from orchestration.state import keys
from orchestration.state.turns import TurnStore
from tests.support import duet_cli, tools_worker

pytestmark = pytest.mark.system

CRITIC = 'Find bugs. Reply with JSON: {"score": 0..1, "issues": [...], "summary": "..."}.'


@pytest.fixture(scope="module")
def tools_url(redis_url: str, stand_in: FakeLLM, tool_log: Path) -> Iterator[str]:
    """This module's Redis with one worker that knows the test toolset and reaches the
    stand-in as both vendors; the client pointed at it."""
    with tools_worker(redis_url, "tools", str(tool_log), stand_in):
        yield redis_url


def _team(critic: Agent, actor: str = "sim", max_rounds: int = 1) -> Team:
    return Team.actor_critic(
        actor=Agent("Write the code.", model=actor),
        critic=critic,
        max_rounds=max_rounds,
        approval_threshold=0.9,
        persistent_subagents=False,
    )


def _vendor_calls(stand_in: FakeLLM) -> int:
    return sum(stand_in.stats()["by_path"].values())


@pytest.mark.parametrize("model", ["sim:critic?scores=0.5", "gpt-4o", "claude-haiku-4-5"])
def test_a_critic_with_a_pure_tool_makes_two_calls_per_critique(
    tools_url: str, stand_in: FakeLLM, model: str
) -> None:
    """Turn 1 asks for run_tests, the tool task runs it, turn 2 gives the verdict quoting
    it: the critique step counts two model calls and its issues hold the tool's result."""
    critic = Agent(CRITIC, model=model, tools=["run_tests"])
    before = _vendor_calls(stand_in)
    result = _team(critic).run_sync("Write a function that parses ints.", timeout=60)
    assert result.status == "max_rounds_reached", (result.interruption_reason, result.error)
    assert result.usage.by_role["critic"].turns == 2
    assert result.usage.by_role["critic"].tool_calls == 1
    assert result.usage.by_role["actor"].turns == 2  # draft and revision: no tools
    issues = result.rounds[0].issues
    assert any("tests: 2 passed, 1 failed" in i for i in issues), issues
    types = [e.type for e in result.events]
    assert types.count(ev.TOOL_CALL) == 1 and types.count(ev.TOOL_RESULT) == 1
    turns = TurnStore(redis.Redis.from_url(tools_url, decode_responses=True)).turns(
        result.run_id, "r1.critique"
    )
    assert len(turns) == 1 and turns[0].results[0]["ok"] is True
    if not model.startswith("sim"):  # every call went through the vendor's checked API
        assert _vendor_calls(stand_in) - before == 2


def test_max_turns_one_interrupts_the_critic(tools_url: str) -> None:
    """A critic allowed one turn that asks for a tool on it: ``critic:round_1:max_turns``,
    and the tool is never run."""
    critic = Agent(CRITIC, model="sim:critic?scores=0.5", tools=["run_tests"], max_turns=1)
    result = _team(critic).run_sync("Write a function that adds.", timeout=60)
    assert result.status == "interrupted"
    assert result.interruption_reason == "critic:round_1:max_turns"
    assert ev.TOOL_RESULT not in [e.type for e in result.events]


def test_a_tool_no_worker_knows_is_refused_at_submit(tools_url: str) -> None:
    critic = Agent(CRITIC, model="sim:critic", tools=["run_tests", "read_minds"])
    with pytest.raises(ConfigError, match="read_minds") as caught:
        _team(critic).submit("Write a function that adds.")
    assert "run_tests" not in str(caught.value).split("knows:")[1].split(".")[0]


@pytest.mark.parametrize(
    ("tool", "said"),
    [
        ("broken_tool", "ERROR: broken_tool raised RuntimeError: the checker crashed"),
        ("hanging_tool", "ERROR: hanging_tool timed out after 0.5 s"),
    ],
)
def test_a_tool_that_fails_is_a_tool_error_the_model_reads(
    tools_url: str, tool: str, said: str
) -> None:
    """A tool raising or outlasting its time limit: the run goes on, and the critic's
    next turn reads the error as the call's result (and quotes it)."""
    critic = Agent(CRITIC, model="sim:critic?scores=0.5", tools=[tool])
    result = _team(critic).run_sync("Write a function that adds.", timeout=60)
    assert result.status == "max_rounds_reached", (result.interruption_reason, result.error)
    assert any(said in issue for issue in result.rounds[0].issues), result.rounds[0].issues
    oks = [e.data["ok"] for e in result.events if e.type == ev.TOOL_RESULT]
    assert oks == [False]


def test_a_model_calling_a_tool_it_was_not_given_reads_an_error(tools_url: str) -> None:
    """The sim is scripted to call ``run_tests`` while offered only ``slow_check``."""
    critic = Agent(CRITIC, model="sim:critic?scores=0.5&call=run_tests", tools=["slow_check"])
    result = _team(critic).run_sync("Write a function that adds.", timeout=60)
    assert result.status == "max_rounds_reached"
    assert any("unknown tool 'run_tests'" in i for i in result.rounds[0].issues)


def test_the_stand_in_refuses_malformed_tool_requests_as_the_vendors_do(
    stand_in: FakeLLM,
) -> None:
    """Through the real SDKs: a ``tool`` message answering no call, a tool defined in the
    other vendor's shape, a ``tool_result`` with no ``tool_use`` before it: each a 400."""
    import anthropic
    import openai

    oa = openai.OpenAI(api_key="sk-test", base_url=stand_in.url, max_retries=0)
    with pytest.raises(openai.BadRequestError, match="must be a response to a preceeding"):
        oa.chat.completions.create(
            model="gpt-4o",
            messages=[
                {"role": "user", "content": "hi"},
                {"role": "tool", "tool_call_id": "call_1", "content": "result"},
            ],
        )
    with pytest.raises(openai.BadRequestError, match="input_schema"):
        oa.chat.completions.create(
            model="gpt-4o",
            messages=[{"role": "user", "content": "hi"}],
            tools=[{"name": "run_tests", "input_schema": {"type": "object"}}],  # type: ignore[list-item]
        )
    an = anthropic.Anthropic(api_key="ant-test", base_url=stand_in.anthropic_url, max_retries=0)
    with pytest.raises(anthropic.BadRequestError, match="unexpected `tool_use_id`"):
        an.messages.create(
            model="claude-haiku-4-5",
            max_tokens=100,
            messages=[
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "ok"},
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "x"}],
                },
            ],
        )


def test_duet_show_lists_the_turns_and_tool_calls(tools_url: str) -> None:
    critic = Agent(CRITIC, model="sim:critic?scores=0.5", tools=["run_tests"])
    result = _team(critic).run_sync("Write a function that parses ints.", timeout=60)
    shown = duet_cli(tools_url, "show", result.run_id, check=True, timeout=60).stdout
    assert "critic turn 1: run_tests" in shown
    assert "ok: tests: 2 passed, 1 failed (test_empty_input)" in shown, shown
    assert "1 tool calls" in shown


@pytest.fixture(scope="module")
def mcp_url() -> Iterator[str]:
    """The MCP SDK's own server (tests/tools/mcp_server.py) over streamable HTTP."""
    from tests.tools.test_mcp import _serve

    yield from _serve()


def test_an_mcp_servers_tool_serves_a_critic_end_to_end(tools_url: str, mcp_url: str) -> None:
    """The critic's MCP server is listed on its first turn and frozen for the run; the
    scripted sim calls its ``echo`` tool, a tool task calls the server, and the verdict
    quotes the answer."""
    args = quote(json.dumps({"echo": {"text": "the server says hello"}}))
    critic = Agent(
        CRITIC,
        model=f"sim:critic?scores=0.5&call=echo&args={args}",
        mcp_servers=[{"url": mcp_url}],
    )
    result = _team(critic).run_sync("Write a function that adds.", timeout=60)
    assert result.status == "max_rounds_reached", (result.interruption_reason, result.error)
    assert any("Tool echo reports: the server says hello" in i for i in result.rounds[0].issues)
    frozen = TurnStore(redis.Redis.from_url(tools_url)).frozen_tools(result.run_id, "critic")
    assert frozen is not None and {"add", "echo", "broken", "slow"} <= {t.name for t in frozen}


def test_an_mcp_server_that_is_down_is_a_tool_error_not_a_crash(tools_url: str) -> None:
    """A server that cannot be listed offers no tools (an event says why, once per run):
    the critic reviews without them and the run goes on."""
    critic = Agent(
        CRITIC,
        model="sim:critic?scores=0.5&call=echo",
        mcp_servers=[{"url": "http://127.0.0.1:9/mcp"}],
    )
    result = _team(critic).run_sync("Write a function that adds.", timeout=60)
    assert result.status == "max_rounds_reached", (result.interruption_reason, result.error)
    listing = [e.data for e in result.events if e.data.get("tool") == "tools/list"]
    assert len(listing) == 1 and not listing[0]["ok"]
    assert "127.0.0.1:9/mcp" in listing[0]["error"]


def test_tool_output_is_scrubbed_of_keys_before_it_is_stored(tools_url: str) -> None:
    critic = Agent(CRITIC, model="sim:critic?scores=0.5", tools=["leak_key"])
    result = _team(critic).run_sync("Write a function that adds.", timeout=60)
    assert any("Tool leak_key reports: the key is [REDACTED]" in i for i in result.rounds[0].issues)
    client = redis.Redis.from_url(tools_url)
    stored = client.hgetall(keys.run_turns(result.run_id))
    assert stored and not any(b"sk-test-tools" in v for v in stored.values())
    assert "sk-test-tools" not in repr(result)


def test_a_rerun_with_the_same_tool_results_is_served_from_the_model_call_cache(
    tools_url: str, stand_in: FakeLLM
) -> None:
    """Every turn's messages hold the tool results: the same run again finds each turn in
    the cache (the pure tool's result is served from the tool-result cache), and the vendor
    is not called."""
    critic = Agent(CRITIC, model="gpt-4o", tools=["run_tests"])
    team = Team.actor_critic(
        actor=Agent("Write the code.", model="sim"),
        critic=critic,
        max_rounds=1,
        persistent_subagents=False,
        cache=True,
    )
    first = team.run_sync("Write a function that parses floats.", timeout=60)
    before = _vendor_calls(stand_in)
    again = team.run_sync("Write a function that parses floats.", timeout=60)
    assert first.usage.by_role["critic"].calls == 2
    assert again.usage.by_role["critic"].cached_calls == 2  # both turns served from the cache
    assert _vendor_calls(stand_in) == before
    assert again.rounds[0].issues == first.rounds[0].issues
