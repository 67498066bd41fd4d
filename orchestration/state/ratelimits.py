"""Fleet-wide rate limits: the table of configured limits and the limiter.

The table is set from the config file, the CLI or Python, per ``provider:model`` on the
vendor's own endpoint or ``provider:model@URL`` on another
(:func:`orchestration.core.ratelimit.limit_name`); workers read it from Redis (and cache
it for a few seconds), so one ``duet`` command changes the limits of every worker.

:class:`RateLimiter` paces requests and tokens per limit as smooth rates (GCRA, see
:mod:`orchestration.core.ratelimit`) atomically in Redis (``lua/rate_acquire.lua``): a
request books the earliest slot both rates allow and holds a *permit* until its call is
settled with its real token usage or given back (a 429, a call never sent:
``lua/rate_settle.lua``). What the vendor's rate-limit headers say is kept with the
limit's state and paces below a configured limit that is higher. A vendor's 429 with a
long Retry-After pauses the limit; on a model with no limit at all, the whole fleet's
calls to it (``lua/rate_pause.lua``).
"""

from __future__ import annotations

import json
import math
import uuid
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from orchestration.core.agents import resolve_model
from orchestration.core.errors import ConfigError
from orchestration.core.ratelimit import BURST_S, HORIZON_S, PROBE_RPM, VendorLimits, limit_name
from orchestration.state import keys, scripts
from orchestration.state.scripts import ScriptCall


class RateLimit(BaseModel):
    """Limits for one model on one endpoint, shared by every worker of the fleet."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: Requests per window; None = no request limit.
    rpm: int | None = Field(default=None, ge=1)
    #: Tokens (input + output) per window; None = no token limit.
    tpm: int | None = Field(default=None, ge=1)
    #: Window length in seconds (60 = per minute): the rate is rpm / window_s, paced
    #: smoothly whatever the window.
    window_s: float = Field(default=60.0, gt=0)
    #: Who set it (a config file's name, ``duet limits set``): shown by ``duet limits show``
    #: and ``duet watch``, since a limit outlives the batch that set it.
    source: str | None = None


def rate_key(model: str, base_url: str | None = None) -> str:
    """The name a model's limit is kept under on ``base_url`` (None: the vendor's own)."""
    provider, name = resolve_model(model)
    return limit_name(provider, name, base_url)


def _field(key: Any) -> str:
    return key.decode() if isinstance(key, bytes) else str(key)


def set_rate_limits(
    redis_client: Any, limits: dict[str, RateLimit], base_url: str | None = None
) -> None:
    """Store limits for models (``{"gpt-4o": RateLimit(rpm=500)}``) on ``base_url`` (None:
    the vendor's own endpoint), replacing theirs."""
    if limits:
        redis_client.hset(
            keys.rate_limits(),
            mapping={rate_key(m, base_url): lim.model_dump_json() for m, lim in limits.items()},
        )


def clear_rate_limits(redis_client: Any, models: list[str] | None = None) -> int:
    """Remove the limits of ``models`` (names as stored, or model strings: that model's
    limit on every endpoint), or every limit when None; how many were removed."""
    stored = {_field(k) for k in redis_client.hkeys(keys.rate_limits())}
    fields = stored
    if models is not None:
        fields = set()
        for model in models:
            if model in stored:
                fields.add(model)
                continue
            name = rate_key(model)
            fields.update(f for f in stored if f == name or f.startswith(f"{name}@"))
    return int(redis_client.hdel(keys.rate_limits(), *fields)) if fields else 0


def stored_rate_limits(redis_client: Any) -> dict[str, RateLimit]:
    """``name -> RateLimit`` as stored: what ``duet limits show`` prints."""
    return {
        _field(k): RateLimit.model_validate_json(raw)
        for k, raw in redis_client.hgetall(keys.rate_limits()).items()
    }


def load_rate_limits(redis_client: Any) -> dict[str, tuple[int | None, int | None, float]]:
    """``name -> (rpm, tpm, window_s)`` as workers use it."""
    table = {}
    for key, raw in redis_client.hgetall(keys.rate_limits()).items():
        value = json.loads(raw)
        table[_field(key)] = (
            value.get("rpm"),
            value.get("tpm"),
            float(value.get("window_s", 60.0)),
        )
    return table


def limit_names(redis_client: Any) -> list[str]:
    """Every limit the fleet configured or learned from a vendor, sorted."""
    names = {_field(k) for k in redis_client.hkeys(keys.rate_limits())}
    head = keys.rate_limit("")
    for key in redis_client.scan_iter(match=keys.rate_limit("*"), count=1000):
        name = _field(key)[len(head) :]
        if not name.endswith(":permits"):
            names.add(name)
    return sorted(names)


@dataclass(frozen=True, slots=True)
class LimitState:
    """What the fleet knows of one limit right now (read-only, for ``duet limits show``)."""

    #: What the vendor's headers said (requests, tokens a minute); None: not said.
    learned_rpm: int | None
    learned_tpm: int | None
    #: When the vendor last answered with them (Unix seconds); None: never.
    learned_at: float | None
    #: Permits held by calls not yet settled.
    permits: int
    #: Seconds until the next request could go (0.0: now).
    next_slot_s: float
    #: Seconds left of a pause (the limit's own, or the fleet's for the model).
    paused_s: float


def limit_state(redis_client: Any, name: str) -> LimitState:
    """:class:`LimitState` of limit ``name`` (an unknown one reads as all empty)."""
    pipe = redis_client.pipeline(transaction=False)
    pipe.time()
    pipe.hmget(keys.rate_limit(name), "rpm", "tpm", "learned_at", "tat_r", "tat_t", "until")
    pipe.zcard(keys.rate_permits(name))
    pipe.pttl(keys.rate_pause(name))
    (secs, micros), fields, permits, pause_ms = pipe.execute()
    now = int(secs) * 1_000_000 + int(micros)
    rpm, tpm, learned_at, tat_r, tat_t, until = (None if v is None else float(v) for v in fields)
    ahead = max([0.0, *((v - now) / 1e6 for v in (tat_r, tat_t) if v is not None)])
    paused = max(max(int(pause_ms), 0) / 1000, ((until or 0) - now) / 1e6, 0.0)
    return LimitState(
        None if rpm is None else int(rpm),
        None if tpm is None else int(tpm),
        None if learned_at is None else learned_at / 1e6,
        int(permits),
        max(0.0, ahead - BURST_S),
        paused,
    )


@dataclass(frozen=True, slots=True)
class RateDecision:
    """Answer of :meth:`RateLimiter.try_acquire`.

    Attributes:
        wait_s: with a permit, the seconds until its booked slot (0.0: go now); without
            one, the seconds to wait before asking again.
        server_time_us: the Redis server time of the decision, in microseconds.
        permit: the permit held ('' for none: no limit applies, or no slot yet).
        rpm, tpm: the limits applied (None: none).
    """

    wait_s: float
    server_time_us: int
    permit: str = ""
    rpm: int | None = None
    tpm: int | None = None

    @property
    def granted(self) -> bool:
        """The request may go now."""
        return self.wait_s == 0.0

    @property
    def booked(self) -> bool:
        """A slot is held (now or ``wait_s`` ahead): the call must settle or give it back."""
        return bool(self.permit)


def _check_rate(name: str, value: int | None) -> int:
    if value is None:
        return -1
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a positive integer or None, got {value!r}")
    return value


class RateLimiter:
    """Requests and tokens per limit, paced smoothly and shared by every worker.

    Args:
        redis_client: a ``redis.Redis``.
    """

    def __init__(self, redis_client: Any) -> None:
        self.redis = redis_client
        self._acquire = scripts.register(redis_client, "rate_acquire")
        self._settle = scripts.register(redis_client, "rate_settle")
        self._pause = scripts.register(redis_client, "rate_pause")

    def try_acquire(
        self,
        name: str,
        *,
        rpm: int | None,
        tpm: int | None,
        tokens: int,
        window_s: float = 60.0,
        learn: bool = False,
        hold_s: float = 600.0,
        burst_s: float = BURST_S,
        horizon_s: float = HORIZON_S,
    ) -> RateDecision:
        """Book the earliest slot the limit allows for one request of ``tokens``.

        ``rpm``/``tpm`` are the configured limits (a learned lower one wins); ``learn``:
        the vendor's headers teach the limit, so until it first answered a few probe
        requests go (:data:`~orchestration.core.ratelimit.PROBE_RPM`). A slot more than
        ``horizon_s`` ahead is not booked: the answer is how long to wait before asking
        again. A fleet-wide pause answers with its remaining time.

        Raises:
            ConfigError: a limit that is not a positive integer, negative ``tokens``.
        """
        rpm_arg, tpm_arg = _check_rate("rpm", rpm), _check_rate("tpm", tpm)
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            raise ConfigError(f"tokens must be an integer >= 0, got {tokens!r}")
        if window_s <= 0:
            raise ConfigError(f"window_s must be > 0, got {window_s!r}")
        wait_us, now_us, permit, used_rpm, used_tpm = self._acquire(
            keys=[keys.rate_limit(name), keys.rate_permits(name), keys.rate_pause(name)],
            args=[
                rpm_arg,
                tpm_arg,
                tokens,
                max(1, round(window_s * 1_000_000)),
                round(burst_s * 1_000_000),
                round(horizon_s * 1_000_000),
                1 if learn else 0,
                PROBE_RPM,
                uuid.uuid4().hex,
                round(hold_s * 1_000_000),
            ],
        )
        return RateDecision(
            wait_s=int(wait_us) / 1_000_000,
            server_time_us=int(now_us),
            permit=_field(permit),
            rpm=int(used_rpm) if int(used_rpm) > 0 else None,
            tpm=int(used_tpm) if int(used_tpm) > 0 else None,
        )

    def settle_call(
        self,
        name: str,
        permit: str,
        *,
        tokens: int | None,
        learned: VendorLimits | None = None,
        pause_s: float = 0.0,
    ) -> ScriptCall:
        """Settle ``permit`` with the call's real ``tokens`` (None: give it back, the call
        was answered 429 or never sent), note what the vendor's headers said
        (``learned``; None: nothing to note) and pause the limit ``pause_s`` — as a script
        call, to run with other writes in one round trip."""
        return ScriptCall(
            self._settle,
            [keys.rate_limit(name), keys.rate_permits(name)],
            [
                permit,
                -1 if tokens is None else max(int(tokens), 0),
                1 if learned is not None else 0,
                (learned.rpm if learned and learned.rpm else -1),
                (learned.tpm if learned and learned.tpm else -1),
                max(0, math.ceil(pause_s * 1_000_000)),
            ],
        )

    def settle(
        self,
        name: str,
        permit: str,
        *,
        tokens: int | None,
        learned: VendorLimits | None = None,
        pause_s: float = 0.0,
    ) -> tuple[bool, bool]:
        """:meth:`settle_call`, now: (the permit was settled now, a learned limit is in force)."""
        call = self.settle_call(name, permit, tokens=tokens, learned=learned, pause_s=pause_s)
        done, limited = call.script(keys=call.keys, args=call.args)
        return bool(done), bool(limited)

    def give_back(self, name: str, permit: str) -> bool:
        """Return a permit whose request was answered 429 or never sent; False when it was
        settled (or lapsed) before."""
        return self.settle(name, permit, tokens=None)[0]

    def permits(self, name: str) -> int:
        """Permits of limit ``name`` held now (booked, not settled, not lapsed)."""
        now_s, now_us = self.redis.time()
        now = int(now_s) * 1_000_000 + int(now_us)
        return int(self.redis.zcount(keys.rate_permits(name), f"({now}", "+inf"))

    def pause(self, name: str, seconds: float) -> float:
        """Pause limit ``name``'s model for the whole fleet, e.g. after a 429 with
        Retry-After on a model with no limit to pace by.

        A longer pause already in place is kept. Returns the pause now in force, in seconds.
        """
        if seconds <= 0:
            return self.paused_for(name)
        ms = self._pause(keys=[keys.rate_pause(name)], args=[max(1, math.ceil(seconds * 1000))])
        return int(ms) / 1000

    def paused_for(self, name: str) -> float:
        """Seconds left of a fleet-wide pause of limit ``name``; 0.0 when none."""
        ms = int(self.redis.pttl(keys.rate_pause(name)))
        return ms / 1000 if ms > 0 else 0.0
