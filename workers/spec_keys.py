"""The key variables the stored specs name: secret in a worker from its first task.

A spec names the variable holding its key (``api_key_env``), and those holding the
credentials of its ``base_url`` (``https://USER:${VARIABLE}@host``); a worker registers
every variable of a spec, both roles', before its first step of it (:func:`register`). At start it also
registers every variable any spec stored in Redis names, so their values are scrubbed from everything it
lets out from its first task on, whichever spec that task runs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from orchestration.core import url_credentials
from orchestration.core.architecture import LoopSpec
from orchestration.state import keys
from workers import secrets

#: Specs read per round trip.
BATCH = 200


def named_variables(spec_json: str) -> set[str]:
    """Every ``api_key_env``, and every variable a ``base_url`` names, of a stored spec's
    JSON, wherever it sits (pure)."""
    try:
        return set(_named(json.loads(spec_json)))
    except ValueError:
        return set()


def _named(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for name, value in node.items():
            if name == "api_key_env" and isinstance(value, str) and value:
                yield value
            elif name == "base_url" and isinstance(value, str):
                yield from url_credentials.variables(value)
            else:
                yield from _named(value)
    elif isinstance(node, list):
        for item in node:
            yield from _named(item)


def register(spec: LoopSpec) -> None:
    """Register the variables ``spec`` names (both roles'), before a step of it calls a
    model: a vendor error of the actor's call may echo the critic's key."""
    for name in _named(spec.model_dump(mode="json")):
        secrets.register_key_variable(name)


def register_stored(client: Any) -> int:
    """Register the variables every stored spec names (:func:`named_variables`); how many
    specs were read. Redis errors are the caller's."""
    read = 0
    batch: list[str] = []
    for key in client.scan_iter(match=keys.spec("*"), count=BATCH):
        batch.append(key)
        if len(batch) >= BATCH:
            read += _register(client, batch)
            batch = []
    if batch:
        read += _register(client, batch)
    return read


def _register(client: Any, batch: list[str]) -> int:
    for raw in client.mget(batch):
        if raw:
            for name in named_variables(raw if isinstance(raw, str) else raw.decode()):
                secrets.register_key_variable(name)
    return len(batch)
