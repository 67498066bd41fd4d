"""Whether a broker message's text is one a worker can take: JSON with Celery's envelope.

A queue is a Redis list anyone with access can push to. kombu decodes each popped text
and reads its envelope (``properties.delivery_tag`` and ``delivery_info``, a base64
``body``) where an error ends the worker or strands the other messages of the pop, so
the broker checks each text here first and dead-letters the ones that fail
(``orchestration.state.deadletters``). Pure: no Redis.
"""

from __future__ import annotations

import binascii
import json
from base64 import b64decode
from collections.abc import Callable
from typing import Any


def examine(
    text: str, loads: Callable[[str], Any] = json.loads
) -> tuple[dict[str, Any] | None, str | None]:
    """The message decoded (by ``loads``: kombu's, in the broker) and None, or None and
    why no worker can take it (one line)."""
    try:
        payload = loads(text)
    except (ValueError, TypeError) as exc:  # JSONDecodeError is a ValueError
        return None, f"not JSON: {exc}"
    problem = envelope_problem(payload)
    return (None, problem) if problem else (payload, None)


def envelope_problem(payload: Any) -> str | None:
    """What is missing from a decoded message that kombu needs to deliver it, or None."""
    if not isinstance(payload, dict):
        return f"not a JSON object but a {type(payload).__name__}: no Celery envelope"
    properties = payload.get("properties")
    if not isinstance(properties, dict):
        return "no 'properties' object: not a Celery/kombu message"
    if not isinstance(properties.get("delivery_tag"), str):
        return "no 'properties.delivery_tag' string: not a Celery/kombu message"
    info = properties.get("delivery_info")
    if not isinstance(info, dict) or not isinstance(info.get("routing_key"), str):
        return "no 'properties.delivery_info.routing_key': not a Celery/kombu message"
    body, encoding = payload.get("body"), properties.get("body_encoding")
    if body and not isinstance(body, str):
        return f"'body' is a {type(body).__name__}, not a string"
    if encoding not in (None, "base64"):
        return f"unknown 'properties.body_encoding' {str(encoding)[:40]!r}"
    if body and encoding == "base64":
        try:
            b64decode(body.encode("utf-8"))
        except (binascii.Error, ValueError) as exc:
            return f"'body' is not base64: {exc}"
    return None


__all__ = ["envelope_problem", "examine"]
