"""Which Redis error replies mean "not now" (an outage), classified by their prefix, here only.

A server that cannot persist (``MISCONF``), a read-only replica (``READONLY``), one still
loading its data (``LOADING``), a replica without its primary (``MASTERDOWN``), a cluster
slot in flux (``TRYAGAIN``, ``CLUSTERDOWN``), too few replicas to write (``NOREPLICAS``) and
a full one (``OOM``) refuse a command *before* running it, and a blocked pop the server ends
as it turns replica (``UNBLOCKED``) took nothing: the work is tried again later,
like a lost connection, never failed. redis-py maps some of these prefixes to classes of
its own and the rest to a plain ``ResponseError``; :func:`register` gives those a class
(in redis-py's own prefix table, so every client in the process, kombu's included, raises
it, also inside a pipeline whose message redis-py rewrites).
"""

from __future__ import annotations

import redis
from redis._parsers.base import BaseParser


class DiskError(redis.exceptions.ResponseError):
    """``MISCONF``: the server cannot persist (disk full, a failed save) and refuses writes."""


class NoReplicasError(redis.exceptions.ResponseError):
    """``NOREPLICAS``: fewer replicas than ``min-replicas-to-write`` are connected."""


class UnblockedError(redis.exceptions.ResponseError):
    """``UNBLOCKED``: a blocked command (a pop) ended by the server, unserved, as it
    became a replica (``REPLICAOF``, a failover) or ``CLIENT UNBLOCK ... ERROR``."""


#: Each outage prefix and the class its reply is raised as.
OUTAGE_CLASSES: dict[str, type[redis.exceptions.RedisError]] = {
    "MISCONF": DiskError,
    "NOREPLICAS": NoReplicasError,
    "READONLY": redis.exceptions.ReadOnlyError,
    "LOADING": redis.exceptions.BusyLoadingError,
    "MASTERDOWN": redis.exceptions.MasterDownError,
    "TRYAGAIN": redis.exceptions.TryAgainError,
    "CLUSTERDOWN": redis.exceptions.ClusterDownError,
    "OOM": redis.exceptions.OutOfMemoryError,
    "UNBLOCKED": UnblockedError,
}
#: The error classes of an outage reply (``except OUTAGE_ERRORS``).
OUTAGE_ERRORS: tuple[type[redis.exceptions.RedisError], ...] = tuple(
    dict.fromkeys(OUTAGE_CLASSES.values())
)


def register() -> None:
    """Make redis-py raise :data:`OUTAGE_CLASSES` for their prefixes (idempotent)."""
    table = BaseParser.EXCEPTION_CLASSES
    for prefix, cls in OUTAGE_CLASSES.items():
        known = table.get(prefix)
        if not (isinstance(known, type) and issubclass(known, cls)):
            table[prefix] = cls


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` is an outage reply: by class, or by the prefix of a plain
    ``ResponseError``'s message (one raised by a client :func:`register` did not reach)."""
    if isinstance(exc, OUTAGE_ERRORS):
        return True
    if not isinstance(exc, redis.exceptions.ResponseError):
        return False
    message = str(exc)
    _, marker, rest = message.partition(" caused error: ")  # redis-py's pipeline wording
    code = (rest if marker else message).split(" ", 1)[0]
    return code in OUTAGE_CLASSES


register()
