"""How a worker runs the tools of its tool tasks: the toolset modules it imports, the
tools it publishes, and one call of a registered function."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from orchestration.core.tools import NAME_PATTERN, McpServerSpec, ToolSpec, Workspace, tool_error
from orchestration.services.tools import CallInfo
from orchestration.settings import get_settings
from orchestration.state.turns import publish_tools
from workers.tools import mcp, registry
from workers.tools.context import ToolContext
from workers.tools.errors import ToolError
from workers.tools.workspace import checkout

log = logging.getLogger(__name__)

#: Seconds one call of an MCP server's tool may take.
MCP_TIMEOUT_S = 60.0


def load_configured() -> None:
    """Import the shipped toolsets and ``DUET_TOOL_MODULES``."""
    missing = registry.load([*registry.SHIPPED, *get_settings().tool_modules])
    for module in missing:
        log.info("toolset %s is not installed here: its tools are not offered", module)


def _server(spec: McpServerSpec) -> mcp.McpServer:
    return mcp.McpServer(url=spec.url, key_env=spec.key_env, command=spec.command)


def list_mcp(server: McpServerSpec) -> list[ToolSpec]:
    """The tools of one MCP server as specs (each has effects, as far as Duet can tell:
    a lost call is never repeated); names vendors refuse are left out."""
    found = []
    for t in mcp.list_tools(_server(server)):
        if re.match(NAME_PATTERN, str(t["name"])):
            schema = t.get("inputSchema") or {"type": "object"}
            found.append(
                ToolSpec(
                    name=t["name"],
                    description=str(t.get("description") or "")[:1000],
                    parameters=schema,
                    pure=False,
                    timeout_s=MCP_TIMEOUT_S,
                    source=server.source,
                )
            )
    return found


def call_mcp(spec: ToolSpec, arguments: dict[str, Any]) -> tuple[str, bool]:
    """Call ``spec`` on the MCP server it was listed from; a server down, a timeout or the
    tool's own error is a tool error."""
    try:
        server = _server(McpServerSpec.from_source(spec.source))
        return mcp.call_tool(server, spec.name, arguments, spec.timeout_s), True
    except ToolError as exc:
        return tool_error(str(exc)), False


def publish(client: Any) -> None:
    """Say which tools this worker knows (``duet:tools``)."""
    publish_tools(client, registry.known())


def run_tool(spec: ToolSpec, arguments: dict[str, Any], where: CallInfo) -> tuple[str, bool]:
    """Run one call of ``spec`` with ``arguments``: a registered function, on the run's
    tree at its commit when the run names one; or a tool of an MCP server."""
    if spec.source.startswith("mcp:"):
        return call_mcp(spec, arguments)
    try:
        root = root_of(where.workspace)
    except ToolError as exc:
        return tool_error(f"{spec.name}: no tree to read: {exc}"), False
    context = ToolContext(root, where.run_id, where.call_id, dict(where.options))
    return registry.call(spec.name, arguments, context)


def root_of(workspace: Workspace | None) -> Path | None:
    """The run's repository at its commit, checked out (read-only, cached by commit) in
    ``DUET_TOOL_CACHE_DIR``; None when the run names none."""
    if workspace is None:
        return None
    return checkout(workspace.source, workspace.commit, cache_dir())


def cache_dir() -> Path:
    """Where this worker keeps repositories' objects and trees for tools."""
    configured = get_settings().tool_cache_dir
    return Path(configured) if configured else Path.home() / ".cache" / "duet" / "tools"


__all__ = ["call_mcp", "list_mcp", "cache_dir", "load_configured", "publish", "root_of", "run_tool"]
