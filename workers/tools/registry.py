"""Stand-in for the tool registry (the engine's branch owns the real one): records a tool's
name, purity and timeout on the function and in :data:`TOOLS`, so the toolsets import."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, overload

F = TypeVar("F", bound=Callable[..., Any])

#: Every registered tool by name.
TOOLS: dict[str, Callable[..., Any]] = {}


@overload
def tool(fn: F, *, name: str | None = None, pure: bool, timeout_s: float = 30.0) -> F: ...
@overload
def tool(
    fn: None = None, *, name: str | None = None, pure: bool, timeout_s: float = 30.0
) -> Callable[[F], F]: ...
def tool(
    fn: F | None = None, *, name: str | None = None, pure: bool, timeout_s: float = 30.0
) -> F | Callable[[F], F]:
    """Register ``fn`` as a tool under ``name`` (its own name by default)."""

    def register(f: F) -> F:
        tool_name = name or f.__name__
        f.tool_name = tool_name  # type: ignore[attr-defined]
        f.tool_pure = pure  # type: ignore[attr-defined]
        f.tool_timeout_s = timeout_s  # type: ignore[attr-defined]
        TOOLS[tool_name] = f
        return f

    return register(fn) if fn is not None else register
