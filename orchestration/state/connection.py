"""One pooled Redis client per process, shared by every thread; reachability checks.

Every connection has a connect timeout and a socket timeout (``DUET_REDIS_CONNECT_TIMEOUT_S``,
``DUET_REDIS_SOCKET_TIMEOUT_S``), so a dead or frozen server is an error in seconds,
never a hang. URLs are shown with their password hidden.
"""

from __future__ import annotations

import logging
import re
import ssl
import threading
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import MasterNotFoundError

from orchestration.core.errors import ConfigError, DuetError
from orchestration.settings import Settings, get_settings
from orchestration.state import sentinel
from orchestration.state.outages import OUTAGE_ERRORS

_lock = threading.Lock()
_client: redis.Redis | None = None
_url: str | None = None


def use_redis(url: str) -> None:
    """Point this process at ``url`` (the embedded default calls this)."""
    global _client, _url
    with _lock:
        if _client is not None and url != _url:
            _close(_client)
            _client = None
        _url = url


def _close(client: redis.Redis) -> None:
    """Close ``client`` and every connection of its pool (a client given a pool leaves
    the pool's open)."""
    client.close()
    client.connection_pool.disconnect()


def redis_url() -> str:
    """The run-state Redis URL (a Sentinel one written as kombu reads it, so the broker's
    URL, written the same way, compares equal)."""
    url = _url or get_settings().redis_url
    if not url:
        raise ConfigError(
            "no Redis configured: set DUET_REDIS_URL (e.g. redis://localhost:6379/0), "
            "or use the embedded default through Team.run / the duet CLI"
        )
    return sentinel.parse(url).canonical() if sentinel.is_sentinel(url) else url


def get_redis() -> Any:
    """The process-wide client: redis-py's ``BlockingConnectionPool``, sized for a threaded
    worker (its threads and 32 more connections).

    Typed ``Any``: it decodes responses to ``str``, which redis-py's annotations
    (``bytes | str`` everywhere) cannot express.
    """
    global _client
    client = _client
    if client is not None:
        return client
    with _lock:
        if _client is None:
            url = redis_url()
            options: dict[str, Any] = {
                "max_connections": get_settings().worker_concurrency + 32,
                "decode_responses": True,
                # Longer than any blocking read we issue (XREAD BLOCK waits <= 5 s).
                "socket_timeout": get_settings().redis_socket_timeout_s,
                "socket_connect_timeout": get_settings().redis_connect_timeout_s,
                "health_check_interval": 30,
            }
            if sentinel.is_sentinel(url):
                _client = sentinel.master_client(
                    url, get_settings().redis_sentinel_master, **options
                )
                _notice_sentinel()
            else:
                pool = redis.BlockingConnectionPool.from_url(url, timeout=30, **options)
                _client = redis.Redis(connection_pool=pool)
        return _client


_noticed = False


def _notice_sentinel() -> None:
    """Say once per process that a Sentinel URL runs redis-py's and kombu's stock Sentinel
    clients (Duet's transport fast path is for ``redis://`` / ``rediss://``)."""
    global _noticed
    if not _noticed:
        _noticed = True
        logging.getLogger(__name__).info(
            "DUET_REDIS_URL is a Sentinel URL: redis-py's Sentinel pool and kombu's Sentinel "
            "transport run (Duet's transport fast path is for redis:// URLs)"
        )


def client_for(url: str, **options: Any) -> Any:
    """A client of its own for the Redis at ``url`` (``redis://``, ``rediss://``,
    ``unix://``, or the primary a ``sentinel://`` URL names), with ``options``."""
    if sentinel.is_sentinel(url):
        return sentinel.master_client(url, get_settings().redis_sentinel_master, **options)
    return redis.Redis.from_url(url, **options)


def reset() -> None:
    """Forget the client (tests, and a process that forked)."""
    global _client, _url
    with _lock:
        if _client is not None:
            _close(_client)
        _client = None
        _url = None


#: Broker URL schemes kombu serves with py-amqp (RabbitMQ).
AMQP_SCHEMES = ("amqp", "amqps", "pyamqp")
#: Broker URL schemes of a Redis (kombu's Redis transport, or its Sentinel one).
REDIS_SCHEMES = ("redis", "rediss", sentinel.SCHEME, sentinel.TLS_SCHEME)


def is_redis_url(url: object) -> bool:
    """Whether ``url`` names a Redis (as a broker: over TCP, TLS or Sentinel)."""
    return bool(url) and str(url).split("://", 1)[0] in REDIS_SCHEMES


def socket_options(
    broker_url: str | None = None, settings: Settings | None = None
) -> dict[str, float]:
    """kombu transport options giving a broker connection the Redis clients' timeouts, in
    its transport's terms: redis-py's for Redis; for AMQP, py-amqp's ``read_timeout`` and
    ``write_timeout`` (``SO_RCVTIMEO`` / ``SO_SNDTIMEO``), so a broker that stops answering
    after the handshake is an error, not a hang. (py-amqp bounds the connect and the
    handshake by the connect timeout, which kombu passes itself.)"""
    settings = settings or get_settings()
    if broker_url and broker_url.split("://", 1)[0] in AMQP_SCHEMES:
        return {
            "read_timeout": settings.redis_socket_timeout_s,
            "write_timeout": settings.redis_socket_timeout_s,
        }
    return {
        "socket_timeout": settings.redis_socket_timeout_s,
        "socket_connect_timeout": settings.redis_connect_timeout_s,
    }


_QUERY_PASSWORD = re.compile(r"(?i)((?:^|&)password=)[^&]*")


#: Redis's own errors that say it could not do a command *now* (lost, frozen, restarting,
#: full, unable to persist, a read-only replica: :mod:`~orchestration.state.outages`), as
#: opposed to a bug (a script error).
UNAVAILABLE_ERRORS: tuple[type[BaseException], ...] = (
    redis.exceptions.ConnectionError,  # BusyLoadingError (restarting) is one
    redis.exceptions.TimeoutError,
    *OUTAGE_ERRORS,
)
#: What a worker treats as "not now": those, and a socket's own error. The work that met
#: one is tried again later, never dropped.
INFRA_ERRORS: tuple[type[BaseException], ...] = (*UNAVAILABLE_ERRORS, OSError)
#: Redis refusing a write at its ``maxmemory`` (one of :data:`UNAVAILABLE_ERRORS`).
OUT_OF_MEMORY: type[redis.exceptions.OutOfMemoryError] = redis.exceptions.OutOfMemoryError


class Unreachable(DuetError):
    """Redis (or the broker) at a configured URL cannot be used: down, frozen, refusing."""


class LoginRefused(Unreachable, ConfigError):
    """Redis (or its sentinels) refused the password given: a setting to fix."""


class TlsRefused(Unreachable, ConfigError):
    """The TLS handshake with Redis (or its sentinels) failed: a certificate that does
    not verify, TLS against a plain port or the reverse; a setting to fix."""


def hide_password(url: str) -> str:
    """``url`` with its password (in the authority or a ``password=`` query parameter)
    replaced by ``***``; a URL that cannot be taken apart is not shown at all."""
    if sentinel.is_sentinel(url):
        return sentinel.hide_password(url)
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if parts.password is not None:
            netloc = f"{parts.username or ''}:***@{netloc.rpartition('@')[2]}"
        query = _QUERY_PASSWORD.sub(r"\1***", parts.query)
        return urlunsplit(parts._replace(netloc=netloc, query=query))
    except ValueError:
        return "<unparseable URL>"


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message (redis-py's may span several)."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def check_reachable(url: str, variable: str) -> None:
    """Connect to the Redis at ``url`` and PING it, once, within the connect timeout.

    Raises:
        Unreachable: naming ``variable`` and the URL (password hidden) and what happened.
    """
    timeout = get_settings().redis_connect_timeout_s
    client = client_for(
        url,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
    )
    try:
        client.ping()
    except (redis.RedisError, OSError) as exc:
        raise unreachable(url, variable, exc) from None
    finally:
        client.close()


def check_broker_reachable(url: str, variable: str) -> None:
    """Connect to a non-Redis broker (e.g. RabbitMQ) at ``url`` once, within the connect
    timeout.

    Raises:
        Unreachable: naming ``variable`` and the URL (password hidden) and what happened.
    """
    import kombu

    timeout = get_settings().redis_connect_timeout_s
    conn = kombu.Connection(  # type: ignore[no-untyped-call]
        url, connect_timeout=timeout, transport_options=socket_options(url)
    )
    try:
        conn.ensure_connection(max_retries=0)  # type: ignore[no-untyped-call]
    except Exception as exc:  # noqa: BLE001 - kombu raises each transport's own errors
        raise unreachable(url, variable, exc, what="the broker") from None
    finally:
        conn.release()  # type: ignore[no-untyped-call]


def refused_login(url: str, variable: str, exc: BaseException) -> Unreachable | None:
    """The one-line error when ``exc`` is Redis (or its sentinels) refusing the password
    given (:class:`LoginRefused`) or the TLS handshake failing (:class:`TlsRefused`): a
    setting to fix, not an outage to wait out; None for any other error."""
    said = str(unreachable(url, variable, exc))
    if isinstance(exc, redis.exceptions.AuthenticationError) or (
        isinstance(exc, MasterNotFoundError) and "refused the password" in said
    ):
        return LoginRefused(said)
    if is_tls_failure(exc):
        return TlsRefused(said)
    return None


def is_tls_failure(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it wraps) is a failed TLS handshake: an ``ssl.SSLError``,
    or redis-py's connection error, or Sentinel's list of them, naming one."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLError):
            return True
        seen = seen.__cause__ or seen.__context__
    if isinstance(exc, redis.exceptions.ConnectionError):
        return "[SSL" in str(exc) or "certificate verify failed" in str(exc)
    return False


def unreachable(url: str, variable: str, exc: BaseException, what: str = "Redis") -> Unreachable:
    """The one-line error for ``what`` at ``url`` (from ``variable``) failing with ``exc``."""
    if isinstance(exc, MasterNotFoundError):  # its message lists every sentinel's repr
        tls = sentinel.is_sentinel(url) and sentinel.parse(url, variable).tls is not None
        why = sentinel.why_no_primary(str(exc), get_settings().redis_sentinel_master, tls)
    elif isinstance(exc, redis.TimeoutError):
        why = "did not answer in time"
    elif is_tls_failure(exc):
        why = f"the TLS handshake failed: {first_line(exc)}"
    else:
        why = first_line(exc)
    return Unreachable(f"cannot use {what} at {variable}={hide_password(url)}: {why}")
