"""The tools this worker process knows: registered by name with :func:`tool`, described
by a JSON schema read from the function's signature and docstring (pydantic), and called
with a :class:`~workers.tools.context.ToolContext` and a time limit.

A spec names tools; the functions stay here. Like Celery tasks, they are found in modules
every worker imports: ``DUET_TOOL_MODULES`` plus the shipped :data:`SHIPPED`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import hashlib
import importlib
import inspect
import logging
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, get_type_hints, overload

from pydantic import ConfigDict, Field, ValidationError, create_model

from orchestration.core.errors import ConfigError
from orchestration.core.toolcache import ToolIdentity
from orchestration.core.tools import NAME_PATTERN, ToolSpec, Workspace, tool_error
from workers.tools.context import ToolContext, ToolScope
from workers.tools.errors import ToolError

log = logging.getLogger(__name__)

#: Toolset modules every worker imports, besides ``DUET_TOOL_MODULES``.
SHIPPED = ("workers.tools.review", "workers.tools.commands")
#: Threads running tool calls at once in one process (each waits on its tool).
MAX_RUNNING = 32

F = TypeVar("F", bound=Callable[..., Any])
#: What a pure tool declares it reads besides its arguments: ``scope -> JSON-able value``
#: (for the review toolset, the repository and the reviewed commit).
Reads = Callable[[ToolScope], Any]


@dataclass(frozen=True)
class Tool:
    """A registered tool: its function, its spec and how its arguments are checked."""

    fn: Callable[..., Any]
    spec: ToolSpec
    #: Validates the arguments a model sends (pydantic model of the parameters).
    arguments: type[Any]
    #: Whether the function's first parameter takes the :class:`ToolContext`.
    takes_context: bool
    #: What a call reads besides its arguments, for the tool-result cache's key
    #: (:func:`identify`); None: the default (the run's tree and the tool options when the
    #: function takes the context, else nothing).
    reads: Reads | None = None
    #: Bumped by hand when the result changes for reasons the function's source does not
    #: show (a helper it calls, a tool it runs): old cached results then miss.
    version: str = ""

    @functools.cached_property
    def fingerprint(self) -> str:
        """A digest of the definition: its spec, ``version``, the function's qualified
        name and source (a changed tool misses what its old self cached); worked out once."""
        try:
            source = inspect.getsource(self.fn)
        except (OSError, TypeError):  # no source file (built at run time): its bytecode
            code = getattr(self.fn, "__code__", None)
            source = code.co_code.hex() if code is not None else repr(self.fn)
        doc = [self.spec.model_dump_json(), self.version, _qualname(self.fn), source]
        return hashlib.sha256("\x00".join(doc).encode()).hexdigest()


_TOOLS: dict[str, Tool] = {}
_lock = threading.Lock()
_threads: concurrent.futures.ThreadPoolExecutor | None = None


@overload
def tool(
    fn: F,
    *,
    name: str | None = None,
    pure: bool,
    timeout_s: float = 30.0,
    reads: Reads | None = None,
    version: str = "",
) -> F: ...
@overload
def tool(
    fn: None = None,
    *,
    name: str | None = None,
    pure: bool,
    timeout_s: float = 30.0,
    reads: Reads | None = None,
    version: str = "",
) -> Callable[[F], F]: ...
def tool(
    fn: F | None = None,
    *,
    name: str | None = None,
    pure: bool,
    timeout_s: float = 30.0,
    reads: Reads | None = None,
    version: str = "",
) -> F | Callable[[F], F]:
    """Register ``fn`` as a tool models may call, under ``name`` (its own by default).

    ``pure``: same arguments, same result, no effects (a lost call is run again). A tool
    with effects is never run twice for one call. A first parameter annotated
    :class:`ToolContext` receives the call's context and is not part of the schema.

    A pure tool's results may be cached (when the run's cache is on), keyed by the tool,
    its arguments and ``reads(scope)``: what it reads besides them (see :func:`identify`).
    Bump ``version`` when its results change for a reason its source does not show.

    Example::

        @tool(pure=True)
        def run_tests(code: str) -> str:
            '''Run the test suite against ``code``; the summary line.'''
    """

    def register(func: F) -> F:
        found = describe(func, name=name, pure=pure, timeout_s=timeout_s)
        found = dataclasses.replace(found, reads=reads, version=version)
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


def identify(
    spec: ToolSpec,
    arguments: Mapping[str, Any],
    workspace: Workspace | None,
    options: Mapping[str, Any],
) -> ToolIdentity | None:
    """What keys a call of ``spec`` in the tool-result cache; None when it may not be
    cached: not a pure function registered here (an MCP server's tool, one with effects),
    or arguments its schema refuses. Arguments are keyed as the schema checked them
    (defaults filled in), so ``{"path": "a"}`` and ``{"path": "a", "start_line": 1}`` meet.
    """
    found = _TOOLS.get(spec.name)
    if found is None or not (found.spec.pure and spec.pure) or spec.source != "python":
        return None
    try:
        checked = found.arguments.model_validate(dict(arguments))
    except ValidationError:
        return None
    scope = ToolScope(workspace, options)
    if found.reads is not None:
        reads = found.reads(scope)
    elif found.takes_context:  # it may read anything the context gives: key all of it
        reads = {"workspace": workspace.model_dump() if workspace else None, "options": options}
    else:
        reads = None
    return ToolIdentity(
        spec.name, found.fingerprint, checked.model_dump(mode="json"), canonical_value(reads)
    )


def canonical_value(value: Any) -> Any:
    """``value`` as JSON holds it (a tuple as a list, a path as its text)."""
    import json

    return json.loads(json.dumps(value, default=str))


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


__all__ = [
    "SHIPPED",
    "Reads",
    "Tool",
    "call",
    "canonical_value",
    "describe",
    "get",
    "identify",
    "known",
    "load",
    "tool",
]
