"""Vendor batch execution: the rules, as pure functions. No I/O.

An agent with ``execution="vendor_batch"`` does not call its model from the step: the step
*parks* its request, a collector submits the parked requests of one group — same
provider, model, endpoint and key variable, so one vendor batch on one account — as one
vendor batch when enough have gathered or the oldest has waited long enough, and a poller
checks the batch with backoff until it ends, then stores each step's result (priced at the
batch rate) and hands each run back to its coordinator.
"""

from __future__ import annotations

import hashlib
import re

from orchestration.core.agents import AgentSpec

#: The two ways a step calls its model.
EXECUTIONS = ("sync", "vendor_batch")
#: Providers whose vendor has a batch API.
BATCH_PROVIDERS = ("openai", "anthropic")
#: Requests of one group submitted together at most (both vendors accept far more).
MAX_BATCH_REQUESTS = 1000
#: How long the first parked request of a group waits for others before a submission.
GATHER_S = 2.0
#: Poll backoff: the first check after this many seconds, doubling up to the cap.
POLL_FIRST_S = 1.0
POLL_MAX_S = 60.0

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def group_of(agent: AgentSpec) -> str:
    """The group a request of ``agent`` is batched in: provider, endpoint, key variable
    and model. A digest, so it is safe in a Redis key and carries no URL."""
    raw = "\0".join(
        (agent.provider, agent.base_url or "", agent.api_key_env or "", agent.model_name)
    )
    return hashlib.sha256(raw.encode()).hexdigest()[:24]


def custom_id(run_id: str, step_key: str) -> str:
    """The vendor-side id of one step's request: letters, digits, ``_`` and ``-`` only, at
    most 64 characters (both vendors accept it), and the same for every delivery."""
    readable = _UNSAFE.sub("_", f"{run_id}-{step_key}")
    if len(readable) <= 64:
        return readable
    return hashlib.sha256(f"{run_id}\0{step_key}".encode()).hexdigest()[:64]


def submit_now(
    pending: int,
    oldest_wait_s: float,
    *,
    gather_s: float = GATHER_S,
    max_requests: int = MAX_BATCH_REQUESTS,
) -> bool:
    """Whether a group's parked requests go out now: a full batch, or the oldest has
    waited ``gather_s``."""
    return pending >= max_requests or (pending > 0 and oldest_wait_s >= gather_s)


def poll_delay(polls: int, *, first_s: float = POLL_FIRST_S, max_s: float = POLL_MAX_S) -> float:
    """Seconds before the next check of a vendor batch already checked ``polls`` times."""
    return float(min(max_s, first_s * 2.0 ** max(polls, 0)))
