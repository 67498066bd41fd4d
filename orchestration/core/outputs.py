"""Structured output of an agent (``output_schema``): the schema as JSON data, and the reply
read and checked against it. Pure, no I/O.

A schema is given as a pydantic model class or a JSON schema dict; only the dict travels
(it is part of the run's stored spec, so the spec hash covers it). The vendor is asked for
it natively (``orchestration.core.structured``); the reply is validated here all the same,
since an OpenAI-compatible server or a non-strict schema guarantees nothing.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

import jsonschema
from pydantic import BaseModel

#: The name of the output's shape: the OpenAI schema's and the Anthropic tool's.
OUTPUT_NAME = "structured_output"
#: What the tool is for, as the Anthropic model reads it.
OUTPUT_DESCRIPTION = "Give your final answer: its fields as the schema describes them."
#: The interruption of a reply that does not match the agent's ``output_schema``.
INVALID_OUTPUT = "invalid_output"
#: Longest validation message kept in a run's error.
_MESSAGE_MAX = 300
#: The keywords that name another schema: one outside this one would be fetched by
#: jsonschema (over the network, from a worker), so only ``#...`` references are taken.
_REFERENCES = ("$ref", "$dynamicRef", "$recursiveRef")


def schema_dict(value: object) -> dict[str, Any] | None:
    """``value`` as a JSON schema dict: a pydantic model class's schema, or a dict checked
    to be a valid JSON schema whose root is an object (what both vendors take).

    Raises:
        ValueError: anything else, saying what is accepted and what is wrong.
    """
    if value is None:
        return None
    if isinstance(value, type) and issubclass(value, BaseModel):
        value = value.model_json_schema()
    if not isinstance(value, dict):
        raise ValueError(
            f"must be a pydantic model class or a JSON schema dict, got {type(value).__name__}"
        )
    outside = _outside(value)
    if outside is not None:
        raise ValueError(outside)
    try:
        jsonschema.validators.validator_for(value).check_schema(value)
    except jsonschema.SchemaError as exc:
        raise ValueError(f"not a valid JSON schema: {_brief(exc)}") from None
    if value.get("type") != "object":
        raise ValueError(
            'must describe a JSON object (its root needs "type": "object"): '
            "both vendors' structured outputs are objects"
        )
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"output_schema does not serialize as JSON: {exc}") from None
    return value


def strict_ok(schema: Any) -> bool:
    """Whether ``schema`` meets OpenAI's strict mode (every object closed, every property
    required), so the vendor may be asked to guarantee it."""
    if isinstance(schema, list):
        return all(strict_ok(s) for s in schema)
    if not isinstance(schema, dict):
        return True
    if schema.get("type") == "object" or "properties" in schema:
        props = schema.get("properties") or {}
        if schema.get("additionalProperties") is not False:
            return False
        if set(schema.get("required") or ()) != set(props):
            return False
    return all(strict_ok(v) for k, v in schema.items() if k not in ("enum", "const", "default"))


class OutputReading(NamedTuple):
    """The reply read against the schema: its object, or why it is not one."""

    value: dict[str, Any] | None
    error: str | None


def read_output(schema: dict[str, Any], text: str, native: object = None) -> OutputReading:
    """The agent's answer as an object valid against ``schema``: the vendor's native
    object when there is one, else the reply's text as JSON (a code fence around it is
    allowed); the error says what failed, never raising."""
    value: object = native
    if not isinstance(value, dict):
        raw = _unfenced(text)
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            return OutputReading(None, f"the reply is not JSON ({exc.msg} at char {exc.pos})")
        except ValueError as exc:  # a number too long to convert, say
            return OutputReading(None, f"the reply is not JSON ({exc})")
    if not isinstance(value, dict):
        return OutputReading(None, f"the reply is JSON but not an object ({type(value).__name__})")
    outside = _outside(schema)  # a spec stored by hand: it is never fetched either
    if outside is not None:
        return OutputReading(None, outside)
    try:
        jsonschema.validators.validator_for(schema)(schema).validate(value)
    except jsonschema.ValidationError as exc:
        return OutputReading(None, f"the reply does not match output_schema: {_brief(exc)}")
    return OutputReading(value, None)


def _outside(schema: object, where: str = "") -> str | None:
    """What in ``schema`` points outside it (a reference that is not ``#...``, a
    ``$schema`` jsonschema does not know), said with its place; None when nothing does."""
    if isinstance(schema, dict):
        if where == "" and "$schema" in schema:
            known = jsonschema.validators.validator_for(schema, default=None)
            if known is None:
                return f"$schema {str(schema['$schema'])[:200]!r} is not a draft jsonschema knows"
        for key, item in schema.items():
            if key in _REFERENCES and isinstance(item, str) and not item.startswith("#"):
                return (
                    f"{key} {str(item)[:200]!r} at {where or '(root)'} points outside the "
                    "schema: only references within it (#...) are taken, nothing is fetched"
                )
            found = _outside(item, f"{where}/{key}")
            if found is not None:
                return found
    elif isinstance(schema, list):
        for n, item in enumerate(schema):
            found = _outside(item, f"{where}/{n}")
            if found is not None:
                return found
    return None


def output_text(value: dict[str, Any]) -> str:
    """The JSON text a valid structured answer is stored and shown as."""
    return json.dumps(value, ensure_ascii=False)


def _unfenced(text: str) -> str:
    body = text.strip()
    if body.startswith("```") and body.endswith("```") and len(body) >= 6:
        body = body[3:-3]
        first, _, rest = body.partition("\n")
        body = rest if first.strip().lower() in ("", "json") else body
    return body.strip()


def _brief(exc: jsonschema.ValidationError | jsonschema.SchemaError) -> str:
    where = "/".join(str(p) for p in exc.absolute_path)
    message = f"at {where or '(root)'}: {exc.message}"
    return message if len(message) <= _MESSAGE_MAX else message[: _MESSAGE_MAX - 3] + "..."
