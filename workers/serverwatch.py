"""Each worker watches its Redis's settings, not only at start: a server whose
``maxmemory-policy`` became an evicting one (a parameter-group change, a failover to a
node with the service's default) stops new work until it keeps every key again.

The sweep thread (:mod:`workers.sweep`) calls :func:`check` every :data:`WATCH_S` and as
soon as the server is a new one (a restart, a failover). A refusal is one ERROR line, the
``duet_redis_refused`` gauge at 1, and every step that arrives meanwhile waits
(:func:`refused`) instead of calling a model whose answer Redis might drop. Changes of
``maxmemory``, replicas connected, the append-only file and keys evicted are logged once.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from orchestration.state.connection import hide_password
from orchestration.state.preflight import ServerFacts, read_facts, verdict
from workers import metrics

log = logging.getLogger(__name__)

#: Seconds between two reads of the server's settings.
WATCH_S = 10.0
#: Seconds a step that arrives while new work is stopped waits before it looks again.
WAIT_S = 10.0

_lock = threading.Lock()
_refusal: str | None = None
_facts: ServerFacts | None = None


def refused() -> str | None:
    """Why this worker takes no new work now (None: it does)."""
    return _refusal


def check(client: Any, url: str, variable: str = "DUET_REDIS_URL") -> str | None:
    """Read the settings of the server behind ``client`` and act on what changed; the
    refusal now (None: none)."""
    global _refusal, _facts
    facts = read_facts(client)
    refusal, _ = verdict(facts, f"the Redis at {variable}={hide_password(url)}")
    with _lock:
        previous, _facts = _facts, facts
        changed, _refusal = refusal != _refusal, refusal
    if changed and refusal is not None:
        log.error("new work stopped: %s", refusal)
    elif changed:
        log.warning("new work goes on: the Redis at %s keeps every key again", variable)
    if metrics.ENABLED:
        metrics.REDIS_REFUSED.set(1 if refusal else 0)
    if previous is not None:
        _log_changes(previous, facts, variable)
    return refusal


def _log_changes(before: ServerFacts, now: ServerFacts, variable: str) -> None:
    """One line for what changed in the server's settings since the last read."""
    changes = [
        f"{name} {old} -> {new}"
        for name, old, new in (
            ("maxmemory", before.maxmemory, now.maxmemory),
            ("replicas connected", before.replicas, now.replicas),
            ("appendonly", before.aof_enabled, now.aof_enabled),
        )
        if old != new and new is not None
    ]
    if changes:
        log.warning("the Redis at %s changed: %s", variable, "; ".join(changes))
    evicted = (now.evicted_keys or 0) - (before.evicted_keys or 0)
    if evicted > 0:
        log.error(
            "the Redis at %s evicted %d key(s) in the last %.0fs: runs or budget limits "
            "may be lost",
            variable,
            evicted,
            WATCH_S,
        )


def reset() -> None:
    """Forget what was read (tests)."""
    global _refusal, _facts
    with _lock:
        _refusal, _facts = None, None
