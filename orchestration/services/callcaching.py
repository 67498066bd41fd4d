"""The step's side of the model-call cache: the key of a call, a lookup before any budget
or rate-limit grant, the result of a hit, and the store of a whole answer."""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any

from orchestration.core.agents import AgentSpec
from orchestration.core.callcache import (
    CacheSpec,
    CallIdentity,
    call_key,
    entry_from,
    entry_json,
    storable,
)
from orchestration.core.completion import Completion, Message
from orchestration.core.runcache import api_version
from orchestration.core.structured import shape_of
from orchestration.state.callcache import STORE_ERRORS, CallStore

log = logging.getLogger(__name__)
#: Where a run's quoting boundary was, in keys and entries.
_PLACEHOLDER = "\x00duet-boundary\x00"


def identity(agent: AgentSpec, structured: bool) -> CallIdentity:
    """What of ``agent`` determines its answers (the key variable by name only)."""
    return CallIdentity(
        provider=agent.provider,
        base_url=agent.base_url,
        model=agent.model_name,
        instructions=agent.instructions,
        settings={
            "temperature": agent.temperature,
            "max_tokens": agent.max_tokens,
            "structured": structured,
            "execution": agent.execution,
            # Effort and tools change the answer (absent when unset: keys as before them).
            **({"effort": agent.effort} if agent.effort is not None else {}),
            **({"tools": [t.model_dump() for t in agent.tool_specs]} if agent.tool_specs else {}),
        },
        schema=shape_of(agent).schema if structured else None,
        api_version=api_version(agent.provider),
        key_env=agent.api_key_env,
    )


class CallCache:
    """Looks calls up and keeps their answers in a :class:`CallStore`."""

    def __init__(self, store: CallStore, observers: tuple[Any, ...] = ()) -> None:
        self.store = store
        self.observers = observers

    def key(
        self,
        spec: CacheSpec | None,
        agent: AgentSpec,
        messages: list[Message],
        structured: bool,
        boundary: str | None = None,
    ) -> str | None:
        """The call's key; None when the loop has no cache or the agent refuses it. The
        run's quoting ``boundary`` (random per run) is keyed as a placeholder, so the
        same critique of another run hits."""
        if spec is None or not agent.cache:
            return None
        if boundary:
            messages = [{**m, "content": _generic(m["content"], boundary)} for m in messages]
        return call_key(identity(agent, structured), messages)

    def find(
        self, spec: CacheSpec, key: str, agent: AgentSpec, boundary: str | None = None
    ) -> Completion | None:
        """The cached answer of ``key`` no older than the spec's TTL (None: a miss), with
        this run's ``boundary`` back where the entry has the placeholder."""
        found = None
        try:
            text = self.store.get(key, spec.ttl_s)
            found = entry_from(text) if text is not None else None
            if found is not None and boundary:
                found = replace(found, text=found.text.replace(_PLACEHOLDER, boundary))
        except STORE_ERRORS as exc:
            log.warning(
                "model-call cache lookup failed (%s): calling the model", type(exc).__name__
            )
        for observer in self.observers:  # those that count lookups (metrics)
            told = getattr(observer, "call_cached", None)
            if told is not None:
                told(agent, found is not None)
        return found

    def keep(
        self, spec: CacheSpec, key: str, completion: Completion, boundary: str | None = None
    ) -> None:
        """Store a whole answer (never a refusal or a cut reply); a failure only logs."""
        if not storable(completion):
            return
        if boundary:
            completion = replace(completion, text=_generic(completion.text, boundary))
        try:
            self.store.put(
                key,
                entry_json(completion),
                max_entries=spec.max_entries,
                max_bytes=spec.max_bytes,
            )
        except STORE_ERRORS as exc:
            log.warning("model-call cache write failed (%s)", type(exc).__name__)


def _generic(text: str, boundary: str) -> str:
    """``text`` with the run's quoting boundary as :data:`_PLACEHOLDER`."""
    return text.replace(boundary, _PLACEHOLDER)


def hit_result(result: dict[str, Any]) -> dict[str, Any]:
    """A step result built from a cached answer as one the call bills nothing for: 0
    tokens, 0 USD, 0 calls, with what the call would have cost kept as ``saved_*``."""
    return {
        **result,
        "cached": True,
        "saved_usd": result["usd"],
        "saved_input_tokens": result["input_tokens"],
        "saved_output_tokens": result["output_tokens"],
        "usd": 0.0,
        "calls": 0,
        "input_tokens": 0,
        "output_tokens": 0,
        "cached_input_tokens": 0,
        "cache_write_tokens": 0,
        "finished_at": time.time(),
    }


__all__ = ["STORE_ERRORS", "CallCache", "api_version", "hit_result", "identity"]
