"""ActorCritic: the loop's shape, as the spec defines it. Pure data, no I/O."""

from __future__ import annotations

import hashlib
from typing import Any

from pydantic import BaseModel, ConfigDict

from orchestration.core.agents import Agent, AgentSpec


class LoopSpec(BaseModel):
    """Everything a worker needs to know about a loop, stored once in Redis by its id.

    Content-addressed: the same actor, critic and settings always give the same id, so a
    batch of ten thousand runs shares one stored spec and workers cache it forever.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    actor: AgentSpec
    critic: AgentSpec
    max_rounds: int
    approval_threshold: float
    critique_template: str | None = None
    refine_template: str | None = None
    persistent_subagents: bool = True
    #: Turns kept per persistent conversation; the oldest are dropped first.
    conversation_turns: int = 20

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
        ValueError: ``max_rounds < 1`` or ``approval_threshold`` outside [0, 1].
    """

    name: str = "actor-critic"

    def __init__(
        self,
        *,
        actor: Agent,
        critic: Agent,
        max_rounds: int = 3,
        approval_threshold: float = 0.9,
        critique_template: str | None = None,
        refine_template: str | None = None,
        worker_registry: dict[str, Any] | None = None,
        role_to_worker_id: dict[str, str] | None = None,
    ) -> None:
        if isinstance(max_rounds, bool) or not isinstance(max_rounds, int) or max_rounds < 1:
            raise ValueError(f"max_rounds must be an integer >= 1, got {max_rounds!r}")
        if not isinstance(approval_threshold, int | float) or not (
            0.0 <= float(approval_threshold) <= 1.0
        ):
            raise ValueError(
                f"approval_threshold must be in [0.0, 1.0], got {approval_threshold!r}"
            )
        self._actor = actor
        self._critic = critic
        self.max_rounds = max_rounds
        self.approval_threshold = float(approval_threshold)
        self.critique_template = critique_template
        self.refine_template = refine_template
        self.worker_registry = worker_registry
        self.role_to_worker_id = role_to_worker_id

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

    def to_spec(self, *, conversation_turns: int = 20) -> LoopSpec:
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
