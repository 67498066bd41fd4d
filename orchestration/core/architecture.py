"""ActorCritic: the loop's shape, as the spec defines it. Pure data, no I/O."""

from __future__ import annotations

import hashlib
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from orchestration.core.agents import Agent, AgentSpec
from orchestration.core.validation import checked

#: Critique -> refine rounds after the first draft, when a loop sets none.
DEFAULT_MAX_ROUNDS = 3
#: Score at or above which a loop stops approved, when it sets none.
DEFAULT_APPROVAL_THRESHOLD = 0.9
#: Whether ``Team.actor_critic`` and a config file give actor and critic memory.
DEFAULT_PERSISTENT_SUBAGENTS = True
#: Turns kept per persistent conversation; the oldest are dropped first.
DEFAULT_CONVERSATION_TURNS = 20


class LoopSettings(BaseModel):
    """What a caller chooses for the loop: the one place their bounds and defaults are
    written. ``ActorCritic(...)``, ``Team.actor_critic(...)`` and a config file's ``[loop]``
    are all checked against it."""

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
    """Actor and critic each keep one conversation per user, across rounds and runs."""


class LoopSpec(LoopSettings):
    """Everything a worker needs to know about a loop, stored once in Redis by its id.

    Content-addressed: the same actor, critic and settings always give the same id, so a
    batch of ten thousand runs shares one stored spec and workers cache it forever.
    """

    actor: AgentSpec
    critic: AgentSpec
    conversation_turns: int = Field(default=DEFAULT_CONVERSATION_TURNS, ge=1)
    """Turns kept per persistent conversation; the oldest are dropped first."""

    @property
    def spec_id(self) -> str:
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:20]


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
        worker_registry: internal wiring set by ``Team.actor_critic``.
        role_to_worker_id: internal wiring set by ``Team.actor_critic``.

    Raises:
        ConfigError: (a ``ValueError``) ``max_rounds`` not an integer >= 1, or
            ``approval_threshold`` not a number in [0, 1] (see :class:`LoopSettings`).
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
    ) -> None:
        settings = checked(
            LoopSettings,
            {
                "max_rounds": max_rounds,
                "approval_threshold": approval_threshold,
                "critique_template": critique_template,
                "refine_template": refine_template,
            },
        )
        self._actor = actor
        self._critic = critic
        self.max_rounds = settings.max_rounds
        self.approval_threshold = settings.approval_threshold
        self.critique_template = settings.critique_template
        self.refine_template = settings.refine_template
        self.worker_registry = worker_registry
        self.role_to_worker_id = role_to_worker_id

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

    def to_spec(self, *, conversation_turns: int = DEFAULT_CONVERSATION_TURNS) -> LoopSpec:
        """The serialisable spec workers run; a ``sim`` model learns its role here."""
        return LoopSpec(
            actor=_with_sim_role(self._actor.spec, "actor"),
            critic=_with_sim_role(self._critic.spec, "critic"),
            max_rounds=self.max_rounds,
            approval_threshold=self.approval_threshold,
            critique_template=self.critique_template,
            refine_template=self.refine_template,
            persistent_subagents=self.persistent_subagents,
            conversation_turns=conversation_turns,
        )

    def __repr__(self) -> str:
        return (
            f"ActorCritic(actor={self._actor!r}, critic={self._critic!r}, "
            f"max_rounds={self.max_rounds}, approval_threshold={self.approval_threshold})"
        )


def _with_sim_role(spec: AgentSpec, role: str) -> AgentSpec:
    """``sim`` without a role plays the part it is given; other models are unchanged."""
    if spec.provider != "sim":
        return spec
    head, sep, query = spec.model_name.partition("?")
    if head != "sim":
        return spec
    return spec.model_copy(update={"model_name": f"sim:{role}{sep}{query}"})
