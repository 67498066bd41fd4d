"""The fleet's rate-limit table: requests and tokens per window for each (provider, model).

Set from the config file, the CLI or Python; workers read it from Redis (and cache it for
a few seconds), so one ``duet`` command changes the limits of every worker.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from orchestration.core.agents import resolve_model
from orchestration.state import keys


class RateLimit(BaseModel):
    """Limits for one model, shared by every worker of the fleet."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: Requests per window; None = no request limit.
    rpm: int | None = Field(default=None, ge=1)
    #: Tokens (input + output) per window; None = no token limit.
    tpm: int | None = Field(default=None, ge=1)
    #: Window length in seconds (60 = per minute).
    window_s: float = Field(default=60.0, gt=0)


def rate_key(model: str) -> str:
    """``provider:model_name`` for a model string, as workers look limits up."""
    provider, name = resolve_model(model)
    return f"{provider}:{name}"


def set_rate_limits(redis_client: Any, limits: dict[str, RateLimit]) -> None:
    """Store limits for models (``{"gpt-4o": RateLimit(rpm=500)}``), replacing theirs."""
    if limits:
        redis_client.hset(
            keys.rate_limits(),
            mapping={rate_key(m): limit.model_dump_json() for m, limit in limits.items()},
        )


def clear_rate_limits(redis_client: Any) -> None:
    redis_client.delete(keys.rate_limits())


def load_rate_limits(redis_client: Any) -> dict[str, tuple[int | None, int | None, float]]:
    """``provider:model -> (rpm, tpm, window_s)`` as workers use it."""
    table = {}
    for key, raw in redis_client.hgetall(keys.rate_limits()).items():
        key = key.decode() if isinstance(key, bytes) else key
        value = json.loads(raw)
        table[key] = (value.get("rpm"), value.get("tpm"), float(value.get("window_s", 60.0)))
    return table


def window_use(
    redis_client: Any, provider: str, model: str, window_s: float
) -> tuple[int, int, float]:
    """What the fleet used of a model's rate window right now: ``(requests, tokens,
    seconds of fleet-wide pause left)``. Read-only: for showing that work waits on it."""
    pipe = redis_client.pipeline(transaction=False)
    pipe.time()
    pipe.zrangebyscore(keys.rate_limit(provider, model), "-inf", "+inf", withscores=True)
    pipe.pttl(keys.rate_pause(provider, model))
    (secs, micros), grants, pause_ms = pipe.execute()
    horizon = int(secs) * 1_000_000 + int(micros) - window_s * 1_000_000
    live = [member for member, at in grants if at > horizon]
    tokens = sum(int(str(m).rsplit(":", 1)[-1]) for m in live)
    return len(live), tokens, max(int(pause_ms), 0) / 1000
