"""The tool service's side of the tool-result cache: the key of a pure tool's call, a
lookup before the call runs, and the store of a result that ran well. It shares the
model-call cache's store (HMAC-tagged entries, size caps, ``duet cache``) and switch."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from orchestration.core.callcache import CacheSpec
from orchestration.core.toolcache import (
    CachedResult,
    ToolIdentity,
    entry_from,
    entry_json,
    tool_key,
)
from orchestration.core.tools import ToolSpec, Workspace
from orchestration.state.callcache import STORE_ERRORS, CallStore

log = logging.getLogger(__name__)

#: What the worker says of a call: ``(spec, arguments, workspace, tool options)`` -> its
#: identity, or None when it may not be cached (no such pure function here, arguments its
#: schema refuses); ``workers.tools.registry.identify``.
Identify = Callable[
    [ToolSpec, Mapping[str, Any], Workspace | None, Mapping[str, Any]], ToolIdentity | None
]


class ToolResultCache:
    """Looks pure tools' calls up and keeps their results in a :class:`CallStore`."""

    def __init__(
        self, store: CallStore, identify: Identify, observers: tuple[Any, ...] = ()
    ) -> None:
        self.store = store
        self.identify = identify
        self.observers = observers

    def key(
        self,
        spec: CacheSpec | None,
        tool: ToolSpec,
        arguments: Mapping[str, Any],
        workspace: Workspace | None,
        options: Mapping[str, Any],
    ) -> str | None:
        """The call's key; None when the cache is off (for the loop or the agent), the
        tool has effects, or the worker cannot say what the call reads."""
        if spec is None or not tool.pure:
            return None
        try:
            identity = self.identify(tool, arguments, workspace, options)
        except Exception as exc:  # noqa: BLE001 - a tool's reads function failing: no cache
            log.warning("tool %s: no cache key (%s: %s)", tool.name, type(exc).__name__, exc)
            return None
        return tool_key(identity) if identity is not None else None

    def find(self, spec: CacheSpec, key: str, tool: str) -> CachedResult | None:
        """The cached result of ``key`` no older than the spec's TTL (None: a miss)."""
        found = None
        try:
            text = self.store.get(key, spec.ttl_s)
            found = entry_from(text) if text is not None else None
        except STORE_ERRORS as exc:
            log.warning(
                "tool-result cache lookup failed (%s): running the tool", type(exc).__name__
            )
        for observer in self.observers:  # those that count lookups (metrics)
            told = getattr(observer, "tool_cached", None)
            if told is not None:
                told(tool, found is not None)
        return found

    def keep(self, spec: CacheSpec, key: str, result: str, seconds: float) -> None:
        """Store a result (as stored on the turn: scrubbed, capped); a failure only logs."""
        try:
            self.store.put(
                key,
                entry_json(result, seconds),
                max_entries=spec.max_entries,
                max_bytes=spec.max_bytes,
            )
        except STORE_ERRORS as exc:
            log.warning("tool-result cache write failed (%s)", type(exc).__name__)


__all__ = ["Identify", "ToolResultCache"]
