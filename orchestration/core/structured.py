"""Structured critiques: asking the critic for ``{score, issues, summary}`` natively. Pure.

OpenAI models take the shape as a ``response_format`` JSON schema; Anthropic models as a
tool they are forced to call (its input is the critique). The vendor then guarantees the
shape, so no prose has to be searched for JSON. :func:`structured_critique` says whether
an agent asks that way: its own ``structured_output`` when set, else yes for the model
families known to support it, and no for anything else (an OpenAI-compatible server may
not). Replies are still read leniently when the shape is missing (a server that ignores
the request): :func:`read_structured` returns ``None`` and the text parser takes over.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from orchestration.core.agents import AgentSpec
from orchestration.core.critique import Reading, read_object
from orchestration.core.outputs import OUTPUT_DESCRIPTION, OUTPUT_NAME, strict_ok

#: The name of the shape: the OpenAI schema's and the Anthropic tool's.
CRITIQUE_NAME = "critique"
#: What the tool is for, as the Anthropic model reads it.
CRITIQUE_DESCRIPTION = "Record your review of the output: its score, its issues and a summary."
_NULLABLE_STR = {"type": ["string", "null"]}
_NULLABLE_INT = {"type": ["integer", "null"]}
#: One finding with its location (strict mode: every key required, unknown ones null).
FINDING_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "message": {"type": "string"},
        "path": _NULLABLE_STR,
        "line": _NULLABLE_INT,
        "end_line": _NULLABLE_INT,
        "severity": {"type": ["string", "null"], "enum": ["error", "warning", "note", None]},
        "rule": _NULLABLE_STR,
    },
    "required": ["message", "path", "line", "end_line", "severity", "rule"],
    "additionalProperties": False,
}
#: The critique as a JSON schema (OpenAI strict mode: every key required, no others).
CRITIQUE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "score": {
            "type": "number",
            "description": "Quality from 0.0 (unusable) to 1.0 (nothing left to fix).",
        },
        "issues": {
            "type": "array",
            "items": {"anyOf": [{"type": "string"}, FINDING_SCHEMA]},
            "description": "Specific problems to fix, one per entry (a string, or an object "
            "with the file and line); empty when none.",
        },
        "summary": {"type": "string", "description": "One-line overall assessment."},
    },
    "required": ["score", "issues", "summary"],
    "additionalProperties": False,
}

#: Model-name prefixes whose vendor API honours the native shape.
_SUPPORTED = {
    "openai": ("gpt-4o", "gpt-4.1", "gpt-5", "o1", "o3", "o4"),
    "anthropic": ("claude-3", "claude-sonnet", "claude-opus", "claude-haiku"),
}
#: ...except these (older snapshots without JSON-schema output).
_UNSUPPORTED = ("gpt-4o-2024-05-13", "o1-mini", "o1-preview")


def supports_structured(provider: str, model_name: str) -> bool:
    """Whether the model is known to take the critique's shape natively."""
    name = model_name.strip().lower()
    return name.startswith(_SUPPORTED.get(provider, ())) and not name.startswith(_UNSUPPORTED)


def structured_critique(agent: AgentSpec) -> bool:
    """Whether ``agent``, as a critic, is asked for its critique natively."""
    if agent.provider == "sim":
        return False
    if agent.structured_output is not None:
        return agent.structured_output
    return supports_structured(agent.provider, agent.model_name)


def structured_output(agent: AgentSpec) -> bool:
    """Whether ``agent``, as an actor with an ``output_schema``, is asked for it natively
    (not ``sim``, nor when its ``structured_output`` is ``False``: then the reply's text is
    read as JSON and validated all the same)."""
    return (
        agent.output_schema is not None
        and agent.provider != "sim"
        and agent.structured_output is not False
    )


class Shape(NamedTuple):
    """What a structured call asks for: a name, what it is for and its JSON schema."""

    name: str
    description: str
    schema: dict[str, Any]
    #: Whether OpenAI's strict mode may be asked for (the schema meets its rules).
    strict: bool


#: The critique's shape.
CRITIQUE_SHAPE = Shape(CRITIQUE_NAME, CRITIQUE_DESCRIPTION, CRITIQUE_SCHEMA, True)
#: The names of every shape a structured call may ask for (never one of the agent's tools).
SHAPE_NAMES = frozenset({CRITIQUE_NAME, OUTPUT_NAME})


def shape_of(agent: AgentSpec) -> Shape:
    """The shape a structured call of ``agent`` asks for: its ``output_schema``, else the
    critique's."""
    schema = agent.output_schema
    if schema is None:
        return CRITIQUE_SHAPE
    return Shape(OUTPUT_NAME, OUTPUT_DESCRIPTION, schema, strict_ok(schema))


def read_structured(obj: object) -> Reading | None:
    """The critique from a vendor's native object (scores and issues read as the text
    parser reads them); ``None`` when ``obj`` is not a critique, so the text is parsed."""
    if not isinstance(obj, dict) or not any(
        isinstance(k, str) and k.lower() == "score" for k in obj
    ):
        return None
    return read_object(obj)
