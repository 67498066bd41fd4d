"""Fleet-wide rate limits: the table of limits per (provider, model) and the limiter.

The table is set from the config file, the CLI or Python; workers read it from Redis
(and cache it for a few seconds), so one ``duet`` command changes the limits of every
worker. :class:`RateLimiter` grants requests against it atomically
(``lua/rate_acquire.lua``): a sliding log per (provider, model), one sorted-set member
``<seq>:<tokens>`` per granted request scored by its server time in microseconds, plus a
running token sum. A request goes when, counting it, the last window holds at most rpm
requests and tpm tokens; otherwise the reply is how long until enough old grants leave
the window. Unlike GCRA with a full burst, no window ever holds more than rpm. A vendor's
429 with Retry-After pauses the model for the whole fleet (``lua/rate_pause.lua``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from orchestration.core.agents import resolve_model
from orchestration.core.errors import ConfigError
from orchestration.state import keys, scripts


class RateLimit(BaseModel):
    """Limits for one model, shared by every worker of the fleet."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: Requests per window; None = no request limit.
    rpm: int | None = Field(default=None, ge=1)
    #: Tokens (input + output) per window; None = no token limit.
    tpm: int | None = Field(default=None, ge=1)
    #: Window length in seconds (60 = per minute).
    window_s: float = Field(default=60.0, gt=0)
    #: Who set it (a config file's name, ``duet limits set``): shown by ``duet limits show``
    #: and ``duet watch``, since a limit outlives the batch that set it.
    source: str | None = None


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


def clear_rate_limits(redis_client: Any, models: list[str] | None = None) -> int:
    """Remove the limits of ``models`` (model strings, or ``provider:model`` as stored),
    or every limit when None; how many were removed."""
    stored = {
        k.decode() if isinstance(k, bytes) else k for k in redis_client.hkeys(keys.rate_limits())
    }
    fields = stored if models is None else {m if m in stored else rate_key(m) for m in models}
    return int(redis_client.hdel(keys.rate_limits(), *fields)) if fields else 0


def stored_rate_limits(redis_client: Any) -> dict[str, RateLimit]:
    """``provider:model -> RateLimit`` as stored: what ``duet limits show`` prints."""
    return {
        (k.decode() if isinstance(k, bytes) else k): RateLimit.model_validate_json(raw)
        for k, raw in redis_client.hgetall(keys.rate_limits()).items()
    }


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


@dataclass(frozen=True)
class RateDecision:
    """Answer of :meth:`RateLimiter.try_acquire`.

    Attributes:
        wait_s: 0.0 when the request was granted (and counted); else seconds to wait
            before asking again (nothing was counted).
        server_time_us: the Redis server time of the decision, in microseconds.
    """

    wait_s: float
    server_time_us: int

    @property
    def granted(self) -> bool:
        return self.wait_s == 0.0


def _check_rate(name: str, value: int | None) -> int:
    if value is None:
        return -1
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a positive integer or None, got {value!r}")
    return value


class RateLimiter:
    """Requests and tokens per window per (provider, model), shared by every worker.

    Every caller for one (provider, model) must use the same ``rpm``, ``tpm`` and
    ``window_s``.

    Args:
        redis_client: a ``redis.Redis``.
    """

    def __init__(self, redis_client: Any) -> None:
        self.redis = redis_client
        self._acquire = scripts.register(redis_client, "rate_acquire")
        self._pause = scripts.register(redis_client, "rate_pause")

    def try_acquire(
        self,
        provider: str,
        model: str,
        *,
        rpm: int | None,
        tpm: int | None,
        tokens: int,
        window_s: float = 60.0,
    ) -> RateDecision:
        """Count one request of ``tokens`` if it may go now, else say how long to wait.

        A fleet-wide pause (:meth:`pause`) answers with its remaining time.

        Raises:
            ConfigError: a limit that is not a positive integer, negative ``tokens``, or
                ``tokens`` above ``tpm`` (such a request could never go).
        """
        rpm_arg, tpm_arg = _check_rate("rpm", rpm), _check_rate("tpm", tpm)
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            raise ConfigError(f"tokens must be an integer >= 0, got {tokens!r}")
        if tpm is not None and tokens > tpm:
            raise ConfigError(f"a request of {tokens} tokens can never fit tpm={tpm}")
        if window_s <= 0:
            raise ConfigError(f"window_s must be > 0, got {window_s!r}")
        wait_us, now_us = self._acquire(
            keys=[
                keys.rate_limit(provider, model),
                keys.rate_tokens(provider, model),
                keys.rate_pause(provider, model),
            ],
            args=[rpm_arg, tpm_arg, tokens, max(1, round(window_s * 1_000_000))],
        )
        return RateDecision(wait_s=int(wait_us) / 1_000_000, server_time_us=int(now_us))

    def acquire(
        self,
        provider: str,
        model: str,
        *,
        rpm: int | None,
        tpm: int | None,
        tokens: int,
        window_s: float = 60.0,
    ) -> float:
        """0.0 when the request may go now (it is counted), else seconds to wait (not counted)."""
        return self.try_acquire(
            provider, model, rpm=rpm, tpm=tpm, tokens=tokens, window_s=window_s
        ).wait_s

    def pause(self, provider: str, model: str, seconds: float) -> float:
        """Pause the (provider, model) for the whole fleet, e.g. after a 429 with Retry-After.

        A longer pause already in place is kept. Returns the pause now in force, in seconds.
        """
        if seconds <= 0:
            return self.paused_for(provider, model)
        ms = self._pause(
            keys=[keys.rate_pause(provider, model)], args=[max(1, math.ceil(seconds * 1000))]
        )
        return int(ms) / 1000

    def paused_for(self, provider: str, model: str) -> float:
        """Seconds left of a fleet-wide pause of the (provider, model); 0.0 when none."""
        ms = int(self.redis.pttl(keys.rate_pause(provider, model)))
        return ms / 1000 if ms > 0 else 0.0
