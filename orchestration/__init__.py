"""Duet's orchestration layer: what a run is and what happens next.

The pure core (agents, loop, critique parsing, templates, results) imports no Celery,
Redis or vendor SDK. The client API (Team, RunHandle, BatchHandle) is loaded on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestration.core import runner
from orchestration.core.agents import Agent, AgentSpec, Price
from orchestration.core.architecture import ActorCritic, LoopSpec
from orchestration.core.budget import Budget
from orchestration.core.critique import CriticOutput, parse_critique, parse_score
from orchestration.core.errors import (
    ConfigError,
    DuetError,
    InputError,
    ProviderError,
    RunTimeout,
)
from orchestration.core.results import RoundRecord, RunResult
from orchestration.core.templates import fill_template
from orchestration.core.usage import Usage

if TYPE_CHECKING:
    from orchestration.client.handles import BatchHandle, RunHandle
    from orchestration.client.team import Team, get_budget, list_budgets, reset_budget, set_budgets

_LAZY = {
    "Team": "orchestration.client.team",
    "RunHandle": "orchestration.client.handles",
    "BatchHandle": "orchestration.client.handles",
    # The team module's versions start the embedded default when no Redis is set.
    "set_budgets": "orchestration.client.team",
    "get_budget": "orchestration.client.team",
    "reset_budget": "orchestration.client.team",
    "list_budgets": "orchestration.client.team",
}

__all__ = [
    "ActorCritic",
    "Agent",
    "AgentSpec",
    "BatchHandle",
    "Budget",
    "ConfigError",
    "CriticOutput",
    "DuetError",
    "InputError",
    "LoopSpec",
    "Price",
    "ProviderError",
    "RoundRecord",
    "RunHandle",
    "RunResult",
    "RunTimeout",
    "Team",
    "Usage",
    "fill_template",
    "get_budget",
    "list_budgets",
    "parse_critique",
    "parse_score",
    "reset_budget",
    "set_budgets",
]


def _team_for(architecture: ActorCritic, **options: Any) -> Team:
    from orchestration.client.team import Team

    return Team(architecture, **options)


# The composition root: the pure core's Agent.run reaches the client through this.
runner.install(_team_for)


def __getattr__(name: str) -> Any:
    # The client API pulls in redis and celery; load it only when someone asks for it.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
