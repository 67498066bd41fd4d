"""Agent specs: which model, which instructions, which limits. Pure data, no I/O."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any, Literal, Protocol
from urllib.parse import urlsplit

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, field_validator

from orchestration.core import runner, url_credentials
from orchestration.core.budget import Budget
from orchestration.core.capabilities import (
    TEMPERATURE_RANGE,
    effort_problem,
    temperature_problem,
)
from orchestration.core.errors import ConfigError
from orchestration.core.memory import ConversationSettings, check_name
from orchestration.core.outputs import schema_dict
from orchestration.core.tools import DEFAULT_MAX_TURNS, NAME_PATTERN, McpServerSpec, ToolSpec
from orchestration.core.validation import checked

if TYPE_CHECKING:
    from orchestration.core.architecture import ActorCritic
    from orchestration.core.results import RunResult

#: Output token limit per call, when an agent sets none.
DEFAULT_MAX_TOKENS = 1024
#: Seconds one model call may take, when an agent sets none.
DEFAULT_TIMEOUT_S = 120.0

#: Providers Duet can talk to, and the environment variable holding each one's key.
DEFAULT_KEY_ENV = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY", "sim": None}
#: Each vendor's own API hosts: the only hosts its default key (:data:`DEFAULT_KEY_ENV`)
#: is sent to. Any other ``base_url`` gets a key only from a variable ``api_key_env`` names.
VENDOR_HOSTS = {
    "openai": frozenset({"api.openai.com"}),
    "anthropic": frozenset({"api.anthropic.com"}),
}

_OPENAI_PREFIXES = ("gpt-", "o1", "o3", "o4", "chatgpt-")
_ACCEPTED = (
    "claude-* (Anthropic); gpt-*, o1*, o3*, o4*, chatgpt-* (OpenAI); "
    "explicit 'openai:NAME' (with base_url= for any OpenAI-compatible server), "
    "'anthropic:NAME'; or the offline simulator 'sim' / 'sim:ROLE?options'"
)


def default_key_env(provider: str, base_url: str | None) -> str | None:
    """The key variable of an agent that names none: the vendor's own, unless ``base_url``
    is anything but ``https://`` on one of its :data:`VENDOR_HOSTS` (a third-party server
    must not get the vendor's key, nor a plain-HTTP connection carry it), or carries its
    own credentials (:mod:`orchestration.core.url_credentials`)."""
    if base_url is None:
        return DEFAULT_KEY_ENV[provider]
    if url_credentials.has_credentials(base_url):  # it says itself how to authenticate
        return None
    parts = urlsplit(base_url)
    if parts.scheme == "https" and parts.hostname in VENDOR_HOSTS.get(provider, ()):
        return DEFAULT_KEY_ENV[provider]
    return None


def resolve_model(model: str) -> tuple[str, str]:
    """Infer ``(provider, model_name)`` from a model string.

    Raises:
        ConfigError: the string names no provider Duet knows, listing what is accepted.
    """
    if not isinstance(model, str) or not model.strip():
        raise ConfigError(f"model must be a non-empty string; accepted: {_ACCEPTED}")
    model = model.strip()
    if model == "sim" or model.startswith(("sim:", "sim?")):
        return "sim", model
    prefix, sep, rest = model.partition(":")
    if sep and prefix in ("openai", "anthropic"):
        if not rest:
            raise ConfigError(f"model {model!r} has a provider but no model name after ':'")
        return prefix, rest
    if model.startswith("claude-"):
        return "anthropic", model
    if model.startswith(_OPENAI_PREFIXES):
        return "openai", model
    raise ConfigError(f"unknown model {model!r}: cannot tell its provider. Accepted: {_ACCEPTED}")


class LoopRunner(Protocol):
    """What :meth:`Agent.run` needs of a ``Team`` (named here so the core need not import it)."""

    @property
    def run(self) -> Callable[..., Awaitable[RunResult]]: ...

    @property
    def run_sync(self) -> Callable[..., RunResult]: ...


def _as_tuple(value: object) -> object:
    return tuple(value) if isinstance(value, list) else value


class Price(BaseModel):
    """USD per million tokens for one model."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    input_per_mtok: float = Field(ge=0)
    """Input tokens not read from or written to a prompt cache."""
    output_per_mtok: float = Field(ge=0)
    """Output tokens."""
    cached_input_per_mtok: float | None = Field(default=None, ge=0)
    """Input tokens read from a prompt cache; the input rate when ``None``."""
    cache_write_per_mtok: float | None = Field(default=None, ge=0)
    """Input tokens written to a prompt cache (Anthropic); the input rate when ``None``."""
    batch: Price | None = None
    """The rates of a vendor batch call; the standard rates when ``None``."""
    # A list is taken too (TOML and JSON have no tuples), also when checked strictly.
    tiers: Annotated[tuple[PriceTier, ...], BeforeValidator(_as_tuple)] = ()
    """Long-context rates: a call with more input tokens than a tier's threshold pays
    that tier's rates on all its tokens."""


class PriceTier(BaseModel):
    """The rates of calls with more than ``above_input_tokens`` input tokens."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    above_input_tokens: int = Field(ge=0)
    price: Price


Price.model_rebuild()  # its fields name PriceTier, defined after it


class AgentSettings(BaseModel):
    """What a caller chooses for an agent: the one place their bounds and defaults are
    written. ``Agent(...)`` and a config file's ``[actor]`` / ``[critic]`` are both checked
    against it."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    instructions: str
    """The system prompt."""
    model: str
    """``claude-*``, ``gpt-*``, ``openai:NAME``, ``anthropic:NAME``, ``sim``... (see
    :func:`resolve_model`)."""
    base_url: str | None = None
    """Endpoint of an OpenAI- or Anthropic-compatible server, for this agent only; basic-auth
    credentials in it name worker environment variables: ``https://USER:${VARIABLE}@host``
    (see :mod:`orchestration.core.url_credentials`)."""
    api_key_env: str | None = None
    """Name of the environment variable holding the key on the workers."""
    temperature: float | None = Field(
        default=None, ge=TEMPERATURE_RANGE[0], le=TEMPERATURE_RANGE[1]
    )
    """Sampling temperature; the provider's default when ``None``. Only for models that
    take one (see :mod:`orchestration.core.capabilities`)."""
    effort: Literal["minimal", "low", "medium", "high"] | None = None
    """Reasoning effort, for models that take one (OpenAI's reasoning models as
    ``reasoning_effort``, Claude as ``output_config.effort``); the model's default when
    ``None``. Checked against the capability table like ``temperature``."""
    max_tokens: int = Field(default=DEFAULT_MAX_TOKENS, ge=1)
    """Output token limit per call; output cut there interrupts the agent."""
    timeout_s: float = Field(default=DEFAULT_TIMEOUT_S, gt=0)
    """Per-call timeout, seconds."""
    price: Price | None = None
    """USD per million tokens, overriding the price database."""
    structured_output: bool | None = None
    """As a critic, ask for the critique's shape natively; ``None``: when the model is known
    to support it (see :mod:`orchestration.core.structured`)."""
    cache: bool = True
    """``False``: this agent's calls are never served from, nor stored in, the model-call
    cache, even when the loop turns it on."""
    execution: Literal["sync", "vendor_batch"] = "sync"
    """``sync``: each step calls the model. ``vendor_batch``: steps are sent together
    through the vendor's batch API, at its batch price, answered within its window (see
    :mod:`orchestration.core.vendor_batch`). OpenAI and Anthropic models only."""
    # A list is taken too (TOML and JSON have no tuples), also when checked strictly.
    tools: Annotated[
        tuple[Annotated[str, Field(pattern=NAME_PATTERN)], ...], BeforeValidator(_as_tuple)
    ] = ()
    """Names of the tools the agent may call (registered on the workers, see
    ``workers.tools.registry``); checked at submit against what the workers publish."""
    max_turns: int = Field(default=DEFAULT_MAX_TURNS, ge=1)
    """Model calls one agent run may make (tool calls go between them); a run that asks
    for a tool on its last turn is interrupted ``<role>:round_N:max_turns``."""
    mcp_servers: Annotated[tuple[McpServerSpec, ...], BeforeValidator(_as_tuple)] = ()
    """MCP servers whose tools the agent may call too (listed on its first turn of a run,
    then frozen for the run)."""
    tool_options: dict[str, Any] | None = None
    """Options the agent's tools read (``ToolContext.options``): e.g. the command the
    sandbox runs for the review toolset's tests."""
    # A pydantic model class is taken too: its JSON schema is what is kept (and travels).
    output_schema: Annotated[dict[str, Any] | None, BeforeValidator(schema_dict)] = None
    """A JSON schema (root ``"type": "object"``) the actor's answer must match: asked
    for natively, validated, the run's ``output`` its JSON (see
    :mod:`orchestration.core.outputs`). Actors only: a critic's verdict has its own shape."""
    budget: Budget | None = None
    """A cap on this agent's calls within each run (scope ``actor:<run id>`` or
    ``critic:<run id>``), reserved and settled like the run's own budget; running out
    interrupts the run ``budget:actor:<unit>`` / ``budget:critic:<unit>``."""

    def __hash__(self) -> int:  # tool_options is a dict: hashed by the JSON of the whole
        return hash(self.model_dump_json())

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        resolve_model(value)  # ConfigError (a ValueError) lists what is accepted
        return value

    @field_validator("base_url")
    @classmethod
    def _base_url_needs_a_vendor_api(cls, value: str | None, info: ValidationInfo) -> str | None:
        url_credentials.checked(value)
        model = info.data.get("model")  # absent when the model itself was refused
        if value is not None and model is not None and resolve_model(model)[0] == "sim":
            raise ValueError(
                "base_url is for OpenAI- or Anthropic-compatible servers: use "
                f"model='openai:NAME' or 'anthropic:NAME', not {model!r}"
            )
        return value

    @field_validator("api_key_env")
    @classmethod
    def _one_authorization_header(cls, value: str | None, info: ValidationInfo) -> str | None:
        model, url = info.data.get("model"), info.data.get("base_url")
        if (
            value is not None
            and url_credentials.has_credentials(url)
            and model is not None
            and resolve_model(model)[0] == "openai"
        ):
            raise ValueError(
                "an OpenAI-compatible server gets its key and base_url's credentials in the "
                "one Authorization header: use either api_key_env or the ${VARIABLE}s in "
                "base_url"
            )
        return value

    @field_validator("temperature")
    @classmethod
    def _model_takes_temperature(cls, value: float | None, info: ValidationInfo) -> float | None:
        model = info.data.get("model")  # absent when the model itself was refused
        if model is not None:
            problem = temperature_problem(*resolve_model(model), value)
            if problem is not None:
                raise ValueError(problem)
        return value

    @field_validator("tools")
    @classmethod
    def _tools_named_once(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(value)) != len(value):
            raise ValueError(f"tools names a tool twice: {list(value)}")
        return value

    @field_validator("effort")
    @classmethod
    def _model_takes_effort(cls, value: str | None, info: ValidationInfo) -> str | None:
        model = info.data.get("model")
        if model is not None:
            problem = effort_problem(*resolve_model(model), value)
            if problem is not None:
                raise ValueError(problem)
        return value

    @field_validator("execution")
    @classmethod
    def _batch_needs_a_vendor(cls, value: str, info: ValidationInfo) -> str:
        model = info.data.get("model")
        if value == "vendor_batch" and model is not None:
            provider = resolve_model(model)[0]
            if provider not in ("openai", "anthropic"):
                raise ValueError(
                    "vendor_batch runs through OpenAI's or Anthropic's batch API: "
                    f"not for model {model!r}"
                )
        return value


def check_call_timeout(name: str, timeout_s: float, visibility_timeout_s: float) -> None:
    """Refuse a model call timeout the broker's visibility timeout does not outlast.

    A call may take up to its ``timeout_s`` (the SDKs make no retries of their own: each
    retry is a new delivery), and the step's message stays unacknowledged meanwhile; past
    the visibility timeout the broker hands it to another worker.

    Raises:
        ConfigError: naming ``name``, both timeouts and the variables to change.
    """
    if timeout_s >= visibility_timeout_s:
        raise ConfigError(
            f"{name}: timeout_s {timeout_s:g} s is not shorter than the broker's visibility "
            f"timeout ({visibility_timeout_s:g} s, DUET_VISIBILITY_TIMEOUT_S): the broker "
            "would hand the step to another worker mid-call. Lower the agent's timeout_s, or "
            "raise DUET_VISIBILITY_TIMEOUT_S (on every worker and client) above it"
        )


class AgentSpec(AgentSettings):
    """The serialisable part of an :class:`Agent`, as stored in Redis and read by workers:
    its settings and the provider they name.

    Holds the *name* of the environment variable with the API key, never the key.
    """

    provider: str
    """``openai``, ``anthropic`` or ``sim``."""
    model_name: str
    """The model's name at its provider (``sim`` learns its role here)."""
    tool_specs: tuple[ToolSpec, ...] = ()
    """The schemas of :attr:`tools`, as the workers published them at submit: frozen in
    the run's spec, so every turn sees the same tools."""

    @property
    def takes_tools(self) -> bool:
        """Whether a call of this agent offers tools (and may take several turns)."""
        return bool(self.tool_specs or self.mcp_servers)


#: What the agent of the nested form is: every other setting only means something for a
#: model call, which that agent never makes, so it is refused there rather than ignored.
_COORDINATOR_SETTINGS = frozenset({"instructions", "model"})


def _check_coordinator(architecture: object, settings: AgentSettings) -> None:
    """The agent of the nested form runs a loop and makes no call: refuse call settings."""
    if not callable(getattr(architecture, "to_spec", None)):
        raise ConfigError(
            f"architecture= must be an ActorCritic, got {type(architecture).__name__}"
        )
    given = [
        name
        for name, field in AgentSettings.model_fields.items()
        if name not in _COORDINATOR_SETTINGS and getattr(settings, name) != field.default
    ]
    if given:
        raise ConfigError(
            f"Agent(architecture=ActorCritic(...)) got {', '.join(given)}: this agent "
            "coordinates the loop and makes no model call of its own, so these would do "
            "nothing. Set them on the actor or the critic."
        )


class Agent:
    """A model with instructions: the actor or the critic of a loop.

    Args:
        instructions: the system prompt.
        model: ``claude-*``, ``gpt-*``/``o1*``/``o3*``/``o4*``/``chatgpt-*``,
            ``openai:NAME``, ``anthropic:NAME`` or ``sim[:ROLE][?options]``.
        base_url: endpoint of an OpenAI-compatible server (vLLM, Ollama, LiteLLM...) or
            an Anthropic-compatible one (a gateway or proxy), for this agent only.
        api_key_env: name of the environment variable holding the key on the workers.
        temperature: sampling temperature, provider default when ``None``.
        effort: reasoning effort (``minimal``, ``low``, ``medium``, ``high``) for models
            that take one; refused, naming the family, for those that do not.
        max_tokens: output token limit per call; output cut there interrupts the agent.
        timeout_s: per-call timeout.
        price: USD per million tokens (a :class:`Price` or its fields as a dict),
            overriding the price database.
        structured_output: as a critic, ask for ``{score, issues, summary}`` natively
            (OpenAI JSON schema, Anthropic forced tool call); ``None`` (default) does so
            for models known to support it. Replies without the shape are still read.
        execution: ``"sync"`` (default) or ``"vendor_batch"``: calls go out together
            through the vendor's batch API at its batch price (OpenAI, Anthropic).
        tools: names of tools the agent may call between its turns (registered on the
            workers with ``workers.tools.registry.tool``; unknown names are refused at
            submit). Each turn is a model call, each tool call a task of its own.
        max_turns: model calls one agent run may make; asking for a tool on the last
            one interrupts the run ``<role>:round_N:max_turns``.
        mcp_servers: MCP servers whose tools it may call too: ``{"url": ..., "key_env":
            ...}`` (streamable HTTP) or ``{"command": [...]}`` (stdio); listed on its first
            turn of each agent run, then frozen for the run.
        tool_options: options the agent's tools read (``ToolContext.options``).
        budget: a :class:`~orchestration.Budget` capping this agent's calls within each
            run (``max_usd``, ``max_tokens``, ``max_calls``...), beside the run's own; running
            out interrupts the run ``budget:actor:<unit>`` (``budget:critic:<unit>``).
        output_schema: a pydantic model class or a JSON schema dict (an object) the
            actor's answer must match: asked for natively (OpenAI ``response_format``,
            Anthropic forced tool), validated; ``result.output_json`` is the object. A
            reply that does not match interrupts the run ``actor:round_N:invalid_output``.
        architecture: an :class:`~orchestration.ActorCritic` to run as this agent's loop
            (the nested form): ``run`` then runs exactly what ``Team.actor_critic`` runs,
            persistent subagents included. This agent is the coordinator: its
            ``instructions`` and ``model`` identify the team (whose conversations its runs
            continue) and its ``name`` names it. It makes no model call of its own (the
            coordinator is a task), so the call settings above are refused on it rather
            than ignored.
        name: the agent's name; with ``architecture=``, the team's name.

    Raises:
        ConfigError: an unknown model, a bad setting, or a call setting on an agent that
            runs an architecture.
    """

    def __init__(
        self,
        instructions: str,
        *,
        model: str,
        base_url: str | None = None,
        api_key_env: str | None = None,
        temperature: float | None = None,
        effort: Literal["minimal", "low", "medium", "high"] | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        price: Price | dict[str, Any] | None = None,
        structured_output: bool | None = None,
        execution: Literal["sync", "vendor_batch"] = "sync",
        cache: bool = True,
        tools: list[str] | tuple[str, ...] = (),
        max_turns: int = DEFAULT_MAX_TURNS,
        mcp_servers: list[McpServerSpec | dict[str, Any]] | tuple[Any, ...] = (),
        tool_options: dict[str, Any] | None = None,
        output_schema: type[BaseModel] | dict[str, Any] | None = None,
        budget: Budget | None = None,
        architecture: ActorCritic | None = None,
        name: str | None = None,
    ) -> None:
        settings = checked(
            AgentSettings,
            {
                "instructions": instructions,
                "model": model,
                "base_url": base_url,
                "api_key_env": api_key_env,
                "temperature": temperature,
                "effort": effort,
                "max_tokens": max_tokens,
                "timeout_s": timeout_s,
                "price": price,
                "structured_output": structured_output,
                "execution": execution,
                "cache": cache,
                "tools": tools,
                "max_turns": max_turns,
                "mcp_servers": mcp_servers,
                "tool_options": tool_options,
                "output_schema": output_schema,
                "budget": budget,
            },
        )
        if architecture is not None:
            _check_coordinator(architecture, settings)
            check_name(name, "Agent name")
        provider, model_name = resolve_model(model)
        key_env = api_key_env if api_key_env is not None else default_key_env(provider, base_url)
        self.name = name
        self.architecture = architecture
        self.spec = AgentSpec(
            **{**dict(settings), "api_key_env": key_env},
            provider=provider,
            model_name=model_name,
        )

    @property
    def instructions(self) -> str:
        return self.spec.instructions

    @property
    def model(self) -> str:
        return self.spec.model

    def __repr__(self) -> str:
        return f"Agent(model={self.spec.model!r}, instructions={self.spec.instructions[:40]!r})"

    async def run(self, prompt: str, **kwargs: Any) -> RunResult:
        """Run this agent's architecture (the distributed actor-critic loop) on ``prompt``."""
        return await self._team().run(prompt, **kwargs)

    def run_sync(self, prompt: str, **kwargs: Any) -> RunResult:
        """Blocking form of :meth:`run`."""
        return self._team().run_sync(prompt, **kwargs)

    def _team(self) -> LoopRunner:
        if self.architecture is None:
            raise ConfigError(
                "Agent.run needs architecture=ActorCritic(...); a bare agent is a step, not a loop"
            )
        return team_for(self.architecture, coordinator=self)


def team_for(architecture: ActorCritic, *, coordinator: Agent | None = None) -> LoopRunner:
    """The team that runs ``architecture`` as ``Team.actor_critic`` does, persistent
    subagents included; with ``coordinator`` (the outer agent of the nested form) its
    model and instructions identify the team and its name names it."""
    wired = architecture.persistent()
    team: LoopRunner
    if coordinator is None:
        team = runner.team_for(wired)
    else:
        team = runner.team_for(
            wired,
            model=coordinator.model,
            instructions=coordinator.instructions,
            conversations=ConversationSettings(name=coordinator.name),
        )
    return team
