"""The tools this worker process knows: registered by name with :func:`tool`, described
by a JSON schema read from the function's signature and docstring (pydantic), and called
with a :class:`~workers.tools.context.ToolContext` and a time limit.

A spec names tools; the functions stay here. Like Celery tasks, they are found in modules
every worker imports: ``DUET_TOOL_MODULES`` plus the shipped :data:`SHIPPED`.
"""

from __future__ import annotations

import concurrent.futures
import importlib
import inspect
import logging
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar, get_type_hints, overload

from pydantic import ConfigDict, Field, ValidationError, create_model

from orchestration.core.errors import ConfigError
from orchestration.core.tools import NAME_PATTERN, ToolSpec, tool_error
from workers.tools.context import ToolContext
from workers.tools.errors import ToolError

log = logging.getLogger(__name__)

#: Toolset modules every worker imports, besides ``DUET_TOOL_MODULES``.
SHIPPED = ("workers.tools.review", "workers.tools.commands")
#: Threads running tool calls at once in one process (each waits on its tool).
MAX_RUNNING = 32

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Tool:
    """A registered tool: its function, its spec and how its arguments are checked."""

    fn: Callable[..., Any]
    spec: ToolSpec
    #: Validates the arguments a model sends (pydantic model of the parameters).
    arguments: type[Any]
    #: Whether the function's first parameter takes the :class:`ToolContext`.
    takes_context: bool


_TOOLS: dict[str, Tool] = {}
_lock = threading.Lock()
_threads: concurrent.futures.ThreadPoolExecutor | None = None


@overload
def tool(fn: F, *, name: str | None = None, pure: bool, timeout_s: float = 30.0) -> F: ...
@overload
def tool(
    fn: None = None, *, name: str | None = None, pure: bool, timeout_s: float = 30.0
) -> Callable[[F], F]: ...
def tool(
    fn: F | None = None, *, name: str | None = None, pure: bool, timeout_s: float = 30.0
) -> F | Callable[[F], F]:
    """Register ``fn`` as a tool models may call, under ``name`` (its own by default).

    ``pure``: same arguments, same result, no effects (a lost call is run again). A tool
    with effects is never run twice for one call. A first parameter annotated
    :class:`ToolContext` receives the call's context and is not part of the schema.

    Example::

        @tool(pure=True)
        def run_tests(code: str) -> str:
            '''Run the test suite against ``code``; the summary line.'''
    """

    def register(func: F) -> F:
        found = describe(func, name=name, pure=pure, timeout_s=timeout_s)
        with _lock:
            old = _TOOLS.get(found.spec.name)
            if old is not None and old.fn is not func and _qualname(old.fn) != _qualname(func):
                raise ConfigError(
                    f"tool {found.spec.name!r} is registered twice: by {_qualname(old.fn)} "
                    f"and {_qualname(func)}"
                )
            _TOOLS[found.spec.name] = found
        return func

    return register(fn) if fn is not None else register


def describe(fn: Callable[..., Any], *, name: str | None, pure: bool, timeout_s: float) -> Tool:
    """The :class:`Tool` of ``fn``: its schema from the signature, descriptions from the
    docstring (a summary, then Google-style ``Args:``).

    Raises:
        ConfigError: a name vendors refuse, a parameter without a type, ``*args``.
    """
    tool_name = name or fn.__name__
    if not re.match(NAME_PATTERN, tool_name):
        raise ConfigError(f"tool name {tool_name!r} must match {NAME_PATTERN}")
    hints = get_type_hints(fn)
    params = list(inspect.signature(fn).parameters.values())
    takes_context = bool(params) and hints.get(params[0].name) is ToolContext
    if takes_context:
        params = params[1:]
    summary, arg_docs = _docstring(fn.__doc__ or "")
    fields: dict[str, Any] = {}
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise ConfigError(f"tool {tool_name!r}: *args / **kwargs cannot be described")
        if p.name not in hints:
            raise ConfigError(f"tool {tool_name!r}: parameter {p.name!r} has no type")
        default = ... if p.default is p.empty else p.default
        fields[p.name] = (hints[p.name], Field(default, description=arg_docs.get(p.name)))
    model = create_model(  # type: ignore[call-overload]
        f"{tool_name}_arguments", __config__=ConfigDict(extra="forbid"), **fields
    )
    schema = model.model_json_schema()
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    spec = ToolSpec(
        name=tool_name, description=summary, parameters=schema, pure=pure, timeout_s=timeout_s
    )
    return Tool(fn, spec, model, takes_context)


def _docstring(doc: str) -> tuple[str, dict[str, str]]:
    """The summary (text before ``Args:``) and each argument's description."""
    text = inspect.cleandoc(doc)
    head, _, rest = text.partition("\nArgs:")
    args: dict[str, str] = {}
    current = None
    for line in rest.splitlines():
        if line and not line.startswith(" ") and line.rstrip().endswith(":"):
            break  # the next section (Returns:, Raises:)
        found = re.match(r"^\s{2,}(\w+)(?:\s*\([^)]*\))?:\s*(.*)$", line)
        if found and (current is None or len(line) - len(line.lstrip()) <= 8):
            current = found[1]
            args[current] = found[2].strip()
        elif current and line.strip():
            args[current] = f"{args[current]} {line.strip()}"
    return " ".join(head.split()), args


def _qualname(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}"


def get(name: str) -> Tool | None:
    """The tool registered as ``name``, if any."""
    return _TOOLS.get(name)


def known() -> dict[str, ToolSpec]:
    """Every tool this process knows, by name."""
    return {name: t.spec for name, t in sorted(_TOOLS.items())}


def load(modules: Iterable[str]) -> list[str]:
    """Import the toolset ``modules`` (each registers its tools); the ones missing.

    A shipped module that is not there (a worker without the review toolset's extras) is
    left out with a warning; a configured one that fails to import is an error.
    """
    missing = []
    for module in dict.fromkeys(modules):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if module in SHIPPED and exc.name == module:
                missing.append(module)
                continue
            raise ConfigError(f"tool module {module!r} cannot be imported: {exc}") from exc
    return missing


def call(name: str, arguments: dict[str, Any], context: ToolContext) -> tuple[str, bool]:
    """Run tool ``name``: ``(result text, ok)``. Every failure is a result the model
    reads (:func:`~orchestration.core.tools.tool_error`), never an exception: an unknown
    tool, arguments its schema refuses, the tool raising, the tool outlasting its
    ``timeout_s`` (its thread is left to finish; its result is dropped)."""
    found = _TOOLS.get(name)
    if found is None:
        return tool_error(f"unknown tool {name!r}"), False
    try:
        checked = found.arguments.model_validate(arguments)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(arguments)'}: {e['msg']}"
            for e in exc.errors(include_url=False)[:3]
        )
        return tool_error(f"bad arguments for {name}: {problems}"), False
    kwargs = {field: getattr(checked, field) for field in type(checked).model_fields}
    args = (context,) if found.takes_context else ()
    future = _executor().submit(found.fn, *args, **kwargs)
    try:
        value = future.result(timeout=found.spec.timeout_s)
    except concurrent.futures.TimeoutError:
        return tool_error(f"{name} timed out after {found.spec.timeout_s:g} s"), False
    except ToolError as exc:  # a refusal the tool words for the model itself
        return tool_error(str(exc)), False
    except Exception as exc:  # noqa: BLE001 - a tool's failure is the model's to read
        return tool_error(f"{name} raised {type(exc).__name__}: {exc}"), False
    return (value if isinstance(value, str) else _as_text(value)), True


def _as_text(value: Any) -> str:
    import json

    try:
        return json.dumps(value, default=str)
    except (TypeError, ValueError):
        return str(value)


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    global _threads
    if _threads is None:
        with _lock:
            if _threads is None:
                _threads = concurrent.futures.ThreadPoolExecutor(MAX_RUNNING, "duet-tool")
    return _threads


__all__ = ["SHIPPED", "Tool", "call", "describe", "get", "known", "load", "tool"]
