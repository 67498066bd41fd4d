"""Refuse, at start and in one line, a Redis that cannot keep Duet's state.

Workers and every ``duet`` command check the server once per process (per URL):

- an unknown URL scheme (only :data:`SCHEMES` are served), a Sentinel URL that cannot be
  read, a TLS file (``ssl_ca_certs=`` ...) that is not there;
- a ``maxmemory-policy`` other than ``noeviction``: at ``maxmemory`` Redis would evict
  runs, batches, queues and budget limits (a budget without its limit is no cap), so it
  is refused unless ``DUET_ALLOW_EVICTION=1`` says the risk is accepted;
- a Redis Cluster node (``cluster_enabled:1``): Duet's scripts and transactions touch keys
  in several hash slots, which a cluster refuses.

Fewer replicas connected than ``DUET_REDIS_MIN_REPLICAS`` asks for is a warning: the
writes that wait for them are retried until they are there. ``DUET_REDIS_WAIT_AOF=1`` on a
server without ``WAITAOF`` (before 7.2) or without ``appendonly yes`` is refused.

A server that does not say (``INFO`` and ``CONFIG`` disabled, as some managed services
do) is let through with one warning.
"""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from orchestration.core.errors import ConfigError
from orchestration.settings import get_settings
from orchestration.state import sentinel, tlsquery
from orchestration.state.connection import client_for, hide_password

#: URL schemes Duet's Redis clients serve.
SCHEMES = ("redis", "rediss", "unix", "sentinel", "sentinels")
#: The one eviction policy that never drops a key.
NO_EVICTION = "noeviction"
#: The variable that accepts an evicting server.
ALLOW_EVICTION_VAR = "DUET_ALLOW_EVICTION"


class Refused(ConfigError):
    """The Redis at a configured URL cannot keep Duet's state: why, and how to fix it."""


@dataclass(frozen=True)
class ServerFacts:
    """What the check reads of a server; None where the server would not say."""

    maxmemory_policy: str | None
    cluster_enabled: bool | None
    #: Replicas connected to it now (``INFO replication``).
    replicas: int | None = None
    #: Its version, (major, minor) (``INFO server``).
    version: tuple[int, int] | None = None
    #: Whether its append-only file is on (``INFO persistence``).
    aof_enabled: bool | None = None
    #: Its ``maxmemory`` in bytes (0: none) and memory in use (``INFO memory``).
    maxmemory: int | None = None
    used_memory: int | None = None
    #: Keys it has evicted since it started (``INFO stats``).
    evicted_keys: int | None = None


def check_scheme(url: str, variable: str) -> None:
    """Raise :class:`Refused` unless ``url`` has one of :data:`SCHEMES`, is a Sentinel URL
    that can be read (when it is one), and names TLS files that are there: every entry
    point calls this before Celery builds its broker connection."""
    scheme = urlsplit(url).scheme if "://" in url else ""
    if scheme not in SCHEMES:
        shown = f"{scheme}://" if scheme else "no scheme"
        raise Refused(
            f"{variable}={hide_password(url)}: {shown} is not a Redis URL Duet serves: "
            f"use {', '.join(s + '://' for s in SCHEMES)}"
        )
    if sentinel.is_sentinel(url):
        tls = sentinel.parse(url, variable).tls or {}
    else:
        tls = {k: v for k, v in parse_qsl(urlsplit(url).query) if k in tlsquery.TLS_FILES}
    for name, path in tls.items():
        if name in tlsquery.TLS_FILES and not os.path.exists(path):
            raise Refused(f"{variable}: {name}={path} is not there (a TLS file Redis needs)")


def judge(
    facts: ServerFacts,
    where: str,
    allow_eviction: bool,
    min_replicas: int = 0,
    wait_aof: bool = False,
) -> tuple[str | None, list[str]]:
    """The refusal (None for none) and the warnings for a server with ``facts``, named
    ``where`` in the messages, ``min_replicas`` and ``wait_aof`` asked for (pure)."""
    if facts.cluster_enabled:
        return (
            f"{where} is a Redis Cluster node (cluster_enabled:1): Duet's scripts and "
            "transactions use keys in several hash slots, which a cluster refuses; use a "
            "standalone Redis (or one behind Sentinel)"
        ), []
    if wait_aof and facts.version is not None and facts.version < (7, 2):
        return (
            f"{where} is Redis {facts.version[0]}.{facts.version[1]}: DUET_REDIS_WAIT_AOF=1 "
            "needs WAITAOF (Redis 7.2 or later, or Valkey); unset it, or upgrade"
        ), []
    if wait_aof and facts.aof_enabled is False:
        return (
            f"{where} has appendonly no: DUET_REDIS_WAIT_AOF=1 waits for its append-only "
            "file; run `CONFIG SET appendonly yes` (and set it in redis.conf), or unset it"
        ), []
    warnings: list[str] = []
    if facts.replicas is not None and facts.replicas < min_replicas:
        warnings.append(
            f"{where} has {facts.replicas} replica(s) connected and DUET_REDIS_MIN_REPLICAS="
            f"{min_replicas}: the writes that wait for replicas are retried until that many "
            "are connected"
        )
    if facts.evicted_keys:
        warnings.append(
            f"{where} has evicted {facts.evicted_keys} key(s) since it started "
            "(INFO stats evicted_keys): runs, batches, queued messages or budget limits may "
            f"be lost, and not listed; keep maxmemory-policy {NO_EVICTION}"
        )
    policy = facts.maxmemory_policy
    if policy is None:
        warnings.append(
            f"{where} does not say its maxmemory-policy (INFO and CONFIG refused): make "
            f"sure it is {NO_EVICTION}, or Redis may evict runs and budget limits"
        )
    elif policy != NO_EVICTION:
        if not allow_eviction:
            return (
                f"{where} has maxmemory-policy {policy}: at maxmemory it would evict "
                f"runs, batches and budget limits; run `CONFIG SET maxmemory-policy "
                f"{NO_EVICTION}` (and set it in redis.conf), or set {ALLOW_EVICTION_VAR}=1 "
                "to accept the risk"
            ), []
        warnings.append(
            f"{where} has maxmemory-policy {policy} ({ALLOW_EVICTION_VAR}=1): at "
            "maxmemory it may evict runs, batches and budget limits"
        )
    return None, warnings


def read_facts(client: redis.Redis) -> ServerFacts:
    """``maxmemory-policy`` (``INFO memory``, else ``CONFIG GET``) and ``cluster_enabled``
    (``INFO cluster``) of the server behind ``client``; None for what it refuses."""
    policy: str | None = None
    cluster: bool | None = None
    memory: dict[str, object] = {}
    with contextlib.suppress(redis.exceptions.ResponseError):
        memory = client.info("memory")
        policy = memory.get("maxmemory_policy")  # type: ignore[assignment]
    if policy is None:
        with contextlib.suppress(redis.exceptions.ResponseError):
            policy = client.config_get("maxmemory-policy").get("maxmemory-policy")
    with contextlib.suppress(redis.exceptions.ResponseError):
        cluster = bool(int(client.info("cluster").get("cluster_enabled", 0)))
    replicas: int | None = None
    version: tuple[int, int] | None = None
    aof: bool | None = None
    with contextlib.suppress(redis.exceptions.ResponseError):
        replicas = int(client.info("replication").get("connected_slaves", 0))
    with contextlib.suppress(redis.exceptions.ResponseError, ValueError):
        major, minor = str(client.info("server").get("redis_version", "")).split(".")[:2]
        version = (int(major), int(minor))
    with contextlib.suppress(redis.exceptions.ResponseError):
        aof = bool(int(client.info("persistence").get("aof_enabled", 0)))
    evicted: int | None = None
    with contextlib.suppress(redis.exceptions.ResponseError):
        evicted = int(client.info("stats").get("evicted_keys", 0))
    return ServerFacts(
        maxmemory_policy=_text(policy),
        cluster_enabled=cluster,
        replicas=replicas,
        version=version,
        aof_enabled=aof,
        maxmemory=_int(memory.get("maxmemory")),
        used_memory=_int(memory.get("used_memory")),
        evicted_keys=evicted,
    )


def _int(value: object) -> int | None:
    return None if value is None else int(str(value))


def verdict(facts: ServerFacts, where: str) -> tuple[str | None, list[str]]:
    """:func:`judge` with this process's settings."""
    settings = get_settings()
    return judge(
        facts,
        where,
        settings.allow_eviction,
        0 if settings.redis_min_replicas == "auto" else settings.redis_min_replicas,
        settings.redis_wait_aof,
    )


def _text(value: object) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


_lock = threading.Lock()
#: URLs already checked in this process (each is checked, and warned of, once).
_checked: set[str] = set()


def check_server(url: str, variable: str) -> list[str]:
    """Check the Redis at ``url`` (from ``variable``) once per process: the warnings for
    the caller to show (none after the first call).

    Raises:
        Refused: the scheme, the eviction policy or a cluster (one line, how to fix it).
        redis.RedisError, OSError: the server cannot be reached (the caller says so).
    """
    with _lock:
        if url in _checked:
            return []
    check_scheme(url, variable)
    settings = get_settings()
    timeout = settings.redis_connect_timeout_s
    client = client_for(
        url,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
        decode_responses=True,
    )
    try:
        facts = read_facts(client)
    finally:
        client.close()
    refusal, warnings = verdict(facts, f"the Redis at {variable}={hide_password(url)}")
    if refusal is not None:
        raise Refused(refusal)
    with _lock:
        _checked.add(url)
    return warnings


def forget() -> None:
    """Check every URL again (tests, and a process that changed its server)."""
    with _lock:
        _checked.clear()
