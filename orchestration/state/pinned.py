"""A Redis connection pool in which each thread keeps a connection of its own (the ``pool``
fast path): no pool queue, lock and pid checks per command for a worker's threads, which
send their commands one after another. Details: docs/internals.md.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

import redis

#: Forks of this process so far, counted in each child: a connection kept before a fork
#: is not used after it.
_forks = 0
#: Every pool of this process: a child gives each a new lock.
_pools: weakref.WeakSet[PinnedPool] = weakref.WeakSet()


def _forked() -> None:
    """In a forked child (its only thread): count the fork, and give each pool a new lock,
    as the parent's may have been held by a thread the child does not have."""
    global _forks
    _forks += 1
    for pool in list(_pools):
        pool._kept_lock = threading.Lock()


os.register_at_fork(after_in_child=_forked)


class _Kept:
    """A kept connection: whether a command is using it, and whether its thread ended."""

    __slots__ = ("busy", "connection", "forks", "orphan")

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.busy = True
        self.orphan = False
        self.forks = _forks


class _Holder:
    """What a thread holds (in its thread-local): collected when the thread ends."""

    __slots__ = ("__weakref__", "kept")

    def __init__(self, kept: _Kept) -> None:
        self.kept = kept


def _thread_ended(pool_ref: weakref.ref[PinnedPool], kept: _Kept) -> None:
    """A holder's thread ended: its connection goes back to the queue now if no command
    holds it, else when that command releases it."""
    kept.orphan = True
    pool = pool_ref()
    if pool is not None and kept.forks == _forks:
        pool.give_back(kept)


def _ready(connection: Any) -> Any:
    """``connection``, connected and with nothing unread (as redis-py's pool checks each
    one it hands out): one closed by the server meanwhile (a restart, ``CLIENT KILL``) is
    connected anew here rather than failing the command sent on it."""
    try:
        connection.connect()
        if connection.can_read():
            raise redis.ConnectionError("connection has data")
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        connection.disconnect()
        connection.connect()
    return connection


class PinnedPool(redis.BlockingConnectionPool):
    """:class:`redis.BlockingConnectionPool` where each thread keeps a connection (at
    most ``max_connections - spare`` of them, so the queue always has ``spare``)."""

    def __init__(self, *args: Any, spare: int = 16, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        self._mine = threading.local()
        self._keep_at_most = max(0, self.max_connections - spare)
        self._kept = 0
        self._kept_forks = _forks
        self._kept_lock = threading.Lock()
        _pools.add(self)

    def get_connection(self, command_name: Any = None, *keys: Any, **options: Any) -> Any:
        holder: _Holder | None = getattr(self._mine, "holder", None)
        if holder is not None:
            kept = holder.kept
            if not kept.busy and kept.forks == _forks:
                kept.busy = True
                return _ready(kept.connection)
        connection = super().get_connection()  # type: ignore[no-untyped-call]  # args deprecated
        if (holder is None or holder.kept.forks != _forks) and self._may_keep():
            kept = _Kept(connection)
            connection.duet_kept = kept
            self._mine.holder = holder = _Holder(kept)
            ended = weakref.finalize(holder, _thread_ended, weakref.ref(self), kept)
            ended.atexit = False
        return connection

    def release(self, connection: Any) -> None:
        kept: _Kept | None = getattr(connection, "duet_kept", None)
        if kept is None or kept.forks != _forks:
            super().release(connection)  # type: ignore[no-untyped-call]
            return
        should_reconnect = getattr(connection, "should_reconnect", None)  # redis-py >= 7
        if should_reconnect is not None and should_reconnect():
            connection.disconnect()
        kept.busy = False
        if kept.orphan:  # its thread ended while this command held it
            self.give_back(kept)

    def give_back(self, kept: _Kept) -> None:
        """``kept``, whose thread ended, back to the queue, once no command holds it (the
        thread's end and the last release both ask; one of them gives it)."""
        with self._kept_lock:
            if kept.busy or kept.connection.duet_kept is not kept:
                return
            kept.connection.duet_kept = None
            self._kept -= 1
        super().release(kept.connection)  # type: ignore[no-untyped-call]

    @property
    def kept(self) -> int:
        """How many connections threads keep now."""
        return self._kept if self._kept_forks == _forks else 0

    def _may_keep(self) -> bool:
        with self._kept_lock:
            if self._kept_forks != _forks:  # a forked child: nothing is kept in it yet
                self._kept, self._kept_forks = 0, _forks
            if self._kept >= self._keep_at_most:
                return False
            self._kept += 1
            return True


__all__ = ["PinnedPool"]
