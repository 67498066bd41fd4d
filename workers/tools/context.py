"""What a tool call sees besides its arguments: the reviewed tree, the agent's tool options."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestration.core.tools import Workspace


@dataclass(frozen=True)
class ToolContext:
    """The tree a tool may read (the reviewed repository at the reviewed commit, or None),
    the agent's tool options from its spec, and the ids of the run and call (for logs)."""

    root: Path | None
    run_id: str
    call_id: str
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolScope:
    """What a pure tool's ``reads`` function sees to say what a call reads besides its
    arguments (the tree itself is not checked out for it: a cache hit needs none)."""

    #: The reviewed repository and commit (or None).
    workspace: Workspace | None
    #: The agent's tool options.
    options: Mapping[str, Any] = field(default_factory=dict)


def reviewed_tree(scope: ToolScope) -> dict[str, str] | None:
    """What a tool that reads only the reviewed tree reads: the repository and the commit
    (a ``reads`` for :func:`~workers.tools.registry.tool`; None when the run names none)."""
    if scope.workspace is None:
        return None
    return {"repository": scope.workspace.source, "commit": scope.workspace.commit}
