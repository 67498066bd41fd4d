"""``run_command``: the model names a command the agent's options configure; it never
writes a command line. The command runs in :mod:`workers.tools.sandbox` on a copy of the
reviewed tree.

The agent's tool options::

    {"commands": {"tests": ["python", "-m", "pytest", "-q"], "lint": ["ruff", "check", "."]},
     "sandbox": "bwrap",                       # or "none", said explicitly
     "limits": {"timeout_s": 120, "memory_mb": 2048, "cpu_s": 120, "output_bytes": 64000}}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from workers.tools import sandbox
from workers.tools.context import ToolContext
from workers.tools.errors import ToolError
from workers.tools.registry import tool


def configured(options: Mapping[str, Any]) -> dict[str, list[str]]:
    """The commands an agent's options name, each checked to be a list of strings."""
    commands = options.get("commands") or {}
    if not isinstance(commands, Mapping):
        raise ToolError("run_command: the 'commands' option must map names to argument lists")
    checked: dict[str, list[str]] = {}
    for name, argv in commands.items():
        if (
            not isinstance(argv, (list, tuple))
            or not argv
            or not all(isinstance(a, str) for a in argv)
        ):
            raise ToolError(f"run_command: command {name!r} must be a non-empty list of strings")
        checked[str(name)] = list(argv)
    return checked


#: Seconds one run_command call may take, all told (the registry stops waiting then).
TOOL_TIMEOUT_S = 900.0
#: Of those, what copying the tree in and cleaning up may need beside the command.
MARGIN_S = 60.0


@tool(pure=False, timeout_s=TOOL_TIMEOUT_S)
def run_command(ctx: ToolContext, name: str) -> str:
    """Run one of the configured commands (tests, a linter) on a copy of the repository.

    Args:
        name: the command's name, one of those the agent's options configure.
    """
    commands = configured(ctx.options)
    if not commands:
        raise ToolError("run_command: no commands are configured for this agent")
    if name not in commands:
        raise ToolError(f"run_command: no command {name[:80]!r}; configured: {sorted(commands)}")
    if ctx.root is None:
        raise ToolError("run_command: no repository is open for this run")
    limits = sandbox.Limits.from_options(ctx.options.get("limits"))
    if limits.timeout_s > TOOL_TIMEOUT_S - MARGIN_S:
        raise ToolError(
            f"run_command: limits.timeout_s may be at most {TOOL_TIMEOUT_S - MARGIN_S:g}"
            f" (the tool's own limit is {TOOL_TIMEOUT_S:g} s)"
        )
    kind = ctx.options.get("sandbox", "bwrap")
    outcome = sandbox.run(ctx.root, commands[name], sandbox=str(kind), limits=limits)
    if outcome.timed_out:
        head = f"{name}: killed after the time limit of {limits.timeout_s:g} s"
    else:
        head = f"{name}: exit code {outcome.exit_code}"
    if outcome.cut:
        head += f" (output cut: {outcome.cut} bytes from the middle)"
    return f"{head}\n{outcome.output}"
