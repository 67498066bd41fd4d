"""An agent's ``output_schema``: taken as a class or a dict, kept in the spec, asked for
natively, the answer read and validated; refused on a critic."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from duet.config import load_config
from orchestration.core.agents import Agent
from orchestration.core.architecture import ActorCritic, LoopSpec
from orchestration.core.completion import Completion
from orchestration.core.errors import ConfigError
from orchestration.core.outputs import INVALID_OUTPUT, read_output, schema_dict, strict_ok
from orchestration.core.results import build_result
from orchestration.core.structured import structured_output
from orchestration.core.tools import ToolCall
from orchestration.services.step import Seat, _result_from
from workers.providers.anthropic import AnthropicProvider
from workers.providers.openai import OpenAIProvider
from workers.providers.sim import SimProvider

CRITIC = 'Reply with JSON: {"score": 0..1, "issues": [...], "summary": "..."}.'


class Patch(BaseModel):
    path: str
    diff: str
    hunks: int


SCHEMA = Patch.model_json_schema()
GOOD = {"path": "a.py", "diff": "-x\n+y", "hunks": 1}


def _actor(model: str = "gpt-4o", **kwargs: Any) -> Agent:
    return Agent("Fix it.", model=model, output_schema=Patch, **kwargs)


def test_a_model_class_is_kept_as_its_json_schema() -> None:
    spec = _actor().spec
    assert spec.output_schema == SCHEMA
    assert Agent("Fix it.", model="gpt-4o", output_schema=SCHEMA).spec == spec


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (3, "must be a pydantic model class or a JSON schema dict, got int"),
        ({"type": "string"}, 'its root needs "type": "object"'),
        ({"type": "object", "properties": 3}, "not a valid JSON schema: at properties"),
        (str, "must be a pydantic model class"),
        (
            {"type": "object", "properties": {"a": {"$ref": "https://example.invalid/a.json"}}},
            "$ref 'https://example.invalid/a.json' at /properties/a points outside the schema",
        ),
        (
            {"$schema": "https://example.invalid/meta", "type": "object"},
            "$schema 'https://example.invalid/meta' is not a draft jsonschema knows",
        ),
    ],
)
def test_a_bad_schema_is_refused_saying_why(value: object, said: str) -> None:
    with pytest.raises(ConfigError, match="output_schema") as caught:
        Agent("Fix it.", model="gpt-4o", output_schema=value)  # type: ignore[arg-type]
    assert said in str(caught.value)


def test_the_schema_is_part_of_the_stored_spec_and_its_hash() -> None:
    critic = Agent(CRITIC, model="sim:critic")
    plain = ActorCritic(actor=Agent("Fix it.", model="gpt-4o"), critic=critic).to_spec()
    shaped = ActorCritic(actor=_actor(), critic=critic).to_spec()
    assert plain.spec_id != shaped.spec_id
    again = LoopSpec.model_validate_json(shaped.model_dump_json())  # a dict travels
    assert again.actor.output_schema == SCHEMA and again.spec_id == shaped.spec_id
    assert plain.team_id != shaped.team_id


def test_a_critic_with_an_output_schema_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"critic= has an output_schema.*score, issues"):
        ActorCritic(actor=Agent("Fix it.", model="gpt-4o"), critic=_actor())


def test_the_coordinator_of_the_nested_form_refuses_it() -> None:
    inner = ActorCritic(actor=_actor(), critic=Agent(CRITIC, model="sim:critic"))
    with pytest.raises(ConfigError, match="output_schema"):
        Agent("Coordinate.", model="gpt-4o", architecture=inner, output_schema=Patch)


def _config(tmp_path: Path, actor_extra: str, critic_extra: str = "") -> Path:
    file = tmp_path / "review.toml"
    file.write_text(
        '[actor]\ninstructions = "Fix it."\nmodel = "gpt-4o"\n'
        + actor_extra
        + '\n[critic]\ninstructions = "Review."\nmodel = "sim:critic"\n'
        + critic_extra
    )
    return file


def test_a_config_takes_the_schema_inline_or_from_a_file(tmp_path: Path) -> None:
    inline = 'output_schema = { type = "object", properties = { path = { type = "string" } } }\n'
    actor, _ = load_config(_config(tmp_path, inline)).build_agents()
    assert actor.spec.output_schema == {
        "type": "object",
        "properties": {"path": {"type": "string"}},
    }
    (tmp_path / "patch.json").write_text(json.dumps(SCHEMA))
    actor, _ = load_config(_config(tmp_path, 'output_schema_file = "patch.json"\n')).build_agents()
    assert actor.spec.output_schema == SCHEMA


@pytest.mark.parametrize(
    ("actor_extra", "critic_extra", "said"),
    [
        ('output_schema_file = "missing.json"\n', "", "actor.output_schema_file: cannot read"),
        ('output_schema = { type = "array" }\n', "", "actor.output_schema"),
        (
            'output_schema_file = "p.json"\noutput_schema = { type = "object" }\n',
            "",
            "not both",
        ),
        ("", 'output_schema = { type = "object" }\n', "critic.output_schema: is for the actor"),
    ],
)
def test_a_config_schema_mistake_names_its_key(
    tmp_path: Path, actor_extra: str, critic_extra: str, said: str
) -> None:
    with pytest.raises(ConfigError, match="review.toml") as caught:
        load_config(_config(tmp_path, actor_extra, critic_extra)).build_team()
    assert said in str(caught.value)


def test_reading_an_answer_against_the_schema() -> None:
    assert read_output(SCHEMA, json.dumps(GOOD)).value == GOOD
    assert read_output(SCHEMA, f"```json\n{json.dumps(GOOD)}\n```").value == GOOD
    assert read_output(SCHEMA, "prose", native=GOOD).value == GOOD  # the vendor's object
    assert "not JSON" in (read_output(SCHEMA, "Here is the patch").error or "")
    assert "not an object" in (read_output(SCHEMA, "[1]").error or "")
    missing = read_output(SCHEMA, json.dumps({"path": "a.py", "diff": ""})).error or ""
    assert "'hunks' is a required property" in missing
    typed = read_output(SCHEMA, json.dumps({**GOOD, "hunks": "two"})).error or ""
    assert "at hunks:" in typed


def test_strict_mode_only_for_schemas_that_meet_its_rules() -> None:
    closed = {
        "type": "object",
        "properties": {"a": {"type": "string"}},
        "required": ["a"],
        "additionalProperties": False,
    }
    assert strict_ok(closed)
    assert not strict_ok(SCHEMA)  # additional properties allowed
    assert not strict_ok({**closed, "required": []})


def test_who_is_asked_natively() -> None:
    assert structured_output(_actor().spec)
    assert structured_output(_actor("claude-haiku-4-5").spec)
    assert not structured_output(_actor(structured_output=False).spec)
    assert not structured_output(_actor("sim").spec)  # the simulator writes text
    assert not structured_output(Agent("Fix it.", model="gpt-4o").spec)


def test_openai_asks_with_response_format() -> None:
    body = OpenAIProvider().request(_actor().spec, [{"role": "user", "content": "x"}], True)
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "structured_output", "strict": False, "schema": SCHEMA},
    }


def test_anthropic_asks_with_a_forced_tool_and_reads_its_input() -> None:
    spec = _actor("claude-haiku-4-5").spec
    provider = AnthropicProvider()
    body = provider.request(spec, [{"role": "user", "content": "x"}], True)
    assert body["tools"] == [
        {
            "name": "structured_output",
            "description": body["tools"][0]["description"],
            "input_schema": SCHEMA,
        }
    ]
    assert body["tool_choice"] == {"type": "tool", "name": "structured_output"}
    reply = {
        "content": [{"type": "tool_use", "id": "t1", "name": "structured_output", "input": GOOD}],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 5, "output_tokens": 7},
    }
    done = provider.read(reply, structured=True)
    assert done.structured == GOOD and done.tool_calls == ()
    assert json.loads(done.text) == GOOD


def _step(completion: Completion, agent: Agent, phase: str = "generate") -> dict[str, Any]:
    key = "r0.generate" if phase == "generate" else "r1.refine"
    return _result_from(completion, phase, key, Seat(agent.spec, None, 0, 0, True))


def test_a_valid_answer_is_stored_as_its_json() -> None:
    result = _step(Completion("ignored prose", 3, 4, "end", structured=GOOD), _actor())
    assert result["interrupted"] is None and result["structured"] is True
    assert json.loads(result["text"]) == GOOD


def test_an_invalid_answer_interrupts_the_actor_naming_what_failed() -> None:
    result = _step(Completion('{"path": "a.py"}', 3, 4, "end"), _actor(), "refine")
    assert result["interrupted"] == INVALID_OUTPUT
    assert result["error"].startswith("actor (round 1, refine): the reply does not match")
    assert "'diff' is a required property" in result["error"]
    assert result["text"] == '{"path": "a.py"}'  # kept: the run shows what came back


def test_a_turn_asking_for_tools_is_not_read_against_the_schema() -> None:
    asks = Completion("", 3, 4, "end", tool_calls=(ToolCall("c1", "run_tests", {}),))
    assert _step(asks, _actor())["interrupted"] is None


def test_a_cut_answer_is_interrupted_by_its_cut_not_the_schema() -> None:
    assert _step(Completion('{"pa', 3, 4, "max_tokens"), _actor())["interrupted"] == "max_tokens"


def test_the_simulator_answers_an_instance_or_breaks_it_on_request() -> None:
    messages: list[Any] = [{"role": "user", "content": "Fix parse()."}]
    good = SimProvider().complete(_actor("sim").spec, messages)
    assert read_output(SCHEMA, good.text).error is None
    bad = SimProvider().complete(_actor("sim:actor?format=garbage").spec, messages)
    assert "not JSON" in (read_output(SCHEMA, bad.text).error or "")


def test_the_result_carries_the_object_and_the_reference_counts() -> None:
    run = {"run_id": "r", "status": "max_rounds_reached"}
    steps = {
        "r0.generate": {
            "key": "r0.generate",
            "text": json.dumps(GOOD),
            "structured": True,
            "input_tokens": 10,
            "output_tokens": 20,
            "usd": 0.5,
            "calls": 2,
        },
        "r1.critique": {
            "key": "r1.critique",
            "text": "{}",
            "score": 0.5,
            "structured": True,
            "input_tokens": 1,
            "output_tokens": 2,
            "usd": 0.25,
            "calls": 1,
        },
    }
    result = build_result(run, steps, [])
    assert result.output_json == GOOD and result.output_as(Patch) == Patch(**GOOD)
    assert (result.turns, result.tokens_in, result.tokens_out) == (3, 11, 22)
    assert result.cost_usd == 0.75
    dumped = result.model_dump(mode="json")  # what `duet show --json` prints
    assert (dumped["turns"], dumped["tokens_in"], dumped["cost_usd"]) == (3, 11, 0.75)
    plain = build_result(run, {"r0.generate": {**steps["r0.generate"], "structured": False}}, [])
    assert plain.output_json is None and plain.output_as(Patch) is None


def test_a_stored_schema_reaching_outside_itself_is_never_fetched() -> None:
    """jsonschema would fetch a ``$ref`` to a URL from the worker: a spec stored with one
    gets an error naming it, and a reference within the schema (or to a property named
    ``$ref``) still works."""
    remote = {"type": "object", "properties": {"a": {"$dynamicRef": "http://127.0.0.1:9/x"}}}
    found = read_output(remote, '{"a": 1}')
    assert found.value is None
    assert "$dynamicRef 'http://127.0.0.1:9/x' at /properties/a points outside" in (
        found.error or ""
    )
    local = {
        "type": "object",
        "$defs": {"p": {"type": "string"}},
        "properties": {"a": {"$ref": "#/$defs/p"}, "$ref": {"type": "integer"}},
    }
    assert schema_dict(local) == local
    assert read_output(local, '{"a": "x", "$ref": 2}').value == {"a": "x", "$ref": 2}
    assert "is not of type 'string'" in (read_output(local, '{"a": 1}').error or "")
