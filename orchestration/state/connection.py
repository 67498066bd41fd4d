"""One pooled Redis client per process, shared by every thread."""

from __future__ import annotations

import threading
from typing import Any

import redis

from orchestration.core.errors import ConfigError
from orchestration.settings import get_settings

_lock = threading.Lock()
_client: redis.Redis | None = None
_url: str | None = None


def use_redis(url: str) -> None:
    """Point this process at ``url`` (the embedded default calls this)."""
    global _client, _url
    with _lock:
        if _client is not None and url != _url:
            _client.close()
            _client = None
        _url = url


def redis_url() -> str:
    url = _url or get_settings().redis_url
    if not url:
        raise ConfigError(
            "no Redis configured: set DUET_REDIS_URL (e.g. redis://localhost:6379/0), "
            "or use the embedded default through Team.run / the duet CLI"
        )
    return url


def get_redis() -> Any:
    """The process-wide client (a blocking pool sized for a threaded worker).

    Typed ``Any``: it decodes responses to ``str``, which redis-py's annotations
    (``bytes | str`` everywhere) cannot express.
    """
    global _client
    client = _client
    if client is not None:
        return client
    with _lock:
        if _client is None:
            pool = redis.BlockingConnectionPool.from_url(
                redis_url(),
                max_connections=get_settings().worker_concurrency + 16,
                timeout=30,
                decode_responses=True,
                # Longer than any blocking read we issue (XREAD BLOCK waits <= 5 s).
                socket_timeout=30,
                socket_connect_timeout=10,
                health_check_interval=30,
            )
            _client = redis.Redis(connection_pool=pool)
        return _client


def reset() -> None:
    """Forget the client (tests, and a process that forked)."""
    global _client, _url
    with _lock:
        if _client is not None:
            _client.close()
        _client = None
        _url = None
