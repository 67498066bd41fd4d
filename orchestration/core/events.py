"""The event vocabulary: every event a run or batch emits, by name."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

# Loop events, named as the spec names them.
ACTOR_STARTED = "actor_critic.actor_started"
ACTOR_COMPLETED = "actor_critic.actor_completed"
CRITIC_STARTED = "actor_critic.critic_started"
CRITIQUE = "actor_critic.critique"
APPROVED = "actor_critic.approved"
MAX_ROUNDS_REACHED = "actor_critic.max_rounds_reached"
# An agent with tools: a call its turn asked for, and the call's result.
TOOL_CALL = "actor_critic.tool_call"
TOOL_RESULT = "actor_critic.tool_result"

# Run lifecycle and operations.
RUN_QUEUED = "run.queued"
RUN_STARTED = "run.started"
RUN_FINISHED = "run.finished"
RUN_RESUMED = "run.resumed"
STEP_RETRY = "step.retry"
STEP_FAILED = "step.failed"
BUDGET_WARNING = "budget.warning"

#: The event emitted when a step starts / completes, by phase.
STARTED_BY_PHASE = {"generate": ACTOR_STARTED, "refine": ACTOR_STARTED, "critique": CRITIC_STARTED}
COMPLETED_BY_PHASE = {"generate": ACTOR_COMPLETED, "refine": ACTOR_COMPLETED, "critique": CRITIQUE}
#: ``phase`` field of actor events: the first draft or a revision.
ACTOR_PHASE = {"generate": "draft", "refine": "revision"}


class Event(BaseModel):
    """One event of a run, as stored in its Redis stream and returned in RunResult.events."""

    model_config = ConfigDict(frozen=True, extra="allow")

    type: str
    run_id: str
    ts: float
    round: int | None = None
    data: dict[str, Any] = {}
