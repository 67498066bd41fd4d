"""Agent and ActorCritic specs: provider inference, validation, what workers receive."""

from __future__ import annotations

import inspect

import pytest

from orchestration import ActorCritic, Agent, ConfigError
from orchestration.core.agents import resolve_model


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
        "actor", "critic", "max_rounds", "approval_threshold", "critique_template",
        "refine_template", "worker_registry", "role_to_worker_id",
    ]  # fmt: skip
    assert all(
        p.kind is inspect.Parameter.KEYWORD_ONLY for name, p in params.items() if name != "self"
    )
    assert params["max_rounds"].default == 3
    assert params["approval_threshold"].default == 0.9
    assert ActorCritic.name == "actor-critic"


@pytest.mark.parametrize(
    "kwargs",
    [{"max_rounds": 0}, {"max_rounds": -1}, {"max_rounds": 1.5}, {"max_rounds": True},
     {"approval_threshold": -0.01}, {"approval_threshold": 1.01}, {"approval_threshold": "0.9"}],
)  # fmt: skip
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
