"""Where ``Agent.run`` goes: the runner the client layer installs. Pure indirection.

``Agent(architecture=ActorCritic(...)).run(...)`` lives on a pure spec, but running a loop
needs the client API (Redis, the broker). The package's top, ``orchestration/__init__.py``,
installs the client's runner when the package is imported, so the core never imports
the client and the import graph has no circle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from orchestration.core.errors import ConfigError

#: Builds something with ``run`` / ``run_sync`` (a ``Team``) for an architecture and the
#: team's options (``model``, ``instructions``, ``conversations``).
Runner = Callable[..., Any]

_runner: Runner | None = None


def install(runner: Runner) -> None:
    """Make ``runner`` the one ``Agent.run`` uses."""
    global _runner
    _runner = runner


def team_for(architecture: Any, **options: Any) -> Any:
    """The runnable team for ``architecture`` (with ``options``), from the installed runner."""
    if _runner is None:
        raise ConfigError("no runner installed: import the orchestration package first")
    return _runner(architecture, **options)
