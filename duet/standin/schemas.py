"""The vendors' request shapes, from the installed SDKs' own types, checked strictly.

The stand-in server refuses a body the real API would refuse: each route's body is held to
the SDK's request ``TypedDict`` (``openai.types.chat.completion_create_params``,
``anthropic.types.message_create_params``, the batch types), with unknown keys forbidden at
every level and lists read whole (the SDKs type them ``Iterable``, which pydantic would
otherwise check lazily, never). What OpenAI refuses of its reasoning models by name (a
non-default temperature, ``max_tokens``) is refused too, in its words. The SDKs are
imported on first use; validators are cached.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from typing import Any, Literal, get_args

from pydantic import TypeAdapter, ValidationError
from pydantic_core import ErrorDetails, SchemaValidator
from typing_extensions import Required, TypedDict

Kind = Literal[
    "openai.chat", "openai.batch", "openai.batch_line", "anthropic.messages", "anthropic.batch"
]
#: How a union's branches are labelled in an error's location (no request key starts so).
_BRANCH = "|"
#: At most this many problems are named in one refusal.
_SHOWN = 3


def refusal(kind: Kind, body: Any) -> tuple[str, str | None] | None:
    """Why the vendor would refuse ``body`` as a ``kind`` request: ``(message, param)``,
    the key path of the first problem as ``param``; ``None`` when the body is valid."""
    try:
        _validator(kind).validate_json(json.dumps(body), strict=True)
    except ValidationError as exc:
        errors = sorted(_relevant(exc), key=lambda e: e["type"] != "extra_forbidden")
        found = list(dict.fromkeys(f"{_path(e['loc']) or '(body)'}: {e['msg']}" for e in errors))
        lines = found[:_SHOWN] + (
            [f"and {len(found) - _SHOWN} more"] if len(found) > _SHOWN else []
        )
        return "; ".join(lines), _path(errors[0]["loc"]) or None
    if kind == "openai.chat":
        return _reasoning_refusal(body)
    if kind == "openai.batch_line":
        inner = _reasoning_refusal(body["body"])
        return None if inner is None else (inner[0], f"body.{inner[1]}")
    return None


#: OpenAI's reasoning models, as its API tells them apart (by name).
_REASONING = ("o1", "o3", "o4", "gpt-5")


def _reasoning_refusal(body: dict[str, Any]) -> tuple[str, str] | None:
    """What OpenAI's API refuses of a reasoning model beyond the request type, in its words:
    a temperature other than the default, and ``max_tokens``."""
    if not str(body["model"]).lower().startswith(_REASONING):
        return None
    if body.get("temperature") not in (None, 1):
        return (
            f"Unsupported value: 'temperature' does not support {body['temperature']} with "
            "this model. Only the default (1) value is supported.",
            "temperature",
        )
    if body.get("max_tokens") is not None:
        return (
            "Unsupported parameter: 'max_tokens' is not supported with this model. Use "
            "'max_completion_tokens' instead.",
            "max_tokens",
        )
    return None


def _relevant(exc: ValidationError) -> list[ErrorDetails]:
    """The errors of ``exc`` without those of union branches whose ``type`` or ``role`` is
    another (a message is a user message; what a system message would need is noise)."""
    errors = exc.errors(include_url=False)
    other = {
        e["loc"][:-1]
        for e in errors
        if e["type"] == "literal_error"
        and len(e["loc"]) > 1
        and e["loc"][-1] in ("type", "role")
        and _is_branch(e["loc"][-2])
    }
    kept = [e for e in errors if not any(e["loc"][: len(b)] == b for b in other)]
    return kept or errors


def _is_branch(part: int | str) -> bool:
    """Whether a location part names a union's branch, not a key."""
    return isinstance(part, str) and part.startswith(_BRANCH)


def _path(loc: tuple[int | str, ...]) -> str:
    """``body.messages.0.x``: the keys and indexes, without the union branches' type names."""
    return ".".join(str(p) for p in loc if not _is_branch(p))


def warm() -> None:
    """Build every validator now (1–3 s of CPU, once per process), so a server's first
    requests are not the ones that wait for it."""
    for kind in get_args(Kind):
        _validator(kind)


@cache
def _validator(kind: Kind) -> SchemaValidator:
    return SchemaValidator(_strict(copy.deepcopy(TypeAdapter(_type(kind)).core_schema)))


def _type(kind: Kind) -> Any:
    """The SDK's own request type for ``kind``."""
    if kind == "openai.chat":
        from openai.types.chat.completion_create_params import CompletionCreateParamsNonStreaming

        return CompletionCreateParamsNonStreaming
    if kind == "openai.batch":
        from openai.types.batch_create_params import BatchCreateParams

        return BatchCreateParams
    if kind == "openai.batch_line":
        return _openai_batch_line()
    if kind == "anthropic.messages":
        from anthropic.types.message_create_params import MessageCreateParamsNonStreaming

        return MessageCreateParamsNonStreaming
    from anthropic.types.messages.batch_create_params import BatchCreateParams as Anthropic

    return Anthropic


@cache
def _openai_batch_line() -> Any:
    """One line of a batch input file, as OpenAI's batch guide writes it (the SDK has no
    type for it): the body is the SDK's chat request, for the one endpoint served here."""
    from openai.types.chat.completion_create_params import CompletionCreateParamsNonStreaming

    fields = {
        "custom_id": Required[str],
        "method": Required[Literal["POST"]],
        "url": Required[Literal["/v1/chat/completions"]],
        "body": Required[CompletionCreateParamsNonStreaming],
    }
    return TypedDict("BatchRequestLine", fields)  # type: ignore[operator]


def _strict(node: Any) -> Any:
    """``node`` (a pydantic core schema) with unknown keys forbidden in every typed dict and
    model, every lazily checked iterable made a list, checked when read, and every union's
    branches labelled."""
    if isinstance(node, list | tuple):
        return type(node)(_strict(item) for item in node)
    if not isinstance(node, dict):
        return node
    kind = node.get("type")
    if kind in ("typed-dict", "model-fields"):
        node = {**node, "extra_behavior": "forbid"}
    elif kind == "model":
        node = {**node, "config": {**node.get("config", {}), "extra_fields_behavior": "forbid"}}
    elif kind == "generator":
        node = {**node, "type": "list"}
    elif kind == "union":  # each branch labelled, so a location tells branches from keys
        choices = [c[0] if isinstance(c, tuple | list) else c for c in node["choices"]]
        node = {**node, "choices": [(c, f"{_BRANCH}{n}") for n, c in enumerate(choices)]}
    return {key: _strict(value) for key, value in node.items()}


def upload_refusal(fields: dict[str, str]) -> str | None:
    """Why OpenAI would refuse a ``/v1/files`` upload with these form fields (name -> text,
    the file's own as its name), or ``None``: the SDK's ``FileCreateParams`` keys only, and a
    ``purpose`` its ``FilePurpose`` names."""
    from typing import get_args

    from openai.types.file_create_params import FileCreateParams
    from openai.types.file_purpose import FilePurpose

    unknown = sorted(set(fields) - set(FileCreateParams.__annotations__))
    if unknown:
        return f"{unknown[0]}: Extra inputs are not permitted"
    # The annotations are strings there (postponed evaluation): read ``Required[`` off them.
    hints = {
        k: getattr(v, "__forward_arg__", str(v))
        for k, v in FileCreateParams.__annotations__.items()
    }
    missing = [k for k, v in sorted(hints.items()) if v.startswith("Required[") and k not in fields]
    if missing:
        return f"{missing[0]}: Field required"
    purposes = get_args(FilePurpose)
    if fields["purpose"] not in purposes:
        return f"purpose: must be one of {', '.join(purposes)}, got {fields['purpose']!r}"
    return None
