"""The key policies live workers hold, published beside their liveness for clients to check.

Each worker publishes its allowlist of key variables and hosts (JSON, one key per distinct
policy, renewed with its liveness key, gone a TTL after the last worker holding it stops),
so a client can refuse at submit a spec no live worker would send, naming the variable.
"""

from __future__ import annotations

import hashlib
from typing import Any

from orchestration.state import keys


def publish(client: Any, policy_json: str, ttl_s: int) -> None:
    """Say that a live worker holds ``policy_json`` for the next ``ttl_s`` seconds."""
    digest = hashlib.sha256(policy_json.encode()).hexdigest()[:16]
    pipe = client.pipeline(transaction=False)
    pipe.set(keys.key_policy(digest), policy_json, ex=max(1, int(ttl_s)))
    pipe.sadd(keys.key_policies(), digest)
    pipe.execute()


def published(client: Any) -> list[str]:
    """The policies live workers hold (JSON each; none when no worker published one)."""
    digests = [_s(d) for d in client.smembers(keys.key_policies())]
    if not digests:
        return []
    found = client.mget([keys.key_policy(d) for d in digests])
    gone = [d for d, text in zip(digests, found, strict=True) if text is None]
    if gone:
        client.srem(keys.key_policies(), *gone)
    return [_s(text) for text in found if text is not None]


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


__all__ = ["publish", "published"]
