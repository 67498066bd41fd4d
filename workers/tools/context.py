"""What a tool call sees besides its arguments: the reviewed tree, the agent's tool options."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ToolContext:
    """The tree a tool may read (the reviewed repository at the reviewed commit, or None),
    the agent's tool options from its spec, and the ids of the run and call (for logs)."""

    root: Path | None
    run_id: str
    call_id: str
    options: Mapping[str, Any] = field(default_factory=dict)
