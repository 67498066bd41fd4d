"""The TOML config of a review batch: agents, loop, budget, rate limits, inputs. Pure.

A config names the actor and the critic, the loop's settings, and how inputs are read::

    [actor]
    instructions = "Write or repair the code so it is correct and secure."
    model = "claude-sonnet-4-5"

    [critic]
    instructions = "Find security bugs. Reply with strict JSON."
    model = "gpt-4.1"

    [loop]
    max_rounds = 3
    approval_threshold = 0.9

:func:`load_config` reads and checks the whole file at once; every mistake is a
:class:`~orchestration.core.errors.ConfigError` naming the file, the key path and the problem
(``review.toml: loop.max_rounds: must be >= 1``). Values are not coerced: TOML has types,
so ``max_rounds = "3"`` is a mistake worth reporting, not guessing about.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    model_validator,
)

from orchestration.core.agents import Agent, AgentSettings, resolve_model
from orchestration.core.architecture import ActorCritic, LoopSettings
from orchestration.core.budget import Budget
from orchestration.core.callcache import DEFAULT_MAX_ENTRIES, CacheSpec, parse_ttl
from orchestration.core.errors import ConfigError
from orchestration.core.validation import key_path, problems
from orchestration.prices import require_price
from orchestration.state.ratelimits import RateLimit

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

if TYPE_CHECKING:
    from orchestration.client.team import Team

ROLES = ("actor", "critic")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class AgentConfig(AgentSettings):
    """``[actor]`` or ``[critic]``: the settings of one :class:`~orchestration.Agent`, with
    their bounds and defaults from :class:`~orchestration.core.agents.AgentSettings`;
    ``price = {...}`` overrides the price database (``batch`` holds vendor batch rates)."""

    model_config = ConfigDict(strict=True)

    instructions: str = Field(min_length=1)
    #: A JSON file holding the actor's ``output_schema`` (relative to the config file's
    #: directory), instead of the schema written inline as ``output_schema = {...}``.
    output_schema_file: str | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _one_schema_source(self) -> AgentConfig:
        if self.output_schema is not None and self.output_schema_file is not None:
            raise ValueError("set output_schema or output_schema_file, not both")
        return self

    def build(self, name: str, output_schema: dict[str, Any] | None = None) -> Agent:
        """The :class:`~orchestration.Agent` this section describes (``output_schema``:
        the one read from ``output_schema_file``)."""
        return Agent(
            self.instructions,
            model=self.model,
            base_url=self.base_url,
            api_key_env=self.api_key_env,
            temperature=self.temperature,
            effort=self.effort,
            max_tokens=self.max_tokens,
            timeout_s=self.timeout_s,
            price=self.price,
            structured_output=self.structured_output,
            execution=self.execution,
            cache=self.cache,
            tools=self.tools,
            max_turns=self.max_turns,
            mcp_servers=self.mcp_servers,
            tool_options=self.tool_options,
            output_schema=output_schema if output_schema is not None else self.output_schema,
            budget=self.budget,
            name=name,
        )


class LoopConfig(LoopSettings):
    """``[loop]``: rounds, threshold, prompt templates, persistent subagents, the team name
    and its conversations (memory, turns, tokens), with their
    bounds and defaults from :class:`~orchestration.core.architecture.LoopSettings`; a
    template may come from a file instead."""

    model_config = ConfigDict(strict=True)

    critique_template: str | None = Field(default=None, min_length=1)
    refine_template: str | None = Field(default=None, min_length=1)
    #: Paths relative to the config file's directory.
    critique_template_file: str | None = Field(default=None, min_length=1)
    refine_template_file: str | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _one_source_per_template(self) -> LoopConfig:
        for kind in ("critique", "refine"):
            if getattr(self, f"{kind}_template") and getattr(self, f"{kind}_template_file"):
                raise ValueError(f"set {kind}_template or {kind}_template_file, not both")
        return self


class BudgetConfig(Budget):
    """``[budget]``: the fields of :class:`~orchestration.core.budget.Budget`, checked strictly."""

    model_config = ConfigDict(strict=True)

    def build(self) -> Budget:
        """The :class:`~orchestration.core.budget.Budget` this section describes."""
        return Budget.model_validate(self.model_dump())


class RateLimitConfig(_Section):
    """One entry of ``[rate_limits]``: requests and tokens per minute for a model, fleet-wide."""

    rpm: int | None = Field(default=None, gt=0)
    tpm: int | None = Field(default=None, gt=0)

    def build(self) -> RateLimit:
        """The :class:`~orchestration.state.ratelimits.RateLimit` this entry describes."""
        return RateLimit(rpm=self.rpm, tpm=self.tpm)

    @model_validator(mode="after")
    def _something_limited(self) -> RateLimitConfig:
        if self.rpm is None and self.tpm is None:
            raise ValueError("set rpm, tpm or both")
        return self


class CacheConfig(_Section):
    """``[cache]``: serve repeated model calls from the model-call cache (docs/cache.md)."""

    #: How old an answer may be and still be served: ``"7d"``, ``"12h"``, seconds.
    ttl: str | int | float = "7d"
    #: The store keeps at most this many answers (least recently used go first).
    max_entries: int = Field(default=DEFAULT_MAX_ENTRIES, ge=1)
    #: ...and at most this many MB of them.
    max_mb: float = Field(default=512.0, gt=0)
    #: ``false`` turns the section off (as if absent).
    enabled: bool = True

    def build(self, where: str) -> CacheSpec | None:
        """The :class:`~orchestration.core.callcache.CacheSpec` of this section."""
        if not self.enabled:
            return None
        ttl = parse_ttl(self.ttl, f"{where}: cache.ttl")
        return CacheSpec(ttl_s=ttl, max_entries=self.max_entries, max_mb=self.max_mb)


class BatchConfig(_Section):
    """``[batch]``: how a batch runs on the fleet."""

    #: At most this many runs of the batch started and not finished at any moment,
    #: across the whole fleet (``--max-in-flight`` overrides it). Absent: no cap.
    max_in_flight: int | None = Field(default=None, ge=1)


class InputsConfig(_Section):
    """``[inputs]``: how input files are read."""

    #: CSV column holding the prompt.
    prompt_column: str = Field(default="prompt", min_length=1)
    #: CSV column holding the input id (row number when the column is absent or empty).
    id_column: str = Field(default="id", min_length=1)
    #: Longest prompt accepted; longer inputs are rejected. Not above DUET_MAX_PROMPT_CHARS
    #: (a config asking for more is refused at load).
    max_prompt_chars: int | None = Field(default=None, ge=1)
    #: Longest JSONL line (bytes) or CSV row (characters) read; a longer one is rejected
    #: unread. Default: room for the longest prompt, JSON-escaped, and 1 MiB of metadata.
    max_line_bytes: int | None = Field(default=None, ge=1)
    #: The prompt sent: ``{input_id}`` and ``{prompt}`` (the text read) are replaced.
    #: Default: the text as read, or for a directory "File: {input_id}" above it.
    prompt_template: str | None = Field(default=None, min_length=1)
    #: Directory inputs: only files matching one of these globs (``*.py``, ``src/**``).
    include: list[str] = Field(default_factory=list)
    #: Directory inputs: files and folders matching these globs are left out.
    exclude: list[str] = Field(default_factory=list)
    #: Directory inputs: honour ``.gitignore`` files.
    gitignore: bool = True


class ReviewConfig(_Section):
    """A whole review config. Build one with :func:`load_config`."""

    actor: AgentConfig
    critic: AgentConfig
    loop: LoopConfig = LoopConfig()
    #: Caps the whole batch (scope ``batch:<id>``).
    budget: BudgetConfig | None = None
    #: Caps each run (scope ``run:<id>``).
    run_budget: BudgetConfig | None = None
    #: Model name -> limits, e.g. ``[rate_limits."gpt-4.1"] rpm = 500``.
    rate_limits: dict[str, RateLimitConfig] = Field(default_factory=dict)
    inputs: InputsConfig = InputsConfig()
    batch: BatchConfig = BatchConfig()
    #: The model-call cache; off when absent.
    cache: CacheConfig | None = None

    _source: str = PrivateAttr(default="<config>")
    _base_dir: Path = PrivateAttr(default_factory=Path.cwd)
    _templates: dict[str, str | None] | None = PrivateAttr(default=None)

    @property
    def source(self) -> str:
        """The file this config was read from, as given (used in every error message)."""
        return self._source

    def templates(self) -> dict[str, str | None]:
        """``{"critique": ..., "refine": ...}``: inline text, a file's text, or None.

        Raises:
            ConfigError: a template file cannot be read, or a critique template that never
                shows the critic the output (no ``{output}``).
        """
        if self._templates is None:
            found: dict[str, str | None] = {}
            for kind in ("critique", "refine"):
                key = f"loop.{kind}_template"
                text = getattr(self.loop, f"{kind}_template")
                rel = getattr(self.loop, f"{kind}_template_file")
                if rel is not None:
                    key += "_file"
                    file = self._base_dir / rel
                    try:
                        text = file.read_text(encoding="utf-8")
                    except (OSError, UnicodeDecodeError) as exc:
                        raise self._error(
                            key, f"cannot read {str(file)!r}: {_reason(exc)}"
                        ) from exc
                if kind == "critique" and text is not None and "{output}" not in text:
                    raise self._error(
                        key, "must contain {output}, or the critic never sees the output"
                    )
                found[kind] = text
            self._templates = found
        return self._templates

    def build_agents(self) -> tuple[Agent, Agent]:
        """The actor and the critic.

        Raises:
            ConfigError: naming the file and the section of the agent that is wrong.
        """
        agents = []
        for role in ROLES:
            section: AgentConfig = getattr(self, role)
            if role == "critic" and (section.output_schema or section.output_schema_file):
                raise self._error(
                    "critic.output_schema",
                    "is for the actor: the critic's verdict has a fixed shape, "
                    "{score, issues, summary}, which the loop reads",
                )
            schema = self._schema_file(role, section.output_schema_file)
            try:
                agents.append(section.build(role, schema))
            except ConfigError as exc:
                raise self._error(role, str(exc)) from exc
        return agents[0], agents[1]

    def _schema_file(self, role: str, rel: str | None) -> dict[str, Any] | None:
        """The JSON schema in ``[role] output_schema_file``, read; None when unset."""
        if rel is None:
            return None
        file, key = self._base_dir / rel, f"{role}.output_schema_file"
        try:
            value = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            raise self._error(key, f"cannot read {str(file)!r}: {_reason(exc)}") from exc
        except ValueError as exc:
            raise self._error(key, f"{str(file)!r} is not JSON: {exc}") from exc
        if not isinstance(value, dict):
            raise self._error(key, f"{str(file)!r} holds no JSON object")
        return value

    def build_architecture(self) -> ActorCritic:
        """The :class:`~orchestration.ActorCritic` loop, without touching any backend."""
        actor, critic = self.build_agents()
        templates = self.templates()
        settings = self.loop.model_copy(
            update={
                "critique_template": templates["critique"],
                "refine_template": templates["refine"],
                "cache": self.cache.build(self._source) if self.cache is not None else None,
            }
        )
        try:
            return ActorCritic.from_settings(actor=actor, critic=critic, settings=settings)
        except ValueError as exc:
            raise self._error("loop", str(exc)) from exc

    def build_team(self) -> Team:
        """The :class:`~orchestration.Team` that runs this config's loop.

        Raises:
            ConfigError: naming the file and key path of the first problem.
        """
        from orchestration.client.team import (
            Team,  # the client API pulls in redis and celery; load on use
        )

        run_budget = self.run_budget.build() if self.run_budget is not None else None
        return Team(self.build_architecture(), budget=run_budget, conversations=self.loop)

    def build_budget(self) -> Budget | None:
        """The ``[budget]`` section (the whole batch's cap) as a Budget, if given."""
        return self.budget.build() if self.budget is not None else None

    def build_rate_limits(self) -> dict[str, RateLimit]:
        """``[rate_limits]`` as model -> :class:`~orchestration.state.ratelimits.RateLimit`."""
        return {model: limit.build() for model, limit in self.rate_limits.items()}

    def _error(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self._source}: {key}: {message}")


def load_config(path: str | Path) -> ReviewConfig:
    """Read and check a review config.

    The agents and the loop are built once here (pure, no backend), so every mistake a
    run would hit is reported now.

    Args:
        path: the TOML file; template files are found relative to its directory.

    Returns:
        The checked config.

    Raises:
        ConfigError: one line per problem, each ``FILE: KEY.PATH: what is wrong`` (TOML
            syntax errors give the line and column instead of a key path).
    """
    source = str(path)
    file = Path(path)
    try:
        raw = file.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read config: {_reason(exc)}") from exc
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{source}: not UTF-8 text (byte {exc.start})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: {_toml_problem(exc)}") from exc
    except RecursionError:  # tomllib recurses once per level of nested arrays and tables
        raise ConfigError(f"{source}: arrays or tables nested too deep to read") from None
    return parse_config(data, source=source, base_dir=file.parent)


def parse_config(
    data: dict[str, Any], *, source: str = "<config>", base_dir: Path | None = None
) -> ReviewConfig:
    """Check an already parsed config table (see :func:`load_config`)."""
    try:
        # Strict all the way down, the core's models included: TOML has types.
        config = ReviewConfig.model_validate(data, strict=True)
    except ValidationError as exc:
        raise ConfigError(
            "\n".join(f"{source}: {p}" for p in problems(exc, ReviewConfig))
        ) from None
    config._source = source
    config._base_dir = base_dir if base_dir is not None else Path.cwd()
    spec = config.build_architecture().to_spec()
    used = {
        f"{spec.actor.provider}:{spec.actor.model_name}": "actor",
        f"{spec.critic.provider}:{spec.critic.model_name}": "critic",
    }
    for model in config.rate_limits:
        where = key_path(("rate_limits", model))
        try:
            resolved = ":".join(resolve_model(model))
        except ConfigError as exc:
            raise config._error(where, str(exc)) from exc
        if resolved not in used:
            # A limit nobody is held to is a typo, and the batch would run unlimited.
            raise config._error(
                where,
                f"no agent uses model {model!r} (actor.model = {config.actor.model!r}, "
                f"critic.model = {config.critic.model!r})",
            )
    for section in ("budget", "run_budget"):
        budget = getattr(config, section)
        if budget is not None and budget.max_usd is not None:
            # Spending on a model without a price cannot be counted, so the cap would never trip.
            for role in ROLES:
                try:
                    require_price(getattr(spec, role), toml_section=role)
                except ConfigError as exc:
                    raise config._error(f"{section}.max_usd", f"{role}: {exc}") from exc
    return config


# --- messages -----------------------------------------------------------------
_TOML_WHERE = re.compile(r"\s*\(at line (\d+), column (\d+)\)\s*$")


def _toml_problem(exc: Exception) -> str:
    message = str(exc)
    where = _TOML_WHERE.search(message)
    if where is None:
        return f"invalid TOML: {message}"
    return f"line {where[1]}, column {where[2]}: invalid TOML: {message[: where.start()]}"


def _reason(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or str(exc)
