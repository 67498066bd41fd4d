"""ActorCritic: the loop's shape, as the spec defines it. Pure data, no I/O."""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestration.core.agents import Agent, AgentSpec, check_call_timeout, team_for
from orchestration.core.callcache import CacheSpec, cache_spec
from orchestration.core.errors import ConfigError, SpecTampered
from orchestration.core.memory import ConversationSettings, check_name
from orchestration.core.tools import DEFAULT_MAX_TURNS, Workspace
from orchestration.core.validation import checked

if TYPE_CHECKING:
    from orchestration.core.agents import LoopRunner
    from orchestration.core.results import RunResult

#: Critique -> refine rounds after the first draft, when a loop sets none.
DEFAULT_MAX_ROUNDS = 3
#: Score at or above which a loop stops approved, when it sets none.
DEFAULT_APPROVAL_THRESHOLD = 0.9
#: Whether ``Team.actor_critic`` and a config file give actor and critic memory.
DEFAULT_PERSISTENT_SUBAGENTS = True
#: The roles of a loop, each one worker.
ROLES = ("actor", "critic")
#: The agent settings newer than teams, with their defaults (``AgentSpec``'s JSON form):
#: left out of a team's id when unset, so a team is the one it was before them.
_TOOL_DEFAULTS: dict[str, Any] = {
    "tools": [],
    "max_turns": DEFAULT_MAX_TURNS,
    "mcp_servers": [],
    "tool_options": None,
    "tool_specs": [],
    "output_schema": None,  # not a tool setting, but newer than the teams before tools
}
#: Agent settings that never make a team another: what the agent may spend.
_NOT_WHO = ("budget",)
#: Which revision a run returns: the last (as the spec's loop does), or the best-scored.
Keep = Literal["last", "best"]
#: ...when a loop sets none.
DEFAULT_KEEP: Keep = "last"


class LoopShape(BaseModel):
    """The loop's own settings (see :class:`LoopSettings`)."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    max_rounds: int = Field(default=DEFAULT_MAX_ROUNDS, ge=1)
    """Critique -> refine rounds after the first draft."""
    approval_threshold: float = Field(default=DEFAULT_APPROVAL_THRESHOLD, ge=0, le=1)
    """Score in [0, 1] at or above which the loop stops approved."""
    critique_template: str | None = None
    """Prompt for the critic; the built-in one when ``None``."""
    refine_template: str | None = None
    """Prompt for refinement; the built-in one when ``None``."""
    persistent_subagents: bool = DEFAULT_PERSISTENT_SUBAGENTS
    """Actor and critic each keep a conversation per team and user, across rounds and runs."""
    cache: CacheSpec | None = None
    """The model-call cache (see :mod:`orchestration.core.callcache`); off when ``None``."""
    keep: Keep = DEFAULT_KEEP
    """Which revision a run returns: ``last`` (the spec's loop), or ``best``: the
    highest-scored one, naming its round (see :func:`~orchestration.core.results.keep_best`)."""
    min_improvement: float | None = Field(default=None, ge=0, le=1)
    """Plateau stop: a critique whose score rose less than this over the one before ends the
    run (``max_rounds_reached``, reason ``plateau``); ``None``: only max_rounds ends it."""


class LoopSettings(ConversationSettings, LoopShape):
    """What a caller chooses for the loop: the one place their bounds and defaults are
    written. ``ActorCritic(...)``, ``Team.actor_critic(...)`` and a config file's ``[loop]``
    are all checked against it: the loop's shape, then the team's conversations."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


def spec_digest(stored: str | bytes) -> str:
    """The content hash of a spec's stored JSON: its id (20 hex digits of SHA-256)."""
    data = stored.encode() if isinstance(stored, str) else stored
    return hashlib.sha256(data).hexdigest()[:20]


def spec_tampering(spec_id: str, stored: str | bytes) -> str | None:
    """Why ``stored`` may not be used as spec ``spec_id`` (its hash differs: it was
    rewritten since it was submitted), else ``None``."""
    found = spec_digest(stored)
    if found == spec_id:
        return None
    return (
        f"loop spec {spec_id} in Redis does not match its content hash (it hashes to "
        f"{found}): it was changed after the run was submitted, so no step of it is run"
    )


def stored_spec(spec_id: str, stored: str | bytes) -> LoopSpec:
    """The spec stored as ``stored`` under ``spec_id``, once it hashes to that id.

    Raises:
        SpecTampered: it does not (:func:`spec_tampering`).
        ConfigError: it is no valid spec; the message names each bad field and why, never
            a value (a forged URL may hold a password).
    """
    tampered = spec_tampering(spec_id, stored)
    if tampered is not None:
        raise SpecTampered(tampered)
    try:
        return LoopSpec.model_validate_json(stored)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
            for e in exc.errors(include_url=False, include_input=False, include_context=False)
        )
        raise ConfigError(f"loop spec {spec_id} in Redis is not a valid spec: {problems}") from None


class LoopSpec(LoopSettings):
    """Everything a worker needs to know about a loop, stored once in Redis by its id.

    Content-addressed: the same actor, critic and settings always give the same id, so a
    batch of ten thousand runs shares one stored spec and workers cache it forever.
    """

    actor: AgentSpec
    critic: AgentSpec
    coordinator: str | None = None
    """The coordinator as the caller described it: ``Team``'s ``model=``, or the outer
    agent of the nested form (its model and instructions). Part of the team's identity."""
    worker_ids: dict[str, str] = Field(default_factory=lambda: {r: r for r in ROLES})
    """The worker id of each role (``role_to_worker_id``); each keeps its conversation."""
    workspace: Workspace | None = None
    """The repository at the commit the runs' tools read (``duet review --git``); None:
    the tools have no tree."""

    def check_timeouts(self, visibility_timeout_s: float) -> None:
        """Refuse an agent whose call the broker's visibility timeout does not outlast
        (:func:`~orchestration.core.agents.check_call_timeout`)."""
        for role, agent in (("actor", self.actor), ("critic", self.critic)):
            check_call_timeout(f"{role} ({agent.model})", agent.timeout_s, visibility_timeout_s)

    @property
    def spec_id(self) -> str:
        """The spec's content hash: the id it is stored under (:func:`spec_digest`)."""
        return spec_digest(self.model_dump_json())

    @property
    def team_id(self) -> str:
        """The team whose conversations runs of this spec continue: its ``name``, else a
        stable id of the actor/critic pair, the loop's settings and the coordinator (how
        much history is kept and sent, and whose, is not part of who the team is)."""
        if self.name:
            return self.name
        who = self.model_dump(
            mode="json",
            include={
                "actor",
                "critic",
                "max_rounds",
                "approval_threshold",
                "critique_template",
                "refine_template",
                "coordinator",
                "worker_ids",
            },
        )
        for role in ROLES:  # agents without tools are the teams they were before tools
            for name, default in _TOOL_DEFAULTS.items():
                if who[role].get(name) == default:
                    del who[role][name]
            for name in _NOT_WHO:
                who[role].pop(name, None)
        text = json.dumps(who, separators=(",", ":"), ensure_ascii=False)
        return "t-" + hashlib.sha256(text.encode()).hexdigest()[:16]


class ActorCritic:
    """An actor that writes and a critic that scores, revising until approval or max_rounds.

    Args:
        actor: the agent that generates and refines outputs.
        critic: the agent that critiques; ideally another vendor's model.
        max_rounds: critique -> refine rounds after the first draft; must be >= 1.
        approval_threshold: score in [0, 1] at or above which the loop stops approved.
        critique_template: prompt for the critic; ``{prompt}`` and ``{output}`` are filled.
        refine_template: prompt for refinement; ``{prompt}``, ``{output}``, ``{critique}``
            and ``{issues_bulleted}`` are filled.
        keep: ``"last"`` (default: the last revision, as the spec's loop returns) or
            ``"best"``: a run returns its highest-scored revision and the round that wrote it.
        min_improvement: end the loop (``max_rounds_reached``, reason ``plateau``) when a
            critique's score rose less than this over the one before; ``None``: never.
        worker_registry: internal wiring set by ``Team.actor_critic`` (worker id ->
            Agent); with it the actor and the critic keep persistent conversations.
        role_to_worker_id: internal wiring set by ``Team.actor_critic`` (``actor`` and
            ``critic`` -> worker id). Each worker id names its role's conversation. Both
            or neither are given, and they must say what ``actor`` and ``critic`` say.

    Raises:
        ConfigError: (a ``ValueError``) ``max_rounds`` not an integer >= 1,
            ``approval_threshold`` or ``min_improvement`` not a number in [0, 1], ``keep``
            not ``"last"`` or ``"best"`` (see :class:`LoopSettings`); an
            actor or critic that is not a plain Agent (one with its own ``architecture=``
            is refused: each actor and critic step is one model call); wiring that
            disagrees with ``actor`` / ``critic``.
    """

    name: str = "actor-critic"

    def __init__(
        self,
        *,
        actor: Agent,
        critic: Agent,
        max_rounds: int = DEFAULT_MAX_ROUNDS,
        approval_threshold: float = DEFAULT_APPROVAL_THRESHOLD,
        critique_template: str | None = None,
        refine_template: str | None = None,
        worker_registry: dict[str, Any] | None = None,
        role_to_worker_id: dict[str, str] | None = None,
        cache: CacheSpec | bool | str | float | None = None,
        keep: Keep = DEFAULT_KEEP,
        min_improvement: float | None = None,
    ) -> None:
        settings = checked(
            LoopSettings,
            {
                "max_rounds": max_rounds,
                "approval_threshold": approval_threshold,
                "critique_template": critique_template,
                "refine_template": refine_template,
                "keep": keep,
                "min_improvement": min_improvement,
            },
        )
        for role, agent in (("actor", actor), ("critic", critic)):
            _check_worker(role, agent)
        _check_wiring(actor, critic, worker_registry, role_to_worker_id)
        self._actor = actor
        self._critic = critic
        self.max_rounds = settings.max_rounds
        self.approval_threshold = settings.approval_threshold
        self.critique_template = settings.critique_template
        self.refine_template = settings.refine_template
        #: Which revision a run returns (``last`` or ``best``).
        self.keep: Keep = settings.keep
        #: The plateau stop's least rise of the score per round; None: none.
        self.min_improvement = settings.min_improvement
        self.worker_registry = worker_registry
        self.role_to_worker_id = role_to_worker_id
        #: The model-call cache of the loop's runs; None: off.
        self.cache = cache_spec(cache)

    @classmethod
    def from_settings(cls, *, actor: Agent, critic: Agent, settings: LoopSettings) -> ActorCritic:
        """The loop ``settings`` describe. With ``persistent_subagents`` the actor and the
        critic are registered as workers that each keep a conversation per user: the wiring
        ``Team.actor_critic`` and a config file share."""
        registry = {"actor": actor, "critic": critic} if settings.persistent_subagents else None
        return cls(
            actor=actor,
            critic=critic,
            max_rounds=settings.max_rounds,
            approval_threshold=settings.approval_threshold,
            critique_template=settings.critique_template,
            refine_template=settings.refine_template,
            worker_registry=registry,
            role_to_worker_id={role: role for role in registry} if registry else None,
            cache=settings.cache,
            keep=settings.keep,
            min_improvement=settings.min_improvement,
        )

    @property
    def actor(self) -> Agent:
        return self._actor

    @property
    def critic(self) -> Agent:
        return self._critic

    def declared_workers(self) -> dict[str, Agent]:
        """Both workers, for visualisation and introspection."""
        return {"actor": self._actor, "critic": self._critic}

    @property
    def persistent_subagents(self) -> bool:
        """Whether actor and critic keep conversations per user (set by Team.actor_critic)."""
        return self.worker_registry is not None

    def persistent(self) -> ActorCritic:
        """This loop wired as ``Team.actor_critic`` wires it by default: the actor and the
        critic are the team's workers, each keeping its conversation (itself when it is
        already wired)."""
        if self.persistent_subagents:
            return self
        return ActorCritic.from_settings(
            actor=self._actor,
            critic=self._critic,
            settings=LoopSettings(
                max_rounds=self.max_rounds,
                approval_threshold=self.approval_threshold,
                critique_template=self.critique_template,
                refine_template=self.refine_template,
                persistent_subagents=True,
                cache=self.cache,
                keep=self.keep,
                min_improvement=self.min_improvement,
            ),
        )

    async def run(self, prompt: str, **kwargs: Any) -> RunResult:
        """Run the loop on ``prompt``: what ``Team.actor_critic(...).run`` does, persistent
        subagents included. Takes ``Team.run``'s arguments (``user_id``, ``timeout``,
        ``metadata``, ``budget``)."""
        return await self._team().run(prompt, **kwargs)

    def run_sync(self, prompt: str, **kwargs: Any) -> RunResult:
        """Blocking form of :meth:`run`."""
        return self._team().run_sync(prompt, **kwargs)

    def _team(self) -> LoopRunner:
        return team_for(self)

    def to_spec(
        self, conversations: ConversationSettings | None = None, *, coordinator: str | None = None
    ) -> LoopSpec:
        """The serialisable spec workers run; a ``sim`` model learns its role here.

        Args:
            conversations: the team's name and its conversation settings (defaults when
                None).
            coordinator: the coordinator as the caller described it (see
                :attr:`LoopSpec.coordinator`).
        """
        memory = conversations or ConversationSettings()
        return LoopSpec(
            actor=_with_sim_role(self._actor.spec, "actor"),
            critic=_with_sim_role(self._critic.spec, "critic"),
            max_rounds=self.max_rounds,
            approval_threshold=self.approval_threshold,
            critique_template=self.critique_template,
            refine_template=self.refine_template,
            persistent_subagents=self.persistent_subagents,
            cache=self.cache,
            keep=self.keep,
            min_improvement=self.min_improvement,
            coordinator=coordinator,
            worker_ids=dict(self.role_to_worker_id or {r: r for r in ROLES}),
            **{field: getattr(memory, field) for field in ConversationSettings.model_fields},
        )

    def __repr__(self) -> str:
        return (
            f"ActorCritic(actor={self._actor!r}, critic={self._critic!r}, "
            f"max_rounds={self.max_rounds}, approval_threshold={self.approval_threshold}, "
            f"keep={self.keep!r})"
        )


def _check_worker(role: str, agent: object) -> None:
    if not isinstance(agent, Agent):
        raise ConfigError(f"ActorCritic {role}= must be an Agent, got {type(agent).__name__}")
    if agent.architecture is not None:
        raise ConfigError(
            f"ActorCritic {role}= has its own architecture={type(agent.architecture).__name__}"
            "(...): each actor and critic step is one model call, so a loop inside the loop "
            f"is not run. Pass a plain Agent as the {role}, or run the inner loop as its "
            "own team and give its result to this one as the prompt."
        )
    if role == "critic" and agent.spec.output_schema is not None:
        raise ConfigError(
            "ActorCritic critic= has an output_schema: the critic's verdict has a fixed "
            "shape, {score, issues, summary} (orchestration.core.critique.CriticOutput), "
            "which the loop reads. Give output_schema to the actor; say what else the "
            "critic should report in its instructions (it lands in issues and summary)."
        )


def _check_wiring(
    actor: Agent,
    critic: Agent,
    registry: dict[str, Any] | None,
    roles: dict[str, str] | None,
) -> None:
    """The persistent-subagent wiring must say what ``actor`` and ``critic`` say."""
    if registry is None and roles is None:
        return
    if registry is None or roles is None:
        raise ConfigError(
            "ActorCritic: pass worker_registry and role_to_worker_id together, or neither "
            "(Team.actor_critic sets both)"
        )
    if not isinstance(roles, dict) or set(roles) != set(ROLES):
        raise ConfigError(
            f"ActorCritic role_to_worker_id must map exactly 'actor' and 'critic' to worker "
            f"ids, got {sorted(roles) if isinstance(roles, dict) else roles!r}"
        )
    if not isinstance(registry, dict):
        raise ConfigError(f"ActorCritic worker_registry must be a dict, got {registry!r}")
    if roles["actor"] == roles["critic"]:
        raise ConfigError(
            f"ActorCritic role_to_worker_id gives actor and critic the same worker "
            f"{roles['actor']!r}: each keeps its own conversation"
        )
    for role, agent in (("actor", actor), ("critic", critic)):
        worker = roles[role]
        check_name(worker, f"ActorCritic role_to_worker_id[{role!r}]")
        found = registry.get(worker)
        if found is None:
            raise ConfigError(
                f"ActorCritic role_to_worker_id[{role!r}] = {worker!r} is not in "
                f"worker_registry (it has {sorted(registry)})"
            )
        same = isinstance(found, Agent) and found.spec == agent.spec and not found.architecture
        if found is not agent and not same:
            raise ConfigError(
                f"ActorCritic worker_registry[{worker!r}] is not the {role} passed as {role}=; "
                "the registry cannot swap in another agent"
            )
    unused = sorted(set(registry) - set(roles.values()))
    if unused:
        raise ConfigError(
            f"ActorCritic worker_registry has workers no role uses: {unused}; only the "
            "actor and the critic run"
        )


def _with_sim_role(spec: AgentSpec, role: str) -> AgentSpec:
    """``sim`` without a role plays the part it is given; other models are unchanged."""
    if spec.provider != "sim":
        return spec
    head, sep, query = spec.model_name.partition("?")
    if head != "sim":
        return spec
    return spec.model_copy(update={"model_name": f"sim:{role}{sep}{query}"})
