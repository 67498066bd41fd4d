"""How a worker runs the tools of its tool tasks: the toolset modules it imports, the
tools it publishes, and one call of a registered function."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestration.core.tools import ToolSpec, tool_error
from orchestration.services.tools import CallInfo
from orchestration.settings import get_settings
from orchestration.state.turns import publish_tools
from workers.tools import registry
from workers.tools.context import ToolContext

log = logging.getLogger(__name__)


def load_configured() -> None:
    """Import the shipped toolsets and ``DUET_TOOL_MODULES``."""
    missing = registry.load([*registry.SHIPPED, *get_settings().tool_modules])
    for module in missing:
        log.info("toolset %s is not installed here: its tools are not offered", module)


def publish(client: Any) -> None:
    """Say which tools this worker knows (``duet:tools``)."""
    publish_tools(client, registry.known())


def run_tool(spec: ToolSpec, arguments: dict[str, Any], where: CallInfo) -> tuple[str, bool]:
    """Run one call of ``spec`` (a registered function) with ``arguments``."""
    if spec.source != "python":
        return tool_error(f"{spec.name}: tools from {spec.source} are not served here"), False
    context = ToolContext(where.root, where.run_id, where.call_id, dict(where.options))
    return registry.call(spec.name, arguments, context)


def root_of(run: Mapping[str, str]) -> Path | None:
    """The tree a run's tools read: none yet (a review names its repository)."""
    return None


__all__ = ["load_configured", "publish", "root_of", "run_tool"]
