"""Duet's kombu Redis transport (the ``transport`` fast path) and the broker settings every
process shares: fewer round trips per task, and a worker that outlasts Redis outages and
poison messages. What it overrides and why: docs/internals.md; off: :class:`StockTransport`.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from functools import cached_property
from typing import Any
from urllib.parse import parse_qs, urlsplit

import kombu
import redis
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import dumps, loads

from orchestration.backoff import OUTAGE
from orchestration.core.envelope import envelope_problem, examine
from orchestration.defaults import ACK_BATCH, OOM_WARN_EVERY_S, POP_MAX
from orchestration.settings import Settings
from orchestration.state import (
    connection,
    deadletters,
    fastpaths,
    keys,
    scripts,
    sentinel,
    tlsquery,
)
from orchestration.state.outages import OUTAGE_ERRORS
from orchestration.state.sentinel import SentinelURL

#: Celery ``broker_transport`` value selecting this transport.
TRANSPORT = "orchestration.state.broker:Transport"
#: The value selecting kombu's stock Redis transport, outages counted as connection
#: errors (:class:`StockTransport`), when the ``transport`` fast path is off.
STOCK_TRANSPORT = "orchestration.state.broker:StockTransport"
#: The value selecting kombu's stock Sentinel transport, outages counted as connection
#: errors (:class:`SentinelTransport`), for a ``sentinel://`` broker.
SENTINEL_TRANSPORT = "orchestration.state.broker:SentinelTransport"
#: Appended to kombu's unacked index key (``unacked_index``) to name the sorted set of
#: unacknowledged messages (see :class:`QoS`); a key of its own, so a kombu-style reader
#: never takes its members for delivery tags.
UNACKED_SUFFIX = ":messages"

log = logging.getLogger(__name__)


def _member(payload: dict[str, Any]) -> str:
    """The unacked set's member for a delivered message that no pop noted (its payload,
    exchange and routing key, which a restore needs): unique per delivery, as the payload
    has its tag."""
    delivery = payload["properties"]["delivery_info"]
    return str(dumps([payload, delivery["exchange"], delivery["routing_key"]]))  # type: ignore[no-untyped-call]


def popped_member(text: str, queue: str) -> str:
    """The unacked set's member for a message popped from ``queue``: its JSON as popped
    (not encoded again), the anonymous exchange and the queue, so a restore puts it back
    where it was taken from. ``lua/pop_note.lua`` writes the same."""
    return f'[{text}, "", {_json_string(queue)}]'


#: A string's JSON text (the C encoder ``json.dumps`` uses).
_json_string = json.encoder.encode_basestring_ascii


def _text(item: bytes | str) -> str:
    """A popped message's text; bytes that are not UTF-8 are kept visible, escaped, and
    marked (:data:`_NOT_UTF8`) for :func:`_examine` to refuse."""
    if isinstance(item, str):
        return item
    try:
        return item.decode("utf-8")
    except UnicodeDecodeError:
        return _NOT_UTF8 + item.decode("utf-8", "backslashreplace")


#: Starts the text of a popped message that is not UTF-8 (no JSON text starts so).
_NOT_UTF8 = "\\x"


def _examine(text: str) -> tuple[dict[str, Any] | None, str | None]:
    """A popped text's message and None, or None and why no worker can take it."""
    if text.startswith(_NOT_UTF8):
        return None, "not UTF-8 text"
    return examine(text, loads)


class QoS(kombu_redis.QoS):
    """Duet's unacknowledged-message format, with each message one member of one sorted set:
    every channel notes, acks and restores messages through it (Duet's transport, kombu's
    stock one and the Sentinel one alike), so a message any worker died holding is put
    back by any other, whatever ``DUET_FAST_PATHS`` says on either machine.

    kombu notes a delivered message with two writes (ZADD of its tag to the unacked index,
    HSET of the message under its tag) and removes it with two (ZREM, HDEL): four commands
    a task. Here the message itself is the member of one sorted set (``unacked_index`` +
    :data:`UNACKED_SUFFIX`; JSON of the message as popped, the anonymous exchange and the
    queue it came from (:func:`popped_member`): unique per delivery, as the message
    carries its delivery tag), scored by when it was delivered. The messages of one pop
    are noted before any of them is handed to the consumer: by the pop itself while a
    backlog lasts (``lua/pop_note.lua``, :meth:`noted_by_pop`), else by one ZADD after the ``BLMPOP``
    (:meth:`note`); one ZREM removes up to :data:`ACK_BATCH` acks. An ack frees the
    consumer's credit at once; its ZREM waits for the next note (in the same round trip
    or script), the wait after an empty pop, the channel's close or a full batch
    (:meth:`flush_acks`). A worker that dies in between leaves acked messages noted: they
    come back after the visibility timeout, as a message of a task that was running
    would, and Duet's tasks find their step done or their transition made. On kombu's
    stock channels (no pop notes) each delivered message is noted by one ZADD
    (:meth:`append`) and each ack removed at once (:attr:`ack_batch` 1).
    The restore of messages unacknowledged past the visibility timeout reads the members
    older than it and puts each back on its queue in a transaction (WATCH, ZREM, push), as
    kombu's does. Messages noted the kombu way (by a worker of an earlier Duet during a
    rolling upgrade) are still restored and acked the kombu way.
    """

    #: Acks gathered before one ZREM removes them (:meth:`ack`): 1 (at once) on a channel
    #: that does not flush them itself; :class:`Channel`'s pops and close do.
    ack_batch = 1

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        #: delivery tag -> the member noting it (until acked, rejected or restored)
        self._members: dict[str, str] = {}
        #: delivery tag -> its member, noted by :meth:`note` and not yet appended
        self._noted: dict[str, str] = {}
        #: members of acked messages still to remove from the set (:meth:`flush_acks`)
        self._acked: list[str] = []
        self._acked_lock = threading.Lock()

    @property
    def unacked_messages_key(self) -> str:
        return f"{self.channel.unacked_index_key}{UNACKED_SUFFIX}"

    def append(self, message: Any, delivery_tag: str) -> None:
        """Note a delivered message as unacknowledged, waiting out a Redis that is full.

        The consumer has already popped the message from its queue; it is noted here, in
        the worker's event loop, where an error is fatal (the worker exits, "Unrecoverable
        error", and the message is lost). Redis refuses the write while at ``maxmemory``
        (OOM) or in another outage (``MISCONF``, ``READONLY`` ...): wait, with backoff,
        until it takes it again. Nothing else can be consumed meanwhile anyway.
        """
        member = self._noted.pop(delivery_tag, None)
        if member is None:
            member = _member(message._raw)
            self._write_waiting_out_oom(delivery_tag, {member: time.time()})
        self._members[delivery_tag] = member
        virtual.QoS.append(self, message, delivery_tag)  # type: ignore[no-untyped-call]

    def note(self, payloads: list[dict[str, Any]], members: list[str]) -> None:
        """Note messages just popped as unacknowledged, in one write, before any is
        delivered (:meth:`append` then finds them noted); ``members`` are theirs
        (:func:`popped_member`). The acks gathered since the last write go in the same
        round trip (their ZREM first)."""
        now = time.time()
        noted = {
            p["properties"]["delivery_tag"]: member
            for p, member in zip(payloads, members, strict=True)
        }
        acked = self.take_acks()
        try:
            self._write_waiting_out_oom(
                next(iter(noted)), dict.fromkeys(noted.values(), now), acked
            )
        except self.channel.connection_errors:
            self.give_back_acks(acked)  # removed again with the next write if they were
            # Popped but not noted: run them anyway (a worker that dies now loses them,
            # as kombu's transport would lose the one message it popped).
            log.warning(
                "delivering %d message(s) not noted as unacknowledged: Redis "
                "went away after the pop",
                len(noted),
                exc_info=True,
            )
        self._noted.update(noted)

    def noted_by_pop(self, payloads: list[dict[str, Any]], members: list[str]) -> None:
        """Keep the members ``lua/pop_note.lua`` noted popped messages with, for
        :meth:`append` to find."""
        for payload, member in zip(payloads, members, strict=True):
            self._noted[payload["properties"]["delivery_tag"]] = member

    def forget_noted(self, payloads: list[dict[str, Any]]) -> None:
        """Drop what :meth:`note` kept of messages that will not be delivered."""
        for payload in payloads:
            self._noted.pop(payload["properties"]["delivery_tag"], None)

    def _write_waiting_out_oom(
        self, delivery_tag: str, members: dict[str, float], acked: list[str] | None = None
    ) -> None:
        """ZADD ``members`` (after a ZREM of ``acked``, in the same round trip), waiting
        with backoff while Redis refuses the ZADD in an outage (OOM, MISCONF ...)."""
        attempt, waited, warned = 0, 0.0, 0.0
        key = self.unacked_messages_key
        while True:
            try:
                with self.channel.conn_or_acquire() as client:
                    if acked:
                        pipe = client.pipeline(transaction=False)
                        pipe.zrem(key, *acked)
                        pipe.zadd(key, members)
                        removed, added = pipe.execute(raise_on_error=False)
                        if not isinstance(removed, Exception):
                            acked = None  # a ZREM is never refused for memory
                        for reply in (removed, added):
                            if isinstance(reply, Exception):
                                raise reply
                    else:
                        client.zadd(key, members)
                break
            except OUTAGE_ERRORS as exc:
                if waited - warned >= OOM_WARN_EVERY_S or not waited:
                    warned = waited
                    log.warning(
                        "Redis refuses writes (%s): holding delivered message %s until "
                        "it accepts them (%.0fs so far)",
                        connection.first_line(exc),
                        delivery_tag,
                        waited,
                    )
                delay = OUTAGE.delay(attempt)
                time.sleep(delay)
                waited += delay
                attempt += 1
        if waited:
            log.warning("Redis accepts writes again after %.1fs", waited)

    def ack(self, delivery_tag: str) -> None:
        """Free the message's credit now; remove it from the set with the next batch."""
        member = self._members.pop(delivery_tag, None)
        if member is None:  # noted the kombu way
            super().ack(delivery_tag)  # type: ignore[no-untyped-call]
            return
        with self._acked_lock:
            self._acked.append(member)
            full = len(self._acked) >= self.ack_batch
        virtual.QoS.ack(self, delivery_tag)  # type: ignore[no-untyped-call]
        if full:
            self.flush_acks()

    def flush_acks(self) -> None:
        """Remove the acked messages still in the unacked set, in one command. On an
        error they are kept for the next flush (the caller sees the error)."""
        acked = self.take_acks()
        if not acked:
            return
        try:
            with self.channel.conn_or_acquire() as client:
                client.zrem(self.unacked_messages_key, *acked)
        except BaseException:
            self.give_back_acks(acked)
            raise

    def take_acks(self) -> list[str]:
        """The members of the acked messages gathered so far, to remove now (the caller
        gives them back with :meth:`give_back_acks` if it could not)."""
        with self._acked_lock:
            acked, self._acked = self._acked, []
        return acked

    def give_back_acks(self, acked: list[str]) -> None:
        with self._acked_lock:
            self._acked[:0] = acked

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        if delivery_tag not in self._members:
            super().reject(delivery_tag, requeue=requeue)  # type: ignore[no-untyped-call]
            return
        if requeue:
            self.restore_by_tag(delivery_tag, leftmost=True)
        else:
            member = self._members.pop(delivery_tag)
            with self.channel.conn_or_acquire() as client:
                client.zrem(self.unacked_messages_key, member)
        virtual.QoS.ack(self, delivery_tag)  # type: ignore[no-untyped-call]

    def restore_by_tag(self, tag: str, client: Any = None, leftmost: bool = False) -> None:
        member = self._members.pop(tag, None)
        if member is None:
            super().restore_by_tag(tag, client, leftmost)  # type: ignore[no-untyped-call]
            return
        with self.channel.conn_or_acquire(client) as conn:
            self._restore_member(conn, member, leftmost)

    def restore_visible(self, start: int = 0, num: int | None = 10, interval: int = 10) -> None:
        """Put back on their queues the messages unacknowledged for longer than the
        visibility timeout (their worker died): kombu's scan, then this one's.

        A Redis at ``maxmemory`` (or in another outage) refuses the scan's lock (and the
        pushes): the scan is skipped and runs again on the next cycle. (kombu lets the
        error out, and at a worker's start or reconnect, when it scans first, that ends
        the worker.)
        """
        try:
            self._restore_visible(start, num, interval)
        except OUTAGE_ERRORS as exc:
            log.warning(
                "Redis refuses writes (%s): messages past the visibility timeout "
                "are put back on their queues on a later scan",
                connection.first_line(exc),
            )

    def _restore_visible(self, start: int, num: int | None, interval: int) -> None:
        count = self._vrestore_count  # kombu's throttle: scan every ``interval`` calls
        super().restore_visible(start, num, interval)  # type: ignore[no-untyped-call]
        if count % (interval or 1):
            return
        with self.channel.conn_or_acquire() as client:
            ceil = time.time() - self.visibility_timeout
            try:
                with kombu_redis.Mutex(
                    client, f"{self.unacked_mutex_key}{UNACKED_SUFFIX}", self.unacked_mutex_expire
                ):
                    old = client.zrange(
                        self.unacked_messages_key,
                        ceil,
                        0,
                        desc=True,
                        byscore=True,
                        offset=num and start,
                        num=num,
                    )
                    for member in old or []:
                        self._restore_member(client, member, leftmost=False)
            except kombu_redis.MutexHeld:
                pass

    @contextmanager
    def pipe_or_acquire(self, pipe: Any = None, client: Any = None) -> Iterator[Any]:
        """kombu's bookkeeping of messages noted its way, in plain (non-MULTI) pipelines:
        the only other reader, the restore, watches the unacked hash and skips a tag
        without a message. Restores keep their own transaction (they pass their pipeline)."""
        if pipe:
            yield pipe
        else:
            with self.channel.conn_or_acquire(client) as conn:
                yield conn.pipeline(transaction=False)

    def restore_member(self, client: Any, member: Any) -> None:
        """Put one noted message back at the front of its queue (its worker died)."""
        self._restore_member(client, member, leftmost=True)

    def _restore_member(self, client: Any, member: Any, leftmost: bool) -> None:
        """Put one noted message back on its queue, unless it is gone (acked or restored
        by another), in one transaction."""
        key = self.unacked_messages_key

        def restore(pipe: Any) -> None:
            # ZSCORE is not among the commands kombu's client prefixes.
            there = pipe.zscore(self.channel.global_keyprefix + key, member) is not None
            pipe.multi()
            if there:
                pipe.zrem(key, member)
                try:
                    raw, exchange, routing_key = loads(bytes_to_str(member))  # type: ignore[no-untyped-call]
                except ValueError as exc:  # a text no worker took, left by a dead one
                    text, _, queue = _text(member)[1:-1].rsplit(", ", 2)
                    deadletters.add(pipe, json.loads(queue), text, f"not JSON: {exc}")
                    return
                self.channel._do_restore_message(raw, exchange, routing_key, pipe, leftmost)

        client.transaction(restore, key)


def restore_delivered(channel: Any, tags: Collection[str]) -> set[str]:
    """Put back on their queues the unacknowledged messages with delivery ``tags`` (a dead
    worker held them), at the front, whoever noted them; the tags put back. Reads the
    whole unacknowledged set once (a death is rare)."""
    qos = channel.qos
    if not tags or not isinstance(qos, QoS):
        return set()
    wanted, back = set(tags), set()
    with channel.conn_or_acquire() as client:
        for member in client.zrange(qos.unacked_messages_key, 0, -1):
            try:
                raw = loads(bytes_to_str(member))[0]  # type: ignore[no-untyped-call]
                tag = raw["properties"]["delivery_tag"]
            except (ValueError, LookupError, TypeError):
                continue  # no worker can take it: the visibility timeout's restore dead-letters it
            if tag in wanted:
                qos.restore_member(client, member)
                back.add(tag)
    return back


def restore_orphans(channel: Any, held: Collection[str], before: float) -> set[str]:
    """Put back on their queues the unacknowledged messages delivered before ``before``
    (epoch seconds) whose tags are not in ``held`` (what every live worker notes it
    holds): a dead worker took them after its last note. The tags put back."""
    qos = channel.qos
    if not isinstance(qos, QoS):
        return set()
    keep, back = set(held), set()
    with channel.conn_or_acquire() as client:
        for member in client.zrange(qos.unacked_messages_key, "-inf", before, byscore=True):
            try:
                raw = loads(bytes_to_str(member))[0]  # type: ignore[no-untyped-call]
                tag = raw["properties"]["delivery_tag"]
            except (ValueError, LookupError, TypeError):
                continue  # no worker can take it: the visibility timeout's restore dead-letters it
            if tag not in keep:
                qos.restore_member(client, member)
                back.add(tag)
    return back


class BatchingQoS(QoS):
    """:class:`QoS` for :class:`Channel`, whose pops carry the acks gathered meanwhile."""

    ack_batch = ACK_BATCH


class LostConnectionGuard:
    """Mixed into a kombu Redis channel (Duet's, and the Sentinel one): its pool, or a
    connection error once its broker connection is gone (see :meth:`_get_pool`)."""

    connection: Any

    def _get_pool(self, asynchronous: bool = False) -> Any:
        """kombu's pool for this channel, or a connection error once the channel's broker
        connection is gone.

        kombu rebuilds a channel's pool from its transport's connection details whenever
        the channel needs one, also while closing (to put unacknowledged messages back) and
        to ack. Celery's consumer, on a lost connection, first *collects* it, which drops
        the transport's connection details (``Transport.client``), then closes it, which
        closes the default channel again: if the channel's first close failed (its BRPOP
        read met the dead socket) and another channel's close failed too (a fanout queue
        it deletes on close), the channel is still open then, and kombu's rebuild fails
        with ``'NoneType' object has no attribute 'hostname'``, which no one catches: the
        worker exits. The same happens to a task finishing later that acks on that channel.
        A connection error is what those callers expect: the close is ignored, the consumer
        reconnects, the ack is logged as failed (the message comes back after the
        visibility timeout, and steps are idempotent).
        """
        # A channel closed meanwhile has no connection at all (a publish on it, say a
        # task's retry mid-restart, met ``'NoneType' ... 'client'`` and Celery acked the
        # message away as unpublishable).
        if self.connection is None or self.connection.client is None:
            raise redis.exceptions.ConnectionError(
                "this broker channel's connection is closed (the consumer reconnects)"
            )
        return super()._get_pool(asynchronous=asynchronous)  # type: ignore[misc]  # a mixin: the channel has it


class Channel(LostConnectionGuard, kombu_redis.Channel):
    """A kombu Redis channel that reuses its synchronous client and takes up to
    :data:`POP_MAX` messages a pop."""

    QoS = BatchingQoS
    _duet_client: Any = None
    #: Queues consumed without acks (their messages are not noted as unacknowledged).
    _no_ack_queues: frozenset[str] = frozenset()
    #: The last pop brought messages to note: the acks gathered meanwhile go with the
    #: next note (else the next pop flushes them first).
    _acks_go_with_note: bool = False
    #: The last pop brought as many messages to note as it asked for (the queue may hold
    #: more): the next pop is ``lua/pop_note.lua`` (see :meth:`_brpop_start`).
    _pop_noting: bool = False
    #: How many messages the pop in flight asked for.
    _pop_count: int = 0
    #: Pauses in a row while Redis refuses pops (an outage; :data:`OUTAGE` backoff), and
    #: when the last warning of it was logged (``time.monotonic``).
    _outage_pauses: int = 0
    _outage_warned: float = float("-inf")
    #: The script pop in flight: the acks it removes and the queue of each key it pops.
    _popping: tuple[list[str], list[str]] | None = None

    def basic_consume(self, queue: str, no_ack: bool, *args: Any, **kwargs: Any) -> Any:
        if no_ack:
            self._no_ack_queues = self._no_ack_queues | {queue}
        else:
            self._no_ack_queues = self._no_ack_queues - {queue}
        return super().basic_consume(queue, no_ack, *args, **kwargs)  # type: ignore[no-untyped-call]

    def _brpop_start(self, timeout: float | None = None) -> None:
        """kombu's pop of the next message, as one command taking up to the consumer's
        credit (at most :data:`POP_MAX`): under load one command brings several messages,
        each still from the first non-empty queue in kombu's fair, priority-ordered cycle.

        A pop that brought all it asked for to note leaves a backlog behind, likely: the
        next is ``lua/pop_note.lua``, which pops and notes in one step (no round trip of
        its own for the note, and no moment when a message is popped and not noted) and
        removes the acks gathered since the last write first. Otherwise (and when the
        script finds every queue empty, or Redis refuses it) the pop is a ``BLMPOP`` that
        waits for a message, its messages noted with the acks in the next write
        (:meth:`QoS.note`): a script pop that finds nothing costs more commands than it
        saves. Before that wait, acks still gathered are flushed (:meth:`QoS.flush_acks`),
        so an idle worker's acks are written within the pop's timeout (1 s)."""
        noting = self._pop_noting and self._qos is not None
        if self._qos is not None and not noting and not self._acks_go_with_note:
            try:
                self._qos.flush_acks()
            except self.connection_errors:  # kept for the next flush; the pop will tell
                log.debug("acks not flushed before a pop", exc_info=True)
        queues = self._queue_cycle.consume(len(self.active_queues))
        if not queues:
            return
        # Sent on the connection itself, so with kombu's ``global_keyprefix`` added here
        # (kombu's client adds it to the commands it knows, not to these).
        prefix = self.global_keyprefix
        pairs = [
            (prefix + self._q_for_pri(queue, pri), queue)  # type: ignore[no-untyped-call]
            for pri in self.priority_steps
            for queue in queues
        ]
        keys = [key for key, _ in pairs]
        credit = self.qos.can_consume_max_estimate()
        count = self._pop_count = max(1, min(POP_MAX, POP_MAX if credit is None else credit))
        self._in_poll = self.client.connection
        # kombu's half-open BRPOP check (maybe_check_brpop_health) reads when it went out.
        self._brpop_sent_at = time.monotonic()  # type: ignore[assignment]
        if self._popping is not None:  # a script pop whose reply was never read
            self.qos.give_back_acks(self._popping[0])  # removed again if they were
            self._popping = None
        if noting and self._no_ack_queues.isdisjoint(queues):
            acked = self.qos.take_acks()
            self._popping = (acked, [queue for _, queue in pairs])
            try:
                self.client.connection.send_command(
                    "EVALSHA",
                    self._pop_note.sha,
                    1 + len(keys),
                    prefix + self.qos.unacked_messages_key,
                    *keys,
                    count,
                    time.time(),
                    len(acked),
                    *acked,
                    *(_json_string(queue) for _, queue in pairs),
                )
            except BaseException:
                self._popping = None
                self.qos.give_back_acks(acked)
                raise
            return
        wait = self.brpop_timeout if timeout is None else timeout
        self.client.connection.send_command(
            "BLMPOP", wait or 0, len(keys), *keys, "RIGHT", "COUNT", count
        )

    @cached_property
    def _pop_note(self) -> Any:
        return scripts.register(self.client, "pop_note")

    def _brpop_read(self, **options: Any) -> bool:
        """Read the pop's reply: the messages of a ``BLMPOP`` are noted as unacknowledged
        in one write (those of ``lua/pop_note.lua`` already are), then each is delivered
        (kombu's read, for several messages). A text no worker can take (not JSON, no
        Celery envelope) is dead-lettered instead (:meth:`_dead_letter`), the others
        delivered."""
        popping, self._popping = self._popping, None
        try:
            command = "BLMPOP" if popping is None else "EVALSHA"
            try:
                reply = self.client.parse_response(self.client.connection, command, **options)
            except OUTAGE_ERRORS as exc:  # nothing was popped: wait, as for a write
                if popping is not None:
                    self._pop_refused(exc, popping[0])
                self._outage_pause(exc)
                raise kombu_redis.Empty() from None
            except self.connection_errors:
                if popping is not None:  # removed again with the next write if they were
                    self.qos.give_back_acks(popping[0])
                # Disconnect, so the next turn of the loop reconnects (as kombu does).
                self.client.connection.disconnect()
                raise
            except redis.exceptions.ResponseError as exc:
                if popping is None:
                    raise
                self._pop_refused(exc, popping[0])
                raise kombu_redis.Empty() from None
            self._outage_pauses = 0
            if not reply:
                self._pop_noting = self._acks_go_with_note = False
                raise kombu_redis.Empty()
            if popping is None:
                dest, items = reply
                dest = bytes_to_str(dest)[len(self.global_keyprefix) :]  # type: ignore[no-untyped-call]
                queue = dest.rsplit(self.sep, 1)[0]
            else:
                place, items = reply
                queue = popping[1][int(place) - 1]
            self._queue_cycle.rotate(queue)
            texts = [_text(item) for item in items]
            examined = [_examine(text) for text in texts]
            self._acks_go_with_note = queue not in self._no_ack_queues
            self._pop_noting = self._acks_go_with_note and len(items) >= self._pop_count
            if any(problem for _, problem in examined):
                texts = self._dead_letter(queue, texts, examined, noted=popping is not None)
                if not texts:
                    self._acks_go_with_note = False  # the next pop flushes them
                    raise kombu_redis.Empty()
            payloads = [payload for payload, _ in examined if payload is not None]
            if self._acks_go_with_note:
                members = [popped_member(text, queue) for text in texts]
                if popping is not None:
                    self.qos.noted_by_pop(payloads, members)
                else:
                    self.qos.note(payloads, members)
            for n, payload in enumerate(payloads):
                try:
                    self.connection._deliver(payload, queue)
                except BaseException:
                    # The rest stay noted in Redis (restored after the visibility timeout).
                    self.qos.forget_noted(payloads[n + 1 :])
                    raise
            return True
        finally:
            self._in_poll = None  # type: ignore[assignment]
            self._flush_brpop_reauth()  # type: ignore[no-untyped-call]

    def _dead_letter(
        self, queue: str, texts: list[str], examined: list[tuple[Any, str | None]], noted: bool
    ) -> list[str]:
        """Move the texts no worker can take to the dead-letter stream, with the reason
        (and out of the unacknowledged set, if the pop noted them), in one round trip;
        the texts left to deliver. A Redis that refuses the move (at ``maxmemory``) or is
        gone drops them, with a log line for each: they could never be delivered anyway."""
        bad = [
            (text, problem) for text, (_, problem) in zip(texts, examined, strict=True) if problem
        ]
        replies: list[Any] = []
        try:
            with self.conn_or_acquire() as client:
                pipe = client.pipeline(transaction=False)
                for text, problem in bad:
                    # XADD is not among the commands kombu's client prefixes: the stream
                    # is Duet's own key (``duet:dead``), as the CLI reads it.
                    deadletters.add(pipe, queue, text.removeprefix(_NOT_UTF8), str(problem))
                if noted and queue not in self._no_ack_queues:
                    pipe.zrem(
                        self.qos.unacked_messages_key,
                        *(popped_member(text, queue) for text, _ in bad),
                    )
                replies = pipe.execute(raise_on_error=False)
        except self.connection_errors as exc:  # the others are delivered all the same
            replies = [exc] * len(bad)
        # The text is untrusted (anyone can push to a queue): the log names the letter,
        # and ``duet dead show`` shows it.
        for (text, problem), reply in zip(bad, replies, strict=False):
            if isinstance(reply, BaseException):
                log.error(
                    "dropped a message from queue %r that no worker can take (%s, "
                    "%d characters): it could not be dead-lettered: %s",
                    queue,
                    problem,
                    len(text),
                    reply,
                )
            else:
                log.error(
                    "dead-lettered a message from queue %r (%s): duet dead show %s",
                    queue,
                    problem,
                    _text(reply),
                )
        return [text for text, (_, problem) in zip(texts, examined, strict=True) if not problem]

    def _get(self, queue: str, timeout: Any = None) -> Any:
        """kombu's pop of one message (``basic_get``), a text no worker can take
        dead-lettered as by :meth:`_brpop_read` (kombu's read raises, and the message
        is gone)."""
        try:
            payload: Any = super()._get(queue)  # type: ignore[no-untyped-call]
        except ValueError as exc:  # JSONDecodeError: kombu's read of the text failed
            text = str(getattr(exc, "doc", ""))  # (bytes not UTF-8 are replaced by then)
            self._dead_letter(queue, [text], [_examine(text)], noted=False)
            raise kombu_redis.Empty() from None
        problem = envelope_problem(payload)
        if problem:
            text = str(dumps(payload))  # type: ignore[no-untyped-call]
            self._dead_letter(queue, [text], [(None, problem)], noted=False)
            raise kombu_redis.Empty()
        return payload

    def _pop_refused(self, exc: redis.exceptions.RedisError, acked: list[str]) -> None:
        """``lua/pop_note.lua`` was refused (nothing was popped): the next pop is a
        ``BLMPOP``, whose note waits out a Redis at ``maxmemory``; a script the server
        does not know (restarted, flushed) is loaded for the pop after it."""
        self.qos.give_back_acks(acked)
        self._pop_noting = False
        if isinstance(exc, redis.exceptions.NoScriptError):
            self.client.script_load(self._pop_note.script)
        elif not isinstance(exc, OUTAGE_ERRORS):
            log.warning(
                "the broker refused a pop with its note (%s): popping the plain "
                "way until the next messages come",
                exc,
            )

    def _outage_pause(self, exc: BaseException) -> None:
        """A pop refused in an outage (``MISCONF``, ``READONLY`` ...): wait a little,
        with backoff, before the next (the event loop has nothing else to do), and warn
        at most every :data:`OOM_WARN_EVERY_S`."""
        now = time.monotonic()
        delay = OUTAGE.delay(self._outage_pauses)
        self._outage_pauses += 1
        if now - self._outage_warned >= OOM_WARN_EVERY_S:
            self._outage_warned = now
            log.warning(
                "Redis refuses pops (%s): waiting until it takes writes again",
                connection.first_line(exc),
            )
        time.sleep(delay)

    def close(self) -> None:
        """Flush the acks still gathered, then close as kombu does (which puts back the
        messages delivered and not acked)."""
        if self._qos is not None and not self.closed:
            try:
                self._qos.flush_acks()
            except self.connection_errors as exc:  # back after the visibility timeout
                log.warning(
                    "could not remove acked messages from the unacked set on close: %s",
                    connection.first_line(exc),
                )
        super().close()  # type: ignore[no-untyped-call]

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
    """kombu's Redis transport with :class:`Channel`; an outage reply (``MISCONF``,
    ``READONLY`` ...) is a connection error, which Celery's consumer reconnects on and
    kombu's callers retry, not a channel error."""

    Channel = Channel
    connection_errors = (*kombu_redis.Transport.connection_errors, *OUTAGE_ERRORS)


class StockChannel(kombu_redis.Channel):
    """kombu's stock Redis channel, noting unacknowledged messages in Duet's format
    (:class:`QoS`), so workers on either transport restore each other's."""

    QoS = QoS


class StockTransport(kombu_redis.Transport):
    """kombu's stock Redis transport, unchanged but for its documented
    ``connection_errors``: an outage reply (``READONLY``, ``MISCONF`` ...) is one, so
    Celery logs a failed ack and its consumer reconnects, instead of ending the worker
    ("Unrecoverable error: ReadOnlyError", found with ``DUET_FAST_PATHS=off``); so is a
    popped text that is not JSON (or not UTF-8), which kombu's read raises in the event
    loop: the consumer reconnects past it (it is gone, the error logged), as kombu's
    read already does for JSON without ``properties`` (a ``KeyError``). Dead-lettering
    needs Duet's read (:class:`Channel`). Its channel is :class:`StockChannel`: kombu's,
    its unacknowledged messages in Duet's format."""

    Channel = StockChannel
    connection_errors = (*Transport.connection_errors, json.JSONDecodeError, UnicodeDecodeError)


class SentinelChannel(LostConnectionGuard, kombu_redis.SentinelChannel):
    """kombu's Sentinel channel, a lost connection's close a connection error (which
    ended a worker after a primary was killed: kombu's rebuild of the closed channel's
    pool, ``'NoneType' object has no attribute 'hostname'``); unacknowledged messages
    in Duet's format, as :class:`StockChannel`'s."""

    QoS = QoS


class SentinelTransport(kombu_redis.SentinelTransport):
    """kombu's stock Sentinel transport with :class:`SentinelChannel`, its
    ``connection_errors`` extended as :class:`StockTransport`'s: the old primary's
    ``READONLY`` after a failover is one, so the consumer reconnects (to the new primary)
    instead of ending the worker."""

    Channel = SentinelChannel
    connection_errors = (
        *kombu_redis.SentinelTransport.connection_errors,
        *StockTransport.connection_errors,
    )


class Connection(kombu.Connection):
    """kombu's connection, writing :data:`TRANSPORT` as ``redis`` in its URL and info.

    ``resolve_aliases`` is kombu's table of transport names shown under another name
    (``pyamqp`` is shown as ``amqp``); it changes only how the connection is described
    (``as_uri``, ``info``), never which transport it uses.
    """

    resolve_aliases = {
        **kombu.Connection.resolve_aliases,
        TRANSPORT: "redis",
        STOCK_TRANSPORT: "redis",
        SENTINEL_TRANSPORT: "sentinel",
    }


def broker_config(broker_url: str | None, settings: Settings) -> dict[str, Any]:
    """The Celery settings every process that talks to the broker shares (workers and
    clients): where it is, which transport, JSON only, routes, the visibility timeout."""
    login: SentinelURL | None = None
    if sentinel.is_sentinel(broker_url):  # login, database and TLS where kombu reads them
        login = sentinel.parse(str(broker_url))
        broker_url = login.canonical()
    socket = connection.socket_options(broker_url, settings)
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
            # Every broker key (queues, kombu's unacked and binding keys) under Duet's
            # prefix: another app's keys in the same database are never read or popped.
            # Set on Redis whichever transport runs (Duet's or kombu's stock one), so the
            # processes of one deployment agree on key names whatever their kombu release.
            **({"global_keyprefix": keys.BROKER_PREFIX} if is_redis(broker_url) else {}),
            # The primary's name, for a Sentinel URL (kombu's and Flower's option), and
            # how the sentinels are asked: their own password, TLS, the timeouts (kombu's
            # option; given, it replaces redis-py's default of the socket options).
            **(
                {
                    "master_name": settings.redis_sentinel_master,
                    "sentinel_kwargs": sentinel.sentinel_kwargs(login, **socket),
                }
                if login is not None
                else {}
            ),
            # A dead or frozen broker is an error in seconds, then a reconnect; not a hang.
            **socket,
        },
        "broker_connection_timeout": settings.redis_connect_timeout_s,
        # TLS to the primary (kombu's and Flower's, for rediss:// and TLS Sentinel alike).
        # Also for Flower, which reads the queues with a client of its own and takes TLS
        # from here only (the URL kombu writes back out has no query).
        **({"broker_use_ssl": tls} if (tls := tls_options(broker_url)) else {}),
    }


def tls_options(broker_url: str | None) -> dict[str, Any] | None:
    """Celery's ``broker_use_ssl`` for a ``rediss://`` URL (its query's
    :data:`~orchestration.state.tlsquery.TLS_QUERY` arguments, the certificate required
    unless it says otherwise) or a TLS Sentinel URL's primary; None for another URL."""
    if sentinel.is_sentinel(broker_url):
        tls = sentinel.parse(str(broker_url)).tls
        return None if tls is None else tlsquery.client_kwargs(tls)
    if not broker_url or broker_url.split("://", 1)[0] != "rediss":
        return None
    query = parse_qs(urlsplit(broker_url).query)
    options = {name: query[name][-1] for name in tlsquery.TLS_QUERY if name in query}
    options.setdefault("ssl_cert_reqs", "required")
    return tlsquery.client_kwargs(options)


def visibility_timeout_of(settings: Settings) -> int | None:
    """Seconds the broker leaves a message unacknowledged before handing it to another
    worker: ``DUET_VISIBILITY_TIMEOUT_S`` on a Redis broker (the embedded one included);
    None for a broker without one (AMQP), or when ``DUET_CHECK_TIMEOUTS`` is off."""
    if not settings.check_timeouts:
        return None
    url = settings.broker_url or settings.redis_url or "redis://"
    return settings.visibility_timeout_s if is_redis(url) else None


def transport_for(broker_url: str | None) -> str | None:
    """Our transport for ``redis://`` / ``rediss://`` brokers while the ``transport`` fast
    path is on, else kombu's stock one (:data:`STOCK_TRANSPORT`); kombu's Sentinel one for
    ``sentinel://`` (:data:`SENTINEL_TRANSPORT`); None for another broker (kombu's choice)."""
    if sentinel.is_sentinel(broker_url):
        return SENTINEL_TRANSPORT
    if not is_redis(broker_url):
        return None
    return TRANSPORT if fastpaths.enabled("transport") else STOCK_TRANSPORT


def is_redis(broker_url: object) -> bool:
    """Whether ``broker_url`` names a Redis broker (over TCP, TLS or Sentinel)."""
    return connection.is_redis_url(broker_url)
