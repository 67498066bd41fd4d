"""The Lua scripts of the state layer: read from ``lua/*.lua`` and registered in one place.

A script may begin with ``--! include NAME`` lines; those files are put before its body
(the budget scripts share ``budget_common.lua``). A script may also name a Python fact as
``{{NAME}}`` (see :data:`CONSTANTS`), so such a fact is written once, in Python.

:func:`run_scripts` runs several registered scripts in one round trip.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from redis.commands.core import Script

from orchestration.core.results import FINISHED_STATUSES

LUA_DIR = Path(__file__).with_name("lua")

_INCLUDE = re.compile(r"^--! include (\w+)\n", re.M)
_CONSTANT = re.compile(r"\{\{(\w+)\}\}")


def _lua_set(values: tuple[str, ...] | frozenset[str]) -> str:
    return "{" + ", ".join(f"['{v}'] = true" for v in sorted(values)) + "}"


#: Python facts the scripts name as ``{{NAME}}``.
CONSTANTS = {"FINISHED_STATUSES": _lua_set(FINISHED_STATUSES)}


@functools.cache
def source(name: str) -> str:
    """The full text of script ``name`` (``lua/<name>.lua``), includes and constants filled."""
    body = (LUA_DIR / f"{name}.lua").read_text(encoding="utf-8")
    includes = _INCLUDE.findall(body)
    body = _INCLUDE.sub("", body)
    text = "".join(source(inc) for inc in includes) + body

    def constant(match: re.Match[str]) -> str:
        try:
            return CONSTANTS[match.group(1)]
        except KeyError:
            raise LookupError(f"lua/{name}.lua names unknown constant {match.group(0)}") from None

    return _CONSTANT.sub(constant, text)


def register(client: Any, name: str) -> Script:
    """Script ``name`` registered on ``client`` (sent by SHA, loaded on first use)."""
    script: Script = client.register_script(source(name))
    return script


@dataclass(frozen=True, slots=True)
class ScriptCall:
    """One call of a registered script, to run with others in one round trip."""

    script: Script
    keys: list[Any]
    args: list[Any]


def run_scripts(client: Any, calls: list[ScriptCall]) -> list[Any]:
    """Run ``calls`` in order in one round trip (a non-transaction pipeline of EVALSHA).

    Each script is sent by its SHA; one the server does not know (restarted, flushed) is
    run again on its own through its ``Script``, which loads it. A pipeline is never
    handed the ``Script`` objects themselves: redis-py would add a SCRIPT EXISTS round
    trip per execution.
    """
    if len(calls) == 1:
        only = calls[0]
        return [only.script(keys=only.keys, args=only.args)]
    pipe = client.pipeline(transaction=False)
    for call in calls:
        pipe.evalsha(call.script.sha, len(call.keys), *call.keys, *call.args)
    results: list[Any] = pipe.execute(raise_on_error=False)
    for i, res in enumerate(results):
        if isinstance(res, redis.exceptions.NoScriptError):
            call = calls[i]
            results[i] = call.script(keys=call.keys, args=call.args)
        elif isinstance(res, Exception):
            raise res
    return results
