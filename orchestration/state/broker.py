"""The Redis broker transport Duet uses: kombu's, with one client object per channel.

kombu's Redis channel builds a new ``redis.Redis`` object for nearly every operation
(publish, ack, event). With redis-py 8 each construction copies a ~700-entry callback
table, and a model call does about a dozen of them: measured at ~1 ms of CPU per call,
more than everything else Duet does. A ``redis.Redis`` object is thread-safe (each
command takes a connection from the pool), so one per channel is enough.

The transport is named by its class path in Celery's ``broker_transport``, so the broker
URL keeps its ``redis://`` scheme, and :class:`Connection` names it ``redis`` again when
it writes the URL back out (``as_uri``): Flower picks its broker client (Broker page,
``/api/queues/length``) by that scheme.

A worker also outlasts a Redis at ``maxmemory``: the delivered message kombu cannot note
as unacknowledged is held until Redis takes writes again (``QoS.append``), instead of
ending the worker.

These override methods kombu does not document (``Channel._create_client``,
``QoS.pipe_or_acquire``, ``QoS.append``), tested with the kombu release pinned in ``pyproject.toml``;
:func:`check_versions` refuses an untested kombu when the transport is chosen. This is
the one place Duet customises kombu (the client uses the transport too, so it cannot live
with the worker's Celery customisations in ``workers/celery_ext.py``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import kombu
import redis
from kombu.transport import redis as kombu_redis

from orchestration.core.errors import ConfigError
from orchestration.settings import Settings
from orchestration.state import connection, keys

#: Celery ``broker_transport`` value selecting this transport.
TRANSPORT = "orchestration.state.broker:Transport"
#: Backoff while Redis refuses writes for lack of memory, seconds: first wait and cap.
OOM_FIRST_WAIT_S, OOM_MAX_WAIT_S = 0.05, 1.0
#: Seconds between two warnings while it lasts.
OOM_WARN_EVERY_S = 30.0

log = logging.getLogger(__name__)

#: The kombu releases the overrides below are tested with (pyproject.toml pins the same).
KOMBU_TESTED = ">=5.7,<5.8"


def check_release(package: str, version: str, tested: str, missing: list[str]) -> None:
    """Raise a :class:`ConfigError` if ``version`` of ``package`` is outside ``tested``
    or a private name Duet overrides (``missing``) is gone."""
    from packaging.specifiers import SpecifierSet

    if version in SpecifierSet(tested) and not missing:
        return
    problem = f"{package} {version} is installed"
    if missing:
        problem += f" and lacks {', '.join(missing)}"
    raise ConfigError(
        f"{problem}, but Duet's customisations of it are tested with {package}{tested}: "
        f"install that (pip install '{package}{tested}')"
    )


def check_versions() -> None:
    """Refuse a kombu release the transport below was not tested with (ConfigError)."""
    needed = [
        (kombu_redis.Channel, "_create_client"),
        (kombu_redis.Channel, "pool"),
        (kombu_redis.Channel, "conn_or_acquire"),
        (kombu_redis.Channel, "unacked_restore_throttle"),
        (kombu_redis.QoS, "pipe_or_acquire"),
        (kombu_redis.QoS, "append"),
        (kombu.Connection, "resolve_aliases"),
    ]
    missing = [
        f"{cls.__module__}.{cls.__name__}.{name}" for cls, name in needed if not hasattr(cls, name)
    ]
    check_release("kombu", kombu.__version__, KOMBU_TESTED, missing)


class QoS(kombu_redis.QoS):
    """kombu's ack emulation, with plain (non-MULTI) pipelines for its bookkeeping.

    Every delivered message is noted (ZADD to the unacked index, HSET of the message) and
    every ack removes it (ZREM, HDEL). kombu sends each pair as a MULTI/EXEC transaction,
    four commands where two do: the pair is sent in one round trip either way, Redis runs
    it back to back, and the only other reader, the restore of messages unacked past the
    visibility timeout, watches the unacked hash and skips a tag without a message.
    Restores keep their own transaction (they pass their pipeline in).
    """

    def append(self, message: Any, delivery_tag: str) -> None:
        """Note a delivered message as unacknowledged, waiting out a Redis that is full.

        The consumer has already popped the message from its queue; kombu writes it to
        the unacked index here, in the worker's event loop, where an error is fatal (the
        worker exits, "Unrecoverable error", and the message is lost). Redis refuses
        those writes while at ``maxmemory`` (OOM): wait, with backoff, until it takes
        them again. Nothing else can be consumed meanwhile anyway.
        """
        delay, waited, warned = OOM_FIRST_WAIT_S, 0.0, 0.0
        while True:
            try:
                super().append(message, delivery_tag)  # type: ignore[no-untyped-call]
                if waited:
                    log.warning("Redis accepts writes again after %.1fs at maxmemory", waited)
                return
            except redis.exceptions.OutOfMemoryError:
                if waited - warned >= OOM_WARN_EVERY_S or not waited:
                    warned = waited
                    log.warning(
                        "Redis is at maxmemory (OOM): holding delivered message %s until "
                        "it accepts writes (%.0fs so far)", delivery_tag, waited,
                    )  # fmt: skip
                time.sleep(delay)
                waited += delay
                delay = min(delay * 2, OOM_MAX_WAIT_S)

    @contextmanager
    def pipe_or_acquire(self, pipe: Any = None, client: Any = None) -> Iterator[Any]:
        if pipe:
            yield pipe
        else:
            with self.channel.conn_or_acquire(client) as conn:
                yield conn.pipeline(transaction=False)


class Channel(kombu_redis.Channel):
    """A kombu Redis channel that reuses its synchronous client."""

    QoS = QoS
    _duet_client: Any = None

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            return super()._create_client(asynchronous=True)  # type: ignore[no-untyped-call]
        client = self._duet_client
        # The pool is replaced when the channel reconnects: follow it.
        if client is None or client.connection_pool is not self.pool:
            client = self._duet_client = super()._create_client(  # type: ignore[no-untyped-call]
                asynchronous=False
            )
        return client


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with :class:`Channel`."""

    Channel = Channel


class Connection(kombu.Connection):
    """kombu's connection, writing :data:`TRANSPORT` as ``redis`` in its URL and info.

    ``resolve_aliases`` is kombu's table of transport names shown under another name
    (``pyamqp`` is shown as ``amqp``); it changes only how the connection is described
    (``as_uri``, ``info``), never which transport it uses.
    """

    resolve_aliases = {**kombu.Connection.resolve_aliases, TRANSPORT: "redis"}


def broker_config(broker_url: str | None, settings: Settings) -> dict[str, Any]:
    """The Celery settings every process that talks to the broker shares (workers and
    clients): where it is, which transport, JSON only, routes, the visibility timeout."""
    return {
        "broker_url": broker_url,
        "broker_transport": transport_for(broker_url),
        # Messages carry ids only, so JSON is all we need; pickle is never accepted.
        "task_serializer": "json",
        "accept_content": ["json"],
        "result_serializer": "json",
        # No task waits on another task's result: results are stored in Redis by the
        # tasks themselves, so the Celery result backend is off (one write less per task).
        "task_ignore_result": True,
        "task_routes": {name: {"queue": queue} for name, queue in keys.TASK_QUEUES.items()},
        "broker_connection_retry_on_startup": True,
        # A dead worker's messages go back to the queue after the visibility timeout
        # (longer than any step runs, so live work is never redelivered); the sweep that
        # does it runs a few times per timeout instead of kombu's every ~100 s.
        "broker_transport_options": {
            "visibility_timeout": settings.visibility_timeout_s,
            "unacked_restore_interval": max(1, min(60, settings.visibility_timeout_s // 5)),
            "unacked_restore_throttle": 1,
            # A dead or frozen Redis is an error in seconds, then a reconnect; not a hang.
            **connection.socket_options(),
        },
        "broker_connection_timeout": settings.redis_connect_timeout_s,
    }


def visibility_timeout_of(settings: Settings) -> int | None:
    """Seconds the broker leaves a message unacknowledged before handing it to another
    worker: ``DUET_VISIBILITY_TIMEOUT_S`` on a Redis broker (the embedded one included);
    None for a broker without one (AMQP), or when ``DUET_CHECK_TIMEOUTS`` is off."""
    if not settings.check_timeouts:
        return None
    url = settings.broker_url or settings.redis_url or "redis://"
    return settings.visibility_timeout_s if url.startswith(("redis://", "rediss://")) else None


def transport_for(broker_url: str | None) -> str | None:
    """Our transport for ``redis://`` / ``rediss://`` brokers; None keeps kombu's choice.

    Raises:
        ConfigError: the installed kombu is not a release the transport is tested with.
    """
    if broker_url and broker_url.split("://", 1)[0] in ("redis", "rediss"):
        check_versions()
        return TRANSPORT
    return None
