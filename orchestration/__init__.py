"""Duet's orchestration layer: what a run is and what happens next.

The pure core (agents, loop, critique parsing, templates, results) imports no Celery,
Redis or vendor SDK. The client API (Team, RunHandle, BatchHandle) is loaded on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .agents import Agent, AgentSpec, Price
from .architecture import ActorCritic, LoopSpec
from .budget import Budget
from .critique import CriticOutput, parse_critique, parse_score
from .errors import BudgetExceeded, ConfigError, DuetError, InputError, ProviderError, RunTimeout
from .results import RoundRecord, RunResult
from .templates import fill_template
from .usage import Usage

if TYPE_CHECKING:
    from .client import BatchHandle, RunHandle, get_budget, list_budgets, reset_budget, set_budgets
    from .team import Team

_LAZY = {
    "Team": ".team",
    "RunHandle": ".client",
    "BatchHandle": ".client",
    "set_budgets": ".client",
    "get_budget": ".client",
    "reset_budget": ".client",
    "list_budgets": ".client",
}

__all__ = [
    "ActorCritic", "Agent", "AgentSpec", "BatchHandle", "Budget", "BudgetExceeded", "ConfigError",
    "CriticOutput", "DuetError", "InputError", "LoopSpec", "Price", "ProviderError",
    "RoundRecord", "RunHandle", "RunResult", "RunTimeout", "Team", "Usage",
    "fill_template", "get_budget", "list_budgets", "parse_critique", "parse_score",
    "reset_budget", "set_budgets",
]  # fmt: skip


def __getattr__(name: str) -> Any:
    # The client API pulls in redis and celery; load it only when someone asks for it.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
