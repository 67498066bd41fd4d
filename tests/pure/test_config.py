"""Review configs: the examples load, and every mistake names the file and the key path."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest

from duet.config import load_config, parse_config
from orchestration.client.team import Team
from orchestration.core.agents import Agent, AgentSettings, Price, PriceTier
from orchestration.core.architecture import ActorCritic, LoopSettings
from orchestration.core.budget import Budget
from orchestration.core.errors import ConfigError
from orchestration.state.ratelimits import RateLimit
from tests.support import SIM_CONFIG

ROOT = Path(__file__).resolve().parents[2]

BASE = SIM_CONFIG


def _write(tmp_path: Path, text: str, name: str = "review.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _error(tmp_path: Path, text: str) -> str:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    return str(caught.value)


# (extra TOML after BASE, or a whole file when it has no [actor]; expected message).
MISTAKES = [
    ("[loop]\nmax_rounds = 0\n", "loop.max_rounds: must be >= 1, got 0"),
    ('[loop]\nmax_rounds = "3"\n', "loop.max_rounds: must be an integer, got a string '3'"),
    ("[loop]\nmax_rounds = true\n", "loop.max_rounds: must be an integer, got a boolean True"),
    ("[loop]\napproval_threshold = 1.5\n", "loop.approval_threshold: must be <= 1"),
    ("[loop]\nmax_round = 3\n", "loop.max_round: unknown key (expected one of: max_rounds,"),
    ("[lop]\nmax_rounds = 3\n", "lop: unknown key (expected one of: actor, critic, loop,"),
    ("[loop]\npersistent_subagents = 1\n", "loop.persistent_subagents: must be true or false"),
    ('[loop]\nmemory = "user"\n', "loop.memory: must be 'per_run' or 'per_user', got 'user'"),
    ('[loop]\nname = "code review"\n', "loop.name: 'code review' must be 1-64 letters"),
    ("[loop]\nconversation_max_tokens = 0\n", "loop.conversation_max_tokens: must be >= 1"),
    ("[loop]\nconversation_turns = 0\n", "loop.conversation_turns: must be >= 1"),
    ('[loop]\nkeep = "first"\n', "loop.keep: must be 'last' or 'best', got 'first'"),
    ("[loop]\nkeep = true\n", "loop.keep: must be 'last' or 'best', got True"),
    ("[loop]\nmin_improvement = 1.5\n", "loop.min_improvement: must be <= 1.0, got 1.5"),
    ("[loop]\nmin_improvement = -0.1\n", "loop.min_improvement: must be >= 0.0, got -0.1"),
    (
        '[loop]\nmin_improvement = "0.05"\n',
        "loop.min_improvement: must be a number, got a string '0.05'",
    ),
    (
        '[loop]\ncritique_template = "Judge {output}"\ncritique_template_file = "c.txt"\n',
        "loop: set critique_template or critique_template_file, not both",
    ),
    ('[loop]\ncritique_template = "Judge it"\n', "loop.critique_template: must contain {output}"),
    (
        '[loop]\ncritique_template_file = "missing.txt"\n',
        "loop.critique_template_file: cannot read",
    ),
    ("[budget]\nmax_usd = -1\n", "budget.max_usd: must be >= 0"),
    (
        "[budget]\nmax_dollars = 1\n",
        "budget.max_dollars: unknown key (expected one of: max_input_tokens,",
    ),
    ('[budget]\nmax_calls = "10"\n', "budget.max_calls: must be an integer"),
    ("[budget]\nwarn_at = 0\n", "budget.warn_at: must be > 0"),
    ("[run_budget]\nmax_tokens = -5\n", "run_budget.max_tokens: must be >= 0"),
    ('[rate_limits."gpt-4.1"]\nrpm = 0\n', 'rate_limits."gpt-4.1".rpm: must be > 0, got 0'),
    (
        '[rate_limits."gpt-4.1"]\nrps = 1\n',
        'rate_limits."gpt-4.1".rps: unknown key (expected one of: rpm, tpm)',
    ),
    ('[rate_limits."gpt-4.1"]\n', 'rate_limits."gpt-4.1": set rpm, tpm or both'),
    ("[rate_limits.llama]\nrpm = 5\n", "rate_limits.llama: unknown model 'llama'"),
    (
        '[rate_limits."gpt-4o"]\nrpm = 5\n',
        "rate_limits.gpt-4o: no agent uses model 'gpt-4o' (actor.model = 'sim', critic.model = 'sim')",
    ),
    ('[inputs]\ninclude = "*.py"\n', "inputs.include: must be an array"),
    ('[inputs]\nprompt_column = ""\n', "inputs.prompt_column: must not be empty"),
    ("[inputs]\nmax_prompt_chars = 0\n", "inputs.max_prompt_chars: must be >= 1"),
    ("[batch]\nmax_in_flight = 0\n", "batch.max_in_flight: must be >= 1"),
    (
        "[batch]\nmax_inflight = 3\n",
        "batch.max_inflight: unknown key (expected one of: max_in_flight)",
    ),
]


@pytest.mark.parametrize(("extra", "expected"), MISTAKES)
def test_mistake_names_file_key_path_and_problem(tmp_path: Path, extra: str, expected: str) -> None:
    message = _error(tmp_path, BASE + "\n" + extra)
    assert message.startswith(f"{tmp_path / 'review.toml'}: "), message
    assert expected in message


AGENT_MISTAKES = [
    (
        'model = "llama-3"',
        "actor.model: unknown model 'llama-3': cannot tell its provider. Accepted:",
    ),
    ('model = "sim"\nmax_tokens = 0', "actor.max_tokens: must be >= 1, got 0"),
    ('model = "sim"\ntemperature = 3.0', "actor.temperature: must be <= 2"),
    ('model = "sim"\ntimeout_s = 0', "actor.timeout_s: must be > 0"),
    (
        'model = "sim"\ntemprature = 1',
        "actor.temprature: unknown key (expected one of: instructions,",
    ),
    (
        'model = "sim"\nbase_url = "http://x"',
        "actor.base_url: base_url is for OpenAI- or Anthropic-compatible servers",
    ),
    (
        'model = "sim"\nprice = { input_per_mtok = 1, output_per_mtok = 2, batch = { input_per_mtok = 1 } }',
        "actor.price.batch.output_per_mtok: required key is missing",
    ),
    (
        'model = "sim"\nprice = { input_per_mtok = 1 }',
        "actor.price.output_per_mtok: required key is missing",
    ),
    ('model = "sim"\nprice = 3', "actor.price: must be a table, got an integer"),
]


@pytest.mark.parametrize(("lines", "expected"), AGENT_MISTAKES)
def test_agent_mistakes_name_the_agent_key(tmp_path: Path, lines: str, expected: str) -> None:
    text = f'[actor]\ninstructions = "Fix."\n{lines}\n\n[critic]\ninstructions = "Judge."\nmodel = "sim"\n'
    assert expected in _error(tmp_path, text)


def test_missing_sections_and_empty_instructions(tmp_path: Path) -> None:
    message = _error(tmp_path, '[actor]\ninstructions = ""\nmodel = "sim"\n')
    assert "review.toml: actor.instructions: must not be empty" in message
    assert "review.toml: critic: required key is missing" in message


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    message = _error(tmp_path, BASE + "[loop]\nmax_rounds = 0\napproval_threshold = 2.0\n")
    assert len(message.splitlines()) == 2


def test_toml_syntax_error_gives_line_and_column(tmp_path: Path) -> None:
    message = _error(tmp_path, '[actor]\ninstructions = "x"\nmodel = \n')
    assert message == f"{tmp_path / 'review.toml'}: line 3, column 9: invalid TOML: Invalid value"


def test_a_config_nested_too_deep_is_a_config_error_not_a_crash(tmp_path: Path) -> None:
    message = _error(tmp_path, BASE + "x = " + "[" * 5_000 + "]" * 5_000 + "\n")
    assert message == f"{tmp_path / 'review.toml'}: arrays or tables nested too deep to read"


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.toml: cannot read config: No such file"):
        load_config(tmp_path / "nope.toml")


def test_usd_budget_on_a_model_without_a_price_is_refused(tmp_path: Path) -> None:
    text = BASE.replace('model = "sim"', 'model = "openai:my-finetune"', 1)
    message = _error(tmp_path, text + "[budget]\nmax_usd = 5.0\n")
    assert (
        "review.toml: budget.max_usd: actor: no known price for model 'openai:my-finetune'"
        in message
    )
    # The advice is TOML, where the setting goes: not Python's Agent(price=...).
    assert "add [actor] price = { input_per_mtok = ..., output_per_mtok = ... }" in message
    assert "Agent" not in message


def test_anthropic_base_url_is_accepted(tmp_path: Path) -> None:
    text = BASE.replace(
        'model = "sim"', 'model = "anthropic:claude-haiku-4-5"\nbase_url = "http://gw:9/"', 1
    )
    actor, _ = load_config(_write(tmp_path, text)).build_agents()
    assert (actor.spec.provider, actor.spec.base_url) == ("anthropic", "http://gw:9/")


def test_price_with_batch_and_cache_write_rates(tmp_path: Path) -> None:
    text = BASE.replace(
        'model = "sim"',
        'model = "openai:my-finetune"\nprice = { input_per_mtok = 1.0, output_per_mtok = 2.0, '
        "cache_write_per_mtok = 1.25, batch = { input_per_mtok = 0.5, output_per_mtok = 1.0 } }",
        1,
    )
    actor, _ = load_config(_write(tmp_path, text)).build_agents()
    assert actor.spec.price == Price(
        input_per_mtok=1.0,
        output_per_mtok=2.0,
        cache_write_per_mtok=1.25,
        batch=Price(input_per_mtok=0.5, output_per_mtok=1.0),
    )


def test_usd_budget_is_fine_with_an_explicit_price(tmp_path: Path) -> None:
    text = BASE.replace(
        'model = "sim"',
        'model = "openai:my-finetune"\nprice = { input_per_mtok = 1.0, output_per_mtok = 2.0 }',
        1,
    )
    cfg = load_config(_write(tmp_path, text + "[budget]\nmax_usd = 5.0\n"))
    assert cfg.build_budget() == Budget(max_usd=5.0)


# --- what a good config builds ----------------------------------------------------------
def test_template_files_are_read_relative_to_the_config(tmp_path: Path) -> None:
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "critique.txt").write_text("Judge {output} against {prompt}")
    path = _write(
        tmp_path / "templates",
        BASE
        + '[loop]\ncritique_template_file = "critique.txt"\nrefine_template = "Fix: {critique}"\n',
        name="nested.toml",
    )
    spec = load_config(path).build_architecture().to_spec()
    assert spec.critique_template == "Judge {output} against {prompt}"
    assert spec.refine_template == "Fix: {critique}"


def test_full_config_builds_team_budgets_and_rate_limits(tmp_path: Path) -> None:
    with_gpt = 'model = "gpt-4.1"'.join(BASE.rsplit('model = "sim"', 1))
    text = with_gpt + (
        "[loop]\nmax_rounds = 5\napproval_threshold = 0.75\npersistent_subagents = false\n"
        "[budget]\nmax_usd = 2.5\nwarn_at = 0.5\n"
        "[run_budget]\nmax_calls = 9\n"
        '[rate_limits."gpt-4.1"]\nrpm = 100\n'
        '[inputs]\nprompt_column = "question"\nmax_prompt_chars = 5000\n'
    )
    cfg = load_config(_write(tmp_path, text))
    team = cfg.build_team()
    assert (team.spec.max_rounds, team.spec.approval_threshold) == (5, 0.75)
    assert team.spec.persistent_subagents is False
    assert team.spec.memory is None  # a batch's inputs share nothing unless asked
    assert team.budget == Budget(max_calls=9)
    assert cfg.build_budget() == Budget(max_usd=2.5, warn_at=0.5)
    assert cfg.build_rate_limits() == {"gpt-4.1": RateLimit(rpm=100)}
    assert (cfg.inputs.prompt_column, cfg.inputs.max_prompt_chars) == ("question", 5000)


@pytest.mark.parametrize("name", ["review.toml", "review-openai-anthropic.toml"])
def test_examples_load(name: str) -> None:
    cfg = load_config(ROOT / "examples" / name)
    spec = cfg.build_architecture().to_spec()
    assert spec.max_rounds == 3
    assert spec.approval_threshold == 0.9


def _leaves(table: dict, path: str = "") -> dict[str, object]:  # type: ignore[type-arg]
    found: dict[str, object] = {}
    for key, value in table.items():
        if isinstance(value, dict):
            found.update(_leaves(value, f"{path}{key}."))
        else:
            found[f"{path}{key}"] = value
    return found


def test_the_vendor_example_differs_from_the_sim_one_only_where_it_says() -> None:
    """What examples/review.toml and docs/cli.md say the real-model example changes."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib

    sim, real = (
        _leaves(tomllib.loads((ROOT / "examples" / name).read_text()))
        for name in ("review.toml", "review-openai-anthropic.toml")
    )
    differ = {k for k in sim.keys() | real.keys() if sim.get(k) != real.get(k)}
    assert differ == {
        "actor.model",
        "actor.api_key_env",
        "actor.max_tokens",
        "actor.timeout_s",
        "critic.model",
        "critic.api_key_env",
        "critic.temperature",
        "critic.max_tokens",
        "budget.max_usd",
        "budget.warn_at",
        "inputs.max_prompt_chars",
    }
    assert not any(k.startswith("rate_limits") for k in real), "limits outlive a batch"


def test_the_vendor_example_takes_source_files_its_models_can_hold(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from duet.commands.intake import prompt_limit
    from orchestration.settings import get_settings

    monkeypatch.delenv("DUET_MAX_PROMPT_CHARS", raising=False)
    get_settings.cache_clear()
    example = ROOT / "examples" / "review-openai-anthropic.toml"
    assert prompt_limit(load_config(example)) == 120_000
    # The same file with a reply too long for Claude's window is refused, naming it.
    text = example.read_text().replace("max_tokens = 32000", "max_tokens = 90000")
    (tmp_path / "big.toml").write_text(text)
    with pytest.raises(ConfigError) as caught:
        prompt_limit(load_config(tmp_path / "big.toml"))
    message = str(caught.value)
    assert "inputs.max_prompt_chars: 120,000 characters do not fit" in message
    assert "actor's model claude-opus-4-7 (a 200,000-token context window" in message
    assert "at most 48,000" in message  # (200,000 - 2 x 90,000 - 4,000) x 3
    get_settings.cache_clear()


def test_sim_example_is_offline_and_vendor_example_uses_two_vendors() -> None:
    sim = load_config(ROOT / "examples" / "review.toml").build_architecture().to_spec()
    assert (sim.actor.provider, sim.critic.provider) == ("sim", "sim")
    assert "scores=" not in sim.critic.model, (
        "the demo relies on the critic's input-dependent scores"
    )
    real = (
        load_config(ROOT / "examples" / "review-openai-anthropic.toml")
        .build_architecture()
        .to_spec()
    )
    assert (real.actor.provider, real.critic.provider) == ("anthropic", "openai")


# --- one set of rules: Agent(...), ActorCritic(...), Team.actor_critic(...) and the file ---
@pytest.mark.parametrize(
    ("key", "toml", "python"),
    [
        ("max_tokens", "0", 0),
        ("max_tokens", '"5"', "5"),
        ("timeout_s", "0", 0),
        ("temperature", "2.5", 2.5),
        ("base_url", '"http://x"', "http://x"),
        ("model", '"gpt4"', "gpt4"),
        (
            "price",
            "{ input_per_mtok = -1, output_per_mtok = 1 }",
            {"input_per_mtok": -1, "output_per_mtok": 1},
        ),
        (
            "price",
            "{ input_per_mtok = 1, output_per_mtok = 1, bogus = 1 }",
            {"input_per_mtok": 1, "output_per_mtok": 1, "bogus": 1},
        ),
    ],
)
def test_agent_settings_are_checked_alike_in_python_and_in_a_file(
    tmp_path: Path, key: str, toml: str, python: object
) -> None:
    with pytest.raises(ConfigError) as caught:
        Agent("x", **{"model": "sim", key: python})  # type: ignore[arg-type]
    in_python = str(caught.value)
    line = f"{key} = {toml}" if key == "model" else f'model = "sim"\n{key} = {toml}'
    in_file = _error(tmp_path, BASE.replace('model = "sim"', line, 1))
    assert in_python.startswith(f"{key}"), in_python
    assert f"review.toml: actor.{in_python}" in in_file


@pytest.mark.parametrize(
    ("key", "toml", "python"),
    [
        ("max_rounds", "0", 0),
        ("max_rounds", "true", True),
        ("max_rounds", "1.5", 1.5),
        ("approval_threshold", "1.5", 1.5),
        ("approval_threshold", '"0.9"', "0.9"),
        ("keep", '"worst"', "worst"),
        ("min_improvement", "1.5", 1.5),
        ("min_improvement", "-0.01", -0.01),
        ("min_improvement", '"0.1"', "0.1"),
    ],
)
def test_loop_settings_are_checked_alike_in_python_and_in_a_file(
    tmp_path: Path, key: str, toml: str, python: object
) -> None:
    actor, critic = Agent("a", model="sim"), Agent("c", model="sim")
    messages = []
    for build in (ActorCritic, Team.actor_critic):
        with pytest.raises(ConfigError) as caught:
            build(actor=actor, critic=critic, **{key: python})  # type: ignore[operator]
        messages.append(str(caught.value))
    assert messages[0] == messages[1]
    assert messages[0].startswith(f"{key}: must be"), messages[0]
    assert f"review.toml: loop.{messages[0]}" in _error(
        tmp_path, BASE + f"[loop]\n{key} = {toml}\n"
    )


def test_defaults_agree_with_the_core_settings() -> None:
    """Each entry point's default is the one written in the core's settings models."""
    pairs = [
        (Agent.__init__, AgentSettings),
        (ActorCritic.__init__, LoopSettings),
        (Team.actor_critic, LoopSettings),
    ]
    compared = 0
    for function, model in pairs:
        for name, param in inspect.signature(function).parameters.items():
            if name in model.model_fields and param.default is not inspect.Parameter.empty:
                assert param.default == model.model_fields[name].default, (function, name)
                compared += 1
    assert (
        compared == 16 + 7 + 12
    )  # cache= in each; Agent: effort, tools, max_turns, mcp_servers, tool_options,
    # output_schema, budget;
    # Team.actor_critic: the loop's 8, the conversations' 4
    config = parse_config(
        {
            "actor": {"instructions": "a", "model": "sim"},
            "critic": {"instructions": "c", "model": "sim"},
        }
    )
    for name in LoopSettings.model_fields:
        assert getattr(config.loop, name) == LoopSettings.model_fields[name].default
    for name in AgentSettings.model_fields.keys() - {"instructions", "model"}:
        assert getattr(config.actor, name) == AgentSettings.model_fields[name].default
    spec = Team.actor_critic(actor=Agent("a", model="sim"), critic=Agent("c", model="sim")).spec
    assert spec == config.build_team().spec


def test_loop_memory_settings_reach_the_team(tmp_path: Path) -> None:
    text = BASE + (
        '[loop]\nname = "code-review"\nmemory = "per_user"\nconversation_turns = 6\n'
        "conversation_max_tokens = 1500\n"
    )
    spec = load_config(_write(tmp_path, text)).build_team().spec
    assert (spec.team_id, spec.memory) == ("code-review", "per_user")
    assert (spec.conversation_turns, spec.conversation_max_tokens) == (6, 1500)


def test_price_tiers_in_a_file(tmp_path: Path) -> None:
    """A file's price is the core's Price: long-context tiers too, checked strictly."""
    price = (
        "price = { input_per_mtok = 1.0, output_per_mtok = 2.0, tiers = [\n"
        "  { above_input_tokens = 200000, price = { input_per_mtok = 2.0, output_per_mtok = 4.0 } },\n"
        "] }"
    )
    text = BASE.replace('model = "sim"', f'model = "openai:my-finetune"\n{price}', 1)
    actor, _ = load_config(_write(tmp_path, text)).build_agents()
    assert actor.spec.price is not None
    assert actor.spec.price.tiers == (
        PriceTier(above_input_tokens=200_000, price=Price(input_per_mtok=2.0, output_per_mtok=4.0)),
    )
    bad = text.replace("above_input_tokens = 200000", 'above_input_tokens = "200000"')
    assert (
        "actor.price.tiers[0].above_input_tokens: must be an integer, got a string '200000'"
        in _error(tmp_path, bad)
    )


def test_max_in_flight_from_the_config_and_in_python(tmp_path: Path) -> None:
    path = tmp_path / "review.toml"
    path.write_text(BASE + "\n[batch]\nmax_in_flight = 4\n")
    assert load_config(path).batch.max_in_flight == 4
    path.write_text(BASE)
    assert load_config(path).batch.max_in_flight is None
    agents = {"actor": Agent("Fix.", model="sim"), "critic": Agent("Judge.", model="sim")}
    assert Team.actor_critic(**agents, max_in_flight=2).max_in_flight == 2
    for bad in (0, -1, True, 2.5, "3"):
        with pytest.raises(ConfigError, match="max_in_flight: must be a whole number of runs"):
            Team.actor_critic(**agents, max_in_flight=bad)  # type: ignore[arg-type]
