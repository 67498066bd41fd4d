"""An actor with an ``output_schema`` on a real worker, through the stand-in: asked for
natively (the stand-in holds each request to the SDKs' types), its answer parsed and
validated, an answer that breaks the schema a clear interruption."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel

from duet.standin.server import FakeLLM
from orchestration import Agent, Team
from tests.support import duet_cli, tools_worker

pytestmark = pytest.mark.system

CRITIC = 'Find bugs. Reply with JSON: {"score": 0..1, "issues": [...], "summary": "..."}.'


class Patch(BaseModel):
    """A structured patch: the file and the diff that fixes it."""

    path: str
    diff: str
    hunks: int


@pytest.fixture(scope="module")
def worker_url(redis_url: str, stand_in: FakeLLM) -> Iterator[str]:
    """This module's Redis with one worker reaching the stand-in as both vendors."""
    with tools_worker(redis_url, "schema", os.devnull, stand_in):
        yield redis_url


def _team(actor_model: str, max_rounds: int = 1, tools: tuple[str, ...] = ()) -> Team:
    return Team.actor_critic(
        actor=Agent("Fix the bug.", model=actor_model, output_schema=Patch, tools=tools),
        critic=Agent(CRITIC, model="sim:critic?scores=0.5"),
        max_rounds=max_rounds,
        approval_threshold=0.9,
        persistent_subagents=False,
    )


@pytest.mark.parametrize("model", ["gpt-4o", "claude-haiku-4-5"])
def test_an_actor_with_an_output_schema_returns_the_parsed_object(
    worker_url: str, stand_in: FakeLLM, model: str
) -> None:
    """Draft and revision are asked for natively (response_format / a forced tool), and
    the run's output is the JSON of the object ``output_json`` holds."""
    result = _team(model).run_sync("Fix the off-by-one in parse().", timeout=60)
    assert result.status == "max_rounds_reached", (result.interruption_reason, result.error)
    assert result.output_json is not None
    assert json.loads(result.output or "") == result.output_json
    patch = result.output_as(Patch)
    assert patch is not None and patch.path.startswith("[revision 1]")
    assert result.turns == result.usage.total.calls == 3  # draft, critique, revision
    assert result.tokens_in == result.usage.total.input_tokens > 0
    assert result.tokens_out == result.usage.total.output_tokens > 0
    sent = [r["body"] for r in stand_in.last_requests if r["model"] == model][-1]
    if model.startswith("gpt"):
        assert sent["response_format"]["json_schema"]["name"] == "structured_output"
        assert sent["response_format"]["json_schema"]["schema"] == Patch.model_json_schema()
    else:
        assert sent["tool_choice"] == {"type": "tool", "name": "structured_output"}
        assert sent["tools"][0]["input_schema"] == Patch.model_json_schema()


@pytest.mark.parametrize("model", ["gpt-4o", "claude-haiku-4-5"])
def test_an_actor_with_tools_ends_on_its_structured_answer(worker_url: str, model: str) -> None:
    """A turn asking for a tool is no answer to validate; the turn after it is."""
    result = _team(model, tools=("run_tests",)).run_sync("Fix parse().", timeout=60)
    assert result.status == "max_rounds_reached", (result.interruption_reason, result.error)
    assert result.usage.by_role["actor"].tool_calls == 2  # one per agent run
    assert result.usage.by_role["actor"].turns == 4
    assert result.output_as(Patch) is not None


@pytest.mark.parametrize(
    "model", ["openai:sim:actor?format=garbage", "anthropic:sim:actor?format=garbage"]
)
def test_an_answer_that_breaks_the_schema_interrupts_the_actor(worker_url: str, model: str) -> None:
    """A reply that is no JSON (OpenAI) or lacks the required fields (Anthropic's tool
    input): ``actor:round_0:invalid_output``, the error naming the actor and what failed;
    the critic is never called."""
    result = _team(model).run_sync("Fix the off-by-one in parse().", timeout=60)
    assert result.status == "interrupted"
    assert result.interruption_reason == "actor:round_0:invalid_output"
    assert result.error is not None and result.error.startswith("actor (round 0, generate): ")
    assert ("not JSON" in result.error) if "openai" in model else ("'path'" in result.error)
    assert result.output_json is None and result.output  # the raw answer is kept
    assert "critic" not in result.usage.by_role
    assert result.turns == 1


def test_duet_show_json_carries_turns_tokens_cost_and_the_object(worker_url: str) -> None:
    result = _team("gpt-4o").run_sync("Fix the off-by-one in parse().", timeout=60)
    shown = duet_cli(worker_url, "show", result.run_id, "--json")
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert data["turns"] == 3 and data["tokens_in"] == result.tokens_in
    assert data["tokens_out"] == result.tokens_out and data["cost_usd"] == result.cost_usd
    assert data["output_json"] == result.output_json


def _post(url: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, str]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json", **headers}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_the_stand_in_takes_the_schema_requests_the_sdk_types_take_and_no_others(
    stand_in: FakeLLM,
) -> None:
    schema = Patch.model_json_schema()
    openai = {"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]}
    bearer = {"authorization": "Bearer x"}
    url = stand_in.url + "/chat/completions"
    named = {"name": "structured_output", "strict": False, "schema": schema}
    ok = {**openai, "response_format": {"type": "json_schema", "json_schema": named}}
    assert _post(url, ok, bearer)[0] == 200
    nameless = {
        **openai,
        "response_format": {"type": "json_schema", "json_schema": {"schema": schema}},
    }
    status, said = _post(url, nameless, bearer)
    assert status == 400 and "response_format.json_schema.name" in said
    anthropic = {
        "model": "claude-haiku-4-5",
        "max_tokens": 4000,
        "messages": [{"role": "user", "content": "x"}],
        "tools": [{"name": "structured_output", "input_schema": schema}],
    }
    key = {"x-api-key": "x", "anthropic-version": "2023-06-01"}
    url = stand_in.anthropic_url + "/v1/messages"
    forced = {**anthropic, "tool_choice": {"type": "tool", "name": "structured_output"}}
    status, said = _post(url, forced, key)
    assert status == 200 and json.loads(said)["content"][0]["type"] == "tool_use"
    status, said = _post(url, {**anthropic, "tool_choice": {"type": "tool"}}, key)
    assert status == 400 and "tool_choice.name" in said
