"""Writes that must survive a failover: acknowledged only once a replica has them.

With ``DUET_REDIS_MIN_REPLICAS`` = n > 0 (``auto``, the default: 1 while the primary has had
a replica connected within :data:`AUTO_KEEP_S`, read every :data:`RECHECK_S` s; else 0), a stored step answer with its budget
settlement, a transition, a budget hold, a step's claim and a submission are sent with
``WAIT n timeout`` right after them, in the same pipeline (one round trip, the same
connection: ``WAIT`` counts the replicas that have every write that connection made; a Lua
script cannot call it). Fewer than n in ``DUET_REDIS_WAIT_TIMEOUT_S``: the write is not
acknowledged, :class:`NotReplicated` (an outage) goes up and the caller tries again
(each of these writes is idempotent or a compare-and-set), so a failover to that replica
loses none of them: no stored answer lost (the model called again), no budget charge lost.
``DUET_REDIS_WAIT_AOF`` sends ``WAITAOF 1 n timeout`` instead: also on the primary's and the
replicas' disks (append-only file fsynced), so losing them all at once loses none either.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import redis

from orchestration.settings import get_settings
from orchestration.state.outages import NoReplicasError
from orchestration.state.scripts import ScriptCall, run_scripts


class NotReplicated(NoReplicasError):
    """A write that fewer replicas than ``DUET_REDIS_MIN_REPLICAS`` acknowledged in time
    (or, with ``DUET_REDIS_WAIT_AOF``, did not fsync): not acknowledged (an outage: the
    caller tries it again)."""


@dataclass(frozen=True)
class Ask:
    """What a write that must survive a failover waits for: ``replicas`` replicas to have
    it (``WAIT``), and with ``aof`` the primary and those replicas to have it in their
    append-only files on disk (``WAITAOF``, Redis 7.2+ / Valkey 8)."""

    replicas: int
    aof: bool

    def command(self, timeout_ms: int) -> tuple[Any, ...]:
        if self.aof:
            return ("WAITAOF", 1, self.replicas, timeout_ms)
        return ("WAIT", self.replicas, timeout_ms)

    def met(self, reply: Any) -> bool:
        """Whether ``reply`` (``WAIT``'s count, ``WAITAOF``'s [local, replicas]) meets it."""
        if self.aof:
            local, replicas = (int(n) for n in reply)
            return local >= 1 and replicas >= self.replicas
        return int(reply) >= self.replicas


#: Seconds ``DUET_REDIS_MIN_REPLICAS=auto`` trusts the replica count it last read.
RECHECK_S = 5.0
#: Seconds ``auto`` keeps waiting for one replica after it last saw one connected: in a
#: failover the old primary loses its replica seconds before it is demoted, and writes it
#: acknowledged then would be lost.
AUTO_KEEP_S = 60.0
#: Per connection pool (one per server, or per Sentinel-watched primary): its replica count
#: as last read (``INFO replication``), when, and when one was last seen (monotonic).
_seen: dict[int, tuple[int, float, float]] = {}
_seen_lock = threading.Lock()


def asked(client: Any = None) -> Ask | None:
    """What this process's settings ask such writes (on ``client``) to wait for; None:
    nothing. ``auto`` reads whether the primary has a replica at most every
    :data:`RECHECK_S` seconds (a server that will not say counts as none)."""
    settings = get_settings()
    wanted = settings.redis_min_replicas
    if wanted == "auto":
        wanted = 1 if client is not None and _had_replica(client) else 0
    if not (wanted or settings.redis_wait_aof):
        return None
    return Ask(int(wanted), settings.redis_wait_aof)


def _had_replica(client: Any) -> bool:
    """Whether the server behind ``client`` had a replica within :data:`AUTO_KEEP_S`."""
    connected_replicas(client)
    with _seen_lock:
        _, _, last = _seen.get(id(getattr(client, "connection_pool", None)), (0, 0.0, NEVER))
    return time.monotonic() - last < AUTO_KEEP_S


#: A time long past (``time.monotonic``).
NEVER = float("-inf")


def connected_replicas(client: Any) -> int:
    """The replicas connected to the server behind ``client`` (a client or a pipeline),
    as read within the last :data:`RECHECK_S` seconds."""
    pool = getattr(client, "connection_pool", None)
    where = id(pool)
    now = time.monotonic()
    with _seen_lock:
        count, at, last = _seen.get(where, (0, NEVER, NEVER))
        if now - at < RECHECK_S:
            return count
        _seen[where] = (count, now, last)  # one reader at a time; the others use the last
    reader = redis.Redis(connection_pool=pool) if pool is not None else client
    try:
        count = int(reader.info("replication").get("connected_slaves", 0))
    except redis.exceptions.ResponseError:  # INFO refused: as standalone
        count = 0
    except BaseException:
        with _seen_lock:
            _seen.pop(where, None)  # read again next time
        raise
    now = time.monotonic()
    with _seen_lock:
        _seen[where] = (count, now, now if count else last)
    return count


def forget_replicas() -> None:
    """Read the replica counts again on the next writes, as if never read (tests)."""
    with _seen_lock:
        _seen.clear()


def execute(pipe: Any) -> list[Any]:
    """Execute ``pipe`` (a pipeline of writes), then wait as :func:`asked` on the same
    connection; its replies (raising the first error, as ``execute`` does).

    Raises:
        NotReplicated: the writes were not acknowledged as asked in time.
    """
    ask = asked(pipe)
    if ask is None:
        return list(pipe.execute())
    _wait(pipe, ask)
    replies = list(pipe.execute())
    _check(replies.pop(), ask)
    return replies


def run_durable(client: Any, calls: list[ScriptCall]) -> list[Any]:
    """:func:`~orchestration.state.scripts.run_scripts`, acknowledged as :func:`asked`
    (one round trip: the scripts by SHA, then ``WAIT`` / ``WAITAOF``).

    A script the server does not know (a new primary after a failover, a restart) is
    loaded and run again, with its own wait: the replication stream is in order, so a
    replica that has the later writes has the earlier ones too.

    Raises:
        NotReplicated: the writes were not acknowledged as asked in time.
    """
    ask = asked(client)
    if ask is None:
        return run_scripts(client, calls)
    replies = _send(client, calls, ask)
    missing = [
        i for i, reply in enumerate(replies) if isinstance(reply, redis.exceptions.NoScriptError)
    ]
    if missing:
        for i in missing:
            client.script_load(calls[i].script.script)
        for i, reply in zip(missing, _send(client, [calls[i] for i in missing], ask), strict=True):
            replies[i] = reply
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


def _send(client: Any, calls: list[ScriptCall], ask: Ask) -> list[Any]:
    """``calls`` by SHA and the wait, in one pipeline: each call's reply or error."""
    pipe = client.pipeline(transaction=False)
    for call in calls:
        pipe.evalsha(call.script.sha, len(call.keys), *call.keys, *call.args)
    _wait(pipe, ask)
    replies: list[Any] = pipe.execute(raise_on_error=False)
    acked = replies.pop()
    if isinstance(acked, Exception):
        raise acked
    if not any(isinstance(r, redis.exceptions.NoScriptError) for r in replies):
        _check(acked, ask)
    return replies


def _wait(pipe: Any, ask: Ask) -> None:
    pipe.execute_command(*ask.command(max(1, int(get_settings().redis_wait_timeout_s * 1000))))


def _check(acked: Any, ask: Ask) -> None:
    if not ask.met(acked):
        what = "in the append-only files of the primary and" if ask.aof else "on"
        raise NotReplicated(
            f"NOREPLICAS a write was not {what} {ask.replicas} replica(s) "
            f"(DUET_REDIS_MIN_REPLICAS) within DUET_REDIS_WAIT_TIMEOUT_S="
            f"{get_settings().redis_wait_timeout_s:g} (got {acked}): not acknowledged, "
            "tried again"
        )
