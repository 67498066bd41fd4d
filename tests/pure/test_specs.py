"""Agent and ActorCritic specs: provider inference, validation, what workers receive."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from orchestration import ActorCritic, Agent, ConfigError
from orchestration.core.agents import resolve_model
from orchestration.core.architecture import LoopSpec
from orchestration.core.memory import ConversationSettings


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("claude-opus-4-7", ("anthropic", "claude-opus-4-7")),
        ("gpt-4o", ("openai", "gpt-4o")),
        ("o1-mini", ("openai", "o1-mini")),
        ("o3", ("openai", "o3")),
        ("o4-mini", ("openai", "o4-mini")),
        ("chatgpt-4o-latest", ("openai", "chatgpt-4o-latest")),
        ("openai:llama3.1:8b", ("openai", "llama3.1:8b")),
        ("anthropic:my-claude", ("anthropic", "my-claude")),
        ("sim", ("sim", "sim")),
        ("sim?latency_ms=20", ("sim", "sim?latency_ms=20")),
        ("sim:critic?scores=0.3,0.9", ("sim", "sim:critic?scores=0.3,0.9")),
    ],
)
def test_provider_is_inferred_from_the_model(model: str, expected: tuple[str, str]) -> None:
    assert resolve_model(model) == expected


@pytest.mark.parametrize(
    ("model", "says"),
    [
        ("llama3", "Accepted: claude-*"),
        ("gemini-pro", "Accepted: claude-*"),
        ("mistral:7b", "Accepted: claude-*"),
        ("openai:", "no model name"),
        ("", "accepted: claude-*"),
        ("  ", "accepted: claude-*"),
    ],
)
def test_unknown_models_fail_at_construction_listing_what_is_accepted(
    model: str, says: str
) -> None:
    with pytest.raises(ConfigError, match=says.replace("*", r"\*")):
        Agent("x", model=model)


def test_agent_spec_names_the_key_variable_never_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-real-secret")
    spec = Agent("x", model="gpt-4o").spec
    assert spec.api_key_env == "OPENAI_API_KEY"
    assert "sk-real-secret" not in spec.model_dump_json()
    assert (
        Agent("x", model="claude-opus-4-7", api_key_env="TEAM_KEY").spec.api_key_env == "TEAM_KEY"
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"model": "sim", "base_url": "http://x"}, "base_url"),
        ({"model": "gpt-4o", "price": {"input_per_mtok": 1, "output_per_mtok": 1, "x": 1}}, "x"),
        ({"model": "gpt-4o", "max_tokens": 0}, "max_tokens"),
        ({"model": "gpt-4o", "timeout_s": 0}, "timeout_s"),
        ({"model": "gpt-4o", "temperature": 3}, "temperature"),
    ],
)
def test_bad_agent_settings_are_config_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Agent("x", **kwargs)


def _pair() -> tuple[Agent, Agent]:
    return Agent("write", model="sim"), Agent("review", model="sim")


def test_actor_critic_has_the_spec_signature() -> None:
    params = inspect.signature(ActorCritic.__init__).parameters
    assert list(params)[1:] == [
        "actor",
        "critic",
        "max_rounds",
        "approval_threshold",
        "critique_template",
        "refine_template",
        "worker_registry",
        "role_to_worker_id",
        "cache",
        "keep",
        "min_improvement",
    ]
    assert all(
        p.kind is inspect.Parameter.KEYWORD_ONLY for name, p in params.items() if name != "self"
    )
    assert params["max_rounds"].default == 3
    assert params["approval_threshold"].default == 0.9
    assert ActorCritic.name == "actor-critic"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_rounds": 0},
        {"max_rounds": -1},
        {"max_rounds": 1.5},
        {"max_rounds": True},
        {"approval_threshold": -0.01},
        {"approval_threshold": 1.01},
        {"approval_threshold": "0.9"},
    ],
)
def test_actor_critic_validates_its_numbers(kwargs: dict) -> None:
    actor, critic = _pair()
    with pytest.raises(ValueError):
        ActorCritic(actor=actor, critic=critic, **kwargs)


@pytest.mark.parametrize(("rounds", "threshold"), [(1, 0.0), (3, 0.9), (10, 1.0)])
def test_actor_critic_accepts_the_edges(rounds: int, threshold: float) -> None:
    actor, critic = _pair()
    loop = ActorCritic(actor=actor, critic=critic, max_rounds=rounds, approval_threshold=threshold)
    assert loop.declared_workers() == {"actor": actor, "critic": critic}


def test_sim_learns_its_role_from_its_place_in_the_loop() -> None:
    spec = ActorCritic(
        actor=Agent("a", model="sim?latency_ms=5"), critic=Agent("c", model="sim")
    ).to_spec()
    assert spec.actor.model_name == "sim:actor?latency_ms=5"
    assert spec.critic.model_name == "sim:critic"


def test_spec_id_is_content_addressed() -> None:
    a1, c1 = _pair()
    a2, c2 = _pair()
    same = ActorCritic(actor=a1, critic=c1).to_spec().spec_id
    assert same == ActorCritic(actor=a2, critic=c2).to_spec().spec_id
    assert same != ActorCritic(actor=a1, critic=c1, max_rounds=4).to_spec().spec_id


def test_team_defaults_to_persistent_subagents_and_ignores_its_model() -> None:
    from orchestration import Team

    actor, critic = _pair()
    team = Team.actor_critic(actor=actor, critic=critic, model="claude-opus-4-7")
    assert team.spec.persistent_subagents is True
    assert team.architecture.worker_registry == {"actor": actor, "critic": critic}
    assert team.model == "claude-opus-4-7"
    off = Team.actor_critic(actor=actor, critic=critic, persistent_subagents=False)
    assert off.spec.persistent_subagents is False


def test_a_bare_agent_has_no_loop_to_run() -> None:
    with pytest.raises(ConfigError, match="architecture"):
        Agent("x", model="sim").run_sync("hello")


# --- the nested form and the wiring: used or refused, never ignored --------------------
@pytest.mark.parametrize("role", ["actor", "critic"])
def test_an_actor_or_critic_with_its_own_architecture_is_refused(role: str) -> None:
    actor, critic = _pair()
    inner = Agent("loop", model="sim", architecture=ActorCritic(actor=actor, critic=critic))
    pair = {"actor": actor, "critic": critic, role: inner}
    with pytest.raises(ConfigError, match=rf"{role}= has its own architecture=ActorCritic"):
        ActorCritic(**pair)
    with pytest.raises(ConfigError, match=rf"{role}= has its own architecture"):
        from orchestration import Team

        Team.actor_critic(**pair)


def test_an_actor_must_be_an_agent() -> None:
    _, critic = _pair()
    with pytest.raises(ConfigError, match="actor= must be an Agent, got str"):
        ActorCritic(actor="gpt-4o", critic=critic)  # type: ignore[arg-type]


def _wiring(actor: Agent, critic: Agent, **change: object) -> dict[str, object]:
    wiring: dict[str, object] = {
        "worker_registry": {"coder": actor, "reviewer": critic},
        "role_to_worker_id": {"actor": "coder", "critic": "reviewer"},
    }
    wiring.update(change)
    return wiring


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"worker_registry": None}, "together, or neither"),
        ({"role_to_worker_id": None}, "together, or neither"),
        ({"role_to_worker_id": {"actor": "coder"}}, "exactly 'actor' and 'critic'"),
        (
            {"role_to_worker_id": {"actor": "coder", "critic": "reviewer", "x": "y"}},
            "exactly 'actor' and 'critic'",
        ),
        ({"role_to_worker_id": {"actor": "coder", "critic": "coder"}}, "the same worker"),
        ({"role_to_worker_id": {"actor": "coder", "critic": "nobody"}}, "'nobody' is not in"),
        (
            {"role_to_worker_id": {"actor": "coder", "critic": "has space"}},
            "\\['critic'\\]: 'has space' must be",
        ),
        ({"worker_registry": {"coder": "x", "reviewer": None}}, "not in worker_registry|is not"),
        ({"worker_registry": "coder"}, "must be a dict"),
        ({"other": True}, "no role uses: \\['spare'\\]"),
    ],
)
def test_wiring_that_disagrees_with_actor_and_critic_is_refused(
    change: dict[str, object], says: str
) -> None:
    actor, critic = _pair()
    if change.pop("other", None):
        change["worker_registry"] = {"coder": actor, "reviewer": critic, "spare": actor}
    with pytest.raises(ConfigError, match=says):
        ActorCritic(actor=actor, critic=critic, **_wiring(actor, critic, **change))  # type: ignore[arg-type]


def test_a_registry_cannot_swap_in_another_agent() -> None:
    actor, critic = _pair()
    other = Agent("something else", model="sim")
    wiring = _wiring(actor, critic, worker_registry={"coder": other, "reviewer": critic})
    with pytest.raises(ConfigError, match="is not the actor passed as actor="):
        ActorCritic(actor=actor, critic=critic, **wiring)  # type: ignore[arg-type]


def test_worker_ids_name_the_conversations_and_identify_the_team() -> None:
    actor, critic = _pair()
    wired = ActorCritic(actor=actor, critic=critic, **_wiring(actor, critic))  # type: ignore[arg-type]
    assert wired.persistent_subagents
    spec = wired.to_spec()
    assert spec.worker_ids == {"actor": "coder", "critic": "reviewer"}
    default = ActorCritic(actor=actor, critic=critic).persistent().to_spec()
    assert default.worker_ids == {"actor": "actor", "critic": "critic"}
    assert spec.team_id != default.team_id


#: A non-default value of every agent setting that only a model call uses.
CALL_SETTINGS = [
    ("base_url", "http://x"),
    ("api_key_env", "K"),
    ("temperature", 0.2),
    ("max_tokens", 10),
    ("timeout_s", 5.0),
    ("price", {"input_per_mtok": 1.0, "output_per_mtok": 2.0}),
    ("structured_output", True),
    ("execution", "vendor_batch"),
    ("cache", False),
    ("tools", ["run_tests"]),
    ("max_turns", 3),
    ("tool_options", {"command": "pytest"}),
    ("mcp_servers", [{"url": "http://127.0.0.1:9/mcp"}]),
    ("effort", "low"),
    ("output_schema", {"type": "object"}),
    ("budget", {"max_calls": 3}),
]


def test_every_agent_setting_but_model_and_instructions_is_a_call_setting() -> None:
    from orchestration.core.agents import AgentSettings

    assert {name for name, _ in CALL_SETTINGS} == set(AgentSettings.model_fields) - {
        "instructions",
        "model",
    }


@pytest.mark.parametrize(("setting", "value"), CALL_SETTINGS)
def test_the_outer_agent_of_the_nested_form_refuses_call_settings(
    setting: str, value: object
) -> None:
    actor, critic = _pair()
    loop = ActorCritic(actor=actor, critic=critic)
    # A model that takes the setting, so only the nested form's rule can refuse it.
    model = {"base_url": "openai:m", "temperature": "gpt-4.1"}.get(setting, "claude-opus-4-7")
    with pytest.raises(ConfigError, match=rf"got {setting}: this agent coordinates"):
        Agent("Manage.", model=model, architecture=loop, **{setting: value})  # type: ignore[arg-type]


def test_the_outer_agent_needs_an_architecture_it_can_run() -> None:
    with pytest.raises(ConfigError, match="architecture= must be an ActorCritic, got str"):
        Agent("Manage.", model="claude-opus-4-7", architecture="actor-critic")  # type: ignore[arg-type]


def test_team_id_is_stable_and_names_win() -> None:
    def spec(coordinator: str | None = None, **kw: Any) -> LoopSpec:
        a, c = _pair()
        loop = ActorCritic(actor=a, critic=c).persistent()
        return loop.to_spec(ConversationSettings(**kw), coordinator=coordinator)

    assert spec().team_id == spec().team_id
    assert spec().team_id.startswith("t-")
    # how much history is kept, and whose, is not who the team is
    assert spec(conversation_turns=3).team_id == spec().team_id
    assert spec(conversation_max_tokens=10).team_id == spec().team_id
    assert spec(memory="per_user").team_id == spec().team_id
    assert spec("x").team_id != spec().team_id
    assert spec(name="code-review").team_id == "code-review"
    a, c = _pair()
    other = ActorCritic(actor=a, critic=Agent("review harder", model="sim")).to_spec()
    assert other.team_id != spec().team_id


def test_the_nested_form_builds_what_team_actor_critic_builds() -> None:
    from orchestration import Team

    actor, critic = _pair()
    loop = ActorCritic(actor=actor, critic=critic, max_rounds=2, approval_threshold=0.8)
    team = Team.actor_critic(actor=actor, critic=critic, max_rounds=2, approval_threshold=0.8)
    nested = Agent("Manage.", model="claude-opus-4-7", architecture=loop)._team().spec  # type: ignore[attr-defined]
    named = Agent("Manage.", model="claude-opus-4-7", name="reviews", architecture=loop)
    plain = loop._team().spec  # ActorCritic.run's team
    assert nested.persistent_subagents and plain.persistent_subagents
    # the same loop as Team.actor_critic, apart from who coordinates it
    same = {"coordinator", "name"}
    assert nested.model_dump(exclude=same) == team.spec.model_dump(exclude=same)
    assert plain == team.spec  # ActorCritic.run is exactly Team.actor_critic's team
    # the outer agent's model and instructions are used: they make it a team of its own
    assert nested.coordinator is not None and "Manage." in nested.coordinator
    assert nested.team_id != team.spec.team_id
    other = Agent("Coordinate.", model="claude-opus-4-7", architecture=loop)._team().spec  # type: ignore[attr-defined]
    assert other.team_id != nested.team_id
    assert named._team().spec.team_id == "reviews"  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="Agent name: 'a b' must be"):
        Agent("Manage.", model="claude-opus-4-7", name="a b", architecture=loop)
