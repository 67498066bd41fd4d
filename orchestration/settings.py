"""Environment configuration (``DUET_*`` variables), read once per process."""

from __future__ import annotations

from functools import lru_cache
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from orchestration.core.key_policy import KeyPolicy, checked_key_hosts, parse_key_hosts
from orchestration.defaults import (
    DEFAULT_FINISHED_TTL_S,
    DEFAULT_PROCESS_TTL_S,
    DEFAULT_STEP_LEASE_S,
)


class Settings(BaseSettings):
    """Where Duet's Redis and broker are, and how long it keeps things."""

    model_config = SettingsConfigDict(env_prefix="DUET_", extra="ignore")

    #: Redis for run state, budgets and (unless broker_url is set) the task queue.
    #: Unset: the CLI and Team.run start an embedded Redis and an in-process worker.
    redis_url: str | None = None
    #: A separate Celery broker (e.g. RabbitMQ ``amqp://guest:guest@host:5672//``).
    broker_url: str | None = None
    #: The name Sentinel monitors the primary under, for a ``sentinel://`` URL.
    redis_sentinel_master: str = Field(default="mymaster", min_length=1)
    #: The sentinels' own password (their ``requirepass``), for sentinels that have one;
    #: the primary's is the URL's. Unset: the sentinels are asked without one.
    redis_sentinel_password: SecretStr | None = None
    #: Replicas a write that must survive a failover (a stored step answer and its
    #: budget settlement, a transition, a budget hold, a submission) waits for (``WAIT``);
    #: fewer in time: the write is not acknowledged, an outage retried. 0: no wait.
    #: ``auto``: one when the primary has a replica connected (read every few seconds),
    #: else none, so a standalone server pays nothing.
    redis_min_replicas: int | Literal["auto"] = "auto"
    #: Such writes also wait until the primary and those replicas have them in their
    #: append-only files on disk (``WAITAOF``: Redis 7.2+ or Valkey, ``appendonly yes``).
    redis_wait_aof: bool = False
    #: Seconds such a write waits for its replicas before it counts as not acknowledged.
    redis_wait_timeout_s: float = Field(default=2.0, gt=0)
    #: Seconds finished runs (record, steps, events) are kept in Redis.
    finished_ttl_s: int = Field(default=DEFAULT_FINISHED_TTL_S, ge=60)
    #: Seconds a step's claim (and budget reservation) outlives a worker that died.
    step_lease_s: int = Field(default=DEFAULT_STEP_LEASE_S, ge=5)
    #: Seconds a worker process counts as alive after its last sign of life (it renews
    #: it every third of this): a step claimed by a process gone this long is taken over
    #: at once (by a redelivery, a resume or the sweep), without waiting for the lease.
    process_ttl_s: int = Field(default=DEFAULT_PROCESS_TTL_S, ge=2)
    #: Seconds between two sweeps for runs that stopped moving (one worker sweeps at a time).
    sweep_interval_s: float = Field(default=30.0, gt=0)
    #: Seconds an unfinished run may go without moving (and without a live call) before the
    #: sweep sends it on again. Longer than a step waits in a busy queue.
    sweep_after_s: float = Field(default=600.0, gt=0)
    #: Whether every worker takes turns at the sweep (off when ``duet sweep --every`` runs
    #: as a process of its own; both may run: they take turns).
    sweep_in_worker: bool = True
    #: Seconds before a Redis broker gives an unacknowledged message (its worker died) to
    #: another worker. Longer than any step can run, including a retry's countdown.
    visibility_timeout_s: int = Field(default=3600, ge=5)
    #: Refuse, at submit and at worker start, a model call timeout (an agent's
    #: ``timeout_s``) not shorter than the visibility timeout. Off only to try such calls
    #: on purpose: the step claim still keeps each to one call.
    check_timeouts: bool = True
    #: Accept a Redis whose ``maxmemory-policy`` may evict keys (``DUET_ALLOW_EVICTION=1``):
    #: at ``maxmemory`` it then drops runs, batches and budget limits. Off: refused at start.
    allow_eviction: bool = False
    #: Seconds to wait for a connection to Redis or the broker (and, for a command-line
    #: client, for Redis's first answer) before giving up.
    redis_connect_timeout_s: float = Field(default=5.0, gt=0)
    #: Seconds one Redis or broker command may wait for its reply. Longer than the
    #: blocking reads Duet issues (5 s).
    redis_socket_timeout_s: float = Field(default=15.0, gt=5)
    #: Seconds a worker may go without reaching its Redis (every primary the sentinels
    #: name, or the one server) before it exits (code 3) for its supervisor to start it
    #: again. Unset: it waits for Redis however long it takes.
    redis_unreachable_exit_s: float | None = Field(default=None, gt=0)
    #: Threads per worker process: calls in flight at once (they wait on the model).
    worker_concurrency: int = Field(default=200, ge=1)
    #: Seconds a worker process trusts what it last learned of a model's fleet-wide pause
    #: (a vendor's 429 with Retry-After) before reading it again: within that a model
    #: call skips the read (one Redis command). A pause another process sets is obeyed
    #: here within this at most (a call in between may get a 429 itself, which pauses it
    #: as before); a pause this process sets is known at once. 0: read on every call.
    pause_recheck_s: float = Field(default=1.0, ge=0)
    #: Attempts for a transient provider failure before the agent is interrupted. A 429
    #: or a wait for the fleet's rate limit is no failed attempt (see rate_wait_max_s).
    max_attempts: int = Field(default=6, ge=1)
    #: Seconds one step may wait in all for rate limits (the limiter's slots, a vendor's
    #: 429s) before its run is interrupted with ``rate_limited:waited_<N>s``.
    rate_wait_max_s: float = Field(default=1800.0, gt=0)
    #: Base of the exponential retry backoff, seconds.
    retry_base_s: float = Field(default=1.0, gt=0)
    #: Cap of one retry wait, seconds.
    retry_max_s: float = Field(default=60.0, gt=0)
    #: Vendor SDKs a worker imports at start (e.g. ``openai,anthropic``) instead of on
    #: its first call to them.
    preload_providers: Annotated[list[str], NoDecode] = Field(default_factory=list)
    #: Largest prompt accepted, in characters.
    max_prompt_chars: int = Field(default=200_000, ge=1)
    #: Port a worker serves Prometheus metrics on (``/metrics``); unset: none recorded.
    metrics_port: int | None = Field(default=None, ge=1, le=65535)
    #: Log lines as ``text`` or ``json`` (one object per line, with run/batch/step/task ids).
    log_format: Literal["text", "json"] = "text"
    #: Celery's per-task INFO lines ("Task ... received/succeeded"): ~1 ms CPU per call.
    log_tasks: bool = False
    #: Vendor batch execution: how long a group's first parked request waits for others
    #: before they are submitted together, seconds.
    vendor_batch_gather_s: float = Field(default=2.0, gt=0)
    #: ...the most requests submitted as one vendor batch.
    vendor_batch_max_requests: int = Field(default=1000, ge=1, le=50_000)
    #: ...the longest wait between two checks of a submitted vendor batch, seconds.
    vendor_batch_poll_max_s: float = Field(default=60.0, gt=0)
    #: Modules of tools a worker imports at start (comma-separated), besides the shipped
    #: ``workers.tools.review``: each registers its tools with ``workers.tools.registry.tool``.
    tool_modules: Annotated[list[str], NoDecode] = Field(default_factory=list)
    #: Where a worker keeps the repositories its tools read, checked out by commit
    #: (unset: ``~/.cache/duet/tools``).
    tool_cache_dir: str | None = None
    #: Key variables a worker may send beyond the vendors' own, and the hosts each may go to
    #: (the vendors' keys go to their API hosts: hosts added here extend those). JSON
    #: (``{"TEAM_B_API_KEY": ["gw.b.example"]}``) or ``NAME=host,host;NAME=host``; a host is
    #: ``host``, ``host:port`` or ``http(s)://host[:port]`` (``https`` when unsaid). See
    #: :mod:`orchestration.core.key_policy`.
    key_hosts: Annotated[dict[str, list[str]], NoDecode] = Field(default_factory=dict)
    #: The key of the cache entries' integrity tags, the same on every worker and
    #: submitter of a fleet (an entry without a valid tag is never served). Unset: a key
    #: kept in ``fleet.key`` (0600) beside the embedded default's cache, made on first use.
    fleet_key: SecretStr | None = None
    #: OpenTelemetry traces of runs (``duet-review[otel]``; exported as the ``OTEL_*`` variables say).
    otel: bool = False

    @field_validator("tool_modules", mode="before")
    @classmethod
    def _module_list(cls, value: object) -> object:
        if isinstance(value, str):
            return [v.strip() for v in value.split(",") if v.strip()]
        return value

    @field_validator("redis_min_replicas")
    @classmethod
    def _replicas(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 0:
            raise ValueError("a number of replicas (0 or more), or auto")
        return value

    @field_validator("preload_providers", mode="before")
    @classmethod
    def _comma_list(cls, value: object) -> object:
        if isinstance(value, str):
            names = [v.strip() for v in value.split(",") if v.strip()]
            unknown = set(names) - {"openai", "anthropic", "sim"}
            if unknown:
                raise ValueError(
                    f"unknown providers {sorted(unknown)}; known: openai, anthropic, sim"
                )
            return names
        return value

    @field_validator("key_hosts", mode="before")
    @classmethod
    def _key_hosts(cls, value: object) -> object:
        if isinstance(value, str):
            return parse_key_hosts(value)
        return checked_key_hosts(value)

    def fleet_key_value(self) -> str | None:
        """The fleet key (:attr:`fleet_key`), or ``None`` when unset."""
        return self.fleet_key.get_secret_value() if self.fleet_key else None

    def key_policy(self) -> KeyPolicy:
        """The key variables this process's workers send, and where (defaults included)."""
        return KeyPolicy.with_extra(self.key_hosts)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
