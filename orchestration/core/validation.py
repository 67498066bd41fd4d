"""Checking settings against their models, with one readable line per problem. Pure.

The bounds and defaults of what a caller chooses (an agent's settings, its price, the
loop's settings) are written once, as pydantic models in the core. :func:`checked` is how
``Agent(...)``, ``ActorCritic(...)`` and a config file hold values to them: every problem
becomes ``KEY.PATH: what is wrong`` (``max_tokens: must be >= 1, got 0``), in a
:class:`~orchestration.core.errors.ConfigError`. Values are not coerced (``"3"`` is not a
number): the mistake is reported, not guessed about.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from orchestration.core.errors import ConfigError

M = TypeVar("M", bound=BaseModel)

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_TYPE_NAMES = {
    "int_type": "an integer",
    "float_type": "a number",
    "string_type": "a string",
    "bool_type": "true or false",
    "model_type": "a table",
    "dict_type": "a table",
    "list_type": "an array",
}
_VALUE_TYPES = {
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "an array",
    dict: "a table",
}
_BOUNDS = {
    "greater_than_equal": ">=",
    "greater_than": ">",
    "less_than_equal": "<=",
    "less_than": "<",
}


def checked(model: type[M], data: Mapping[str, Any], *, sep: str = "; ") -> M:
    """``model`` validated strictly from ``data``.

    Raises:
        ConfigError: every problem, ``KEY.PATH: what is wrong``, joined by ``sep``.
    """
    try:
        return model.model_validate(dict(data), strict=True)
    except ValidationError as exc:
        raise ConfigError(sep.join(problems(exc, model))) from None


def problems(exc: ValidationError, root: type[BaseModel]) -> list[str]:
    """One ``KEY.PATH: what is wrong`` line per error of ``exc`` (raised by ``root``)."""
    return [f"{key_path(e['loc'])}: {describe(e, root)}" for e in exc.errors()]


def key_path(loc: tuple[int | str, ...]) -> str:
    """``('rate_limits', 'gpt-4.1', 'rpm')`` -> ``rate_limits."gpt-4.1".rpm``, as TOML writes it."""
    parts: list[str] = []
    for part in loc:
        if isinstance(part, int):
            parts[-1:] = [f"{parts[-1] if parts else ''}[{part}]"]
        elif _BARE_KEY.match(part):
            parts.append(part)
        else:
            parts.append(f'"{part}"')
    return ".".join(parts) or "(top level)"


def describe(error: ErrorDetails, root: type[BaseModel]) -> str:
    """What is wrong, in words: ``must be >= 1, got 0``, ``unknown key (expected one of: ...)``."""
    kind, ctx, value = error["type"], error.get("ctx") or {}, error.get("input")
    if kind == "missing":
        return "required key is missing"
    if kind == "extra_forbidden":
        return "unknown key" + _expected_keys(root, error["loc"])
    if kind in _TYPE_NAMES:
        got = _VALUE_TYPES.get(type(value), type(value).__name__)
        return f"must be {_TYPE_NAMES[kind]}, got {got} {_short(value)}"
    if kind in _BOUNDS:
        limit = next(iter(ctx.values()))
        return f"must be {_BOUNDS[kind]} {limit}, got {_short(value)}"
    if kind == "string_too_short":
        return "must not be empty"
    if kind == "literal_error":
        return f"must be {ctx.get('expected')}, got {_short(value)}"
    if kind == "value_error":
        return str(error["msg"]).removeprefix("Value error, ")
    return str(error["msg"])


def _expected_keys(root: type[BaseModel], loc: tuple[int | str, ...]) -> str:
    """The keys allowed where an unknown one was found, to make a typo obvious."""
    model: type[BaseModel] | None = root
    parts = list(loc[:-1])
    while parts and model is not None:
        part = parts.pop(0)
        if isinstance(part, int):
            continue  # an item of a list: the same model
        field = model.model_fields.get(part)
        if field is None:
            return ""
        model = _model_in(field.annotation)
        if getattr(field.annotation, "__origin__", None) is dict:
            parts = parts[1:]  # the table's own key (a model name), then its section
    return f" (expected one of: {', '.join(model.model_fields)})" if model is not None else ""


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds: itself, or inside ``X | None``, ``dict[str, X]``, ``tuple[X, ...]``."""
    for candidate in (annotation, *getattr(annotation, "__args__", ())):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
