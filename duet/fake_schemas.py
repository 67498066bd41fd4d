"""The vendors' request shapes, from the installed SDKs' own types, checked strictly.

The stand-in server refuses a body the real API would refuse: each route's body is held to
the SDK's request ``TypedDict`` (``openai.types.chat.completion_create_params``,
``anthropic.types.message_create_params``, the batch types), with unknown keys forbidden at
every level and lists read whole (the SDKs type them ``Iterable``, which pydantic would
otherwise check lazily, never). The SDKs are imported on first use; validators are cached.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from typing import Any, Literal

from pydantic import TypeAdapter, ValidationError
from pydantic_core import SchemaValidator
from typing_extensions import Required, TypedDict

Kind = Literal["openai.chat", "openai.batch", "openai.batch_line", "anthropic.messages",
               "anthropic.batch"]  # fmt: skip
#: At most this many problems are named in one refusal.
_SHOWN = 3


def refusal(kind: Kind, body: Any) -> tuple[str, str | None] | None:
    """Why the vendor would refuse ``body`` as a ``kind`` request: ``(message, param)``,
    the key path of the first problem as ``param``; ``None`` when the body is valid."""
    try:
        _validator(kind).validate_json(json.dumps(body), strict=True)
    except ValidationError as exc:
        # An unknown key first: in a union, each branch's own complaints are noise.
        errors = sorted(exc.errors(include_url=False), key=lambda e: e["type"] != "extra_forbidden")
        found = list(dict.fromkeys(f"{_path(e['loc']) or '(body)'}: {e['msg']}" for e in errors))
        lines = found[:_SHOWN] + (
            [f"and {len(found) - _SHOWN} more"] if len(found) > _SHOWN else []
        )
        return "; ".join(lines), _path(errors[0]["loc"]) or None
    return None


def _path(loc: tuple[int | str, ...]) -> str:
    """``body.messages.0.x``: the keys and indexes, without the union branches' type names."""
    return ".".join(str(p) for p in loc if not (isinstance(p, str) and p[:1].isupper()))


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
    model, and every lazily checked iterable made a list, checked when read."""
    if isinstance(node, list):
        return [_strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    kind = node.get("type")
    if kind in ("typed-dict", "model-fields"):
        node = {**node, "extra_behavior": "forbid"}
    elif kind == "model":
        node = {**node, "config": {**node.get("config", {}), "extra_fields_behavior": "forbid"}}
    elif kind == "generator":
        node = {**node, "type": "list"}
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
