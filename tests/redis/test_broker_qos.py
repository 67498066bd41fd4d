"""The broker's pop and ack bookkeeping on a real server (``orchestration.state.broker``):
one pop brings up to the consumer's credit; a delivered message is one member of one
sorted set until acked, the messages of one pop noted with one write (under load in the
pop itself, one script) and acks removed in batches (with the next note, before the wait
after an empty pop, on close, or when a batch is full); one
whose consumer went away without acking is put back on its queue once the visibility
timeout has passed; a message noted the kombu way (an earlier worker's) is still
restored."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kombu
import pytest
import redis
from kombu.utils.json import dumps

from bench.harness import monitored
from orchestration.defaults import ACK_BATCH, POP_MAX
from orchestration.state import scripts
from orchestration.state.broker import (
    STOCK_TRANSPORT,
    TRANSPORT,
    UNACKED_SUFFIX,
    restore_delivered,
    restore_orphans,
)
from tests.support import wait_for

MESSAGES = f"unacked_index{UNACKED_SUFFIX}"
#: The commands a consumer sends to pop, note and ack.
BROKER_COMMANDS = {"blmpop", "evalsha", "zadd", "zrem", "script"}


@pytest.fixture
def url(redis_client: Any, redis_url: str) -> Iterator[str]:
    yield redis_url
    with redis.Redis.from_url(redis_url) as client:
        client.delete(MESSAGES, "unacked", "unacked_index")


@pytest.fixture
def client(url: str) -> Iterator[Any]:
    with redis.Redis.from_url(url) as plain:
        yield plain


def _connection(url: str, visibility_s: int = 3600, transport: str = TRANSPORT) -> kombu.Connection:
    return kombu.Connection(
        url, transport=transport, transport_options={"visibility_timeout": visibility_s}
    )


def _queue() -> kombu.Queue:
    return kombu.Queue(f"q-{uuid.uuid4().hex[:8]}")


def _publish_many(conn: kombu.Connection, queue: kombu.Queue, n: int, prefix: str = "m") -> None:
    for k in range(n):
        _publish(conn, queue, f"{prefix}{k}")


def _publish(conn: kombu.Connection, queue: kombu.Queue, body: str) -> None:
    with conn.Producer() as producer:
        producer.publish(body, routing_key=queue.name, declare=[queue], serializer="json")


def _take(conn: kombu.Connection, queue: kombu.Queue) -> kombu.Message:
    message = conn.default_channel.basic_get(queue.name, no_ack=False)
    assert message is not None
    return message


def _commands(client: Any) -> int:
    """Commands the server has run (before this INFO)."""
    return int(client.info("stats")["total_commands_processed"])


def _since(client: Any, before: int) -> int:
    """Commands run since :func:`_commands` returned ``before``, but that INFO."""
    return _commands(client) - before - 1


def test_one_write_to_note_a_delivery_and_one_to_ack_a_batch(url: str, client: Any) -> None:
    queue = _queue()
    with _connection(url) as conn:
        _publish_many(conn, queue, 3, prefix="hello ")
        messages = []
        for _ in range(3):
            before = _commands(client)
            messages.append(_take(conn, queue))
            assert _since(client, before) == 2  # the pop and the note
        assert client.zcard(MESSAGES) == 3
        before = _commands(client)
        for message in messages:
            message.ack()
        # An ack frees the consumer's credit at once; the set is written with the batch.
        assert _since(client, before) == 0 and conn.default_channel.qos.can_consume()
        assert client.zcard(MESSAGES) == 3
        before = _commands(client)
        conn.default_channel.qos.flush_acks()
        assert _since(client, before) == 1
        assert client.zcard(MESSAGES) == 0 and client.hlen("unacked") == 0


def test_a_full_batch_of_acks_is_written_at_once(url: str, client: Any) -> None:
    queue = _queue()
    with _connection(url) as conn:
        _publish_many(conn, queue, ACK_BATCH)
        messages = [_take(conn, queue) for _ in range(ACK_BATCH)]
        for message in messages[:-1]:
            message.ack()
        assert client.zcard(MESSAGES) == ACK_BATCH
        messages[-1].ack()
        assert client.zcard(MESSAGES) == 0


def test_acks_still_gathered_are_written_when_the_channel_closes(url: str, client: Any) -> None:
    queue = _queue()
    with _connection(url) as conn:
        _publish(conn, queue, "bye")
        _take(conn, queue).ack()
        assert client.zcard(MESSAGES) == 1
    assert client.zcard(MESSAGES) == 0 and client.llen(queue.name) == 0


def _consume(
    conn: kombu.Connection,
    queue: kombu.Queue,
    prefetch: int,
    no_ack: bool = False,
) -> tuple[Any, list[kombu.Message]]:
    got: list[kombu.Message] = []
    consumer = conn.Consumer(
        [queue], callbacks=[lambda _body, m: got.append(m)], no_ack=no_ack, accept=["json"]
    )
    consumer.qos(prefetch_count=prefetch)
    consumer.consume()
    return consumer, got


@contextlib.contextmanager
def _consuming(
    url: str, messages: int, prefetch: int, no_ack: bool = False
) -> Iterator[tuple[kombu.Connection, kombu.Queue, list[kombu.Message]]]:
    """A connection to a new queue holding ``messages`` messages, consumed with
    ``prefetch`` credit: the connection, the queue and the messages delivered so far.
    Leaving it closes the connection (delivered messages not acked go back)."""
    queue = _queue()
    with _connection(url) as conn:
        _publish_many(conn, queue, messages)
        consumer, got = _consume(conn, queue, prefetch, no_ack)
        with consumer:
            yield conn, queue, got


def test_one_pop_brings_as_many_messages_as_the_consumer_has_credit_for(
    url: str, client: Any
) -> None:
    with _consuming(url, 10, prefetch=4) as (conn, queue, got):
        before = _commands(client)
        conn.drain_events(timeout=5)
        # One BLMPOP of 4 (the credit), one ZADD noting the 4, nothing else.
        assert [m.payload for m in got] == ["m0", "m1", "m2", "m3"]
        assert _since(client, before) == 2
        assert client.zcard(MESSAGES) == 4 and client.llen(queue.name) == 6
        for m in got:
            m.ack()
        conn.drain_events(timeout=5)  # the next note removes the 4 acks with it
        assert [m.payload for m in got[4:]] == ["m4", "m5", "m6", "m7"]
        assert client.zcard(MESSAGES) == 4
        for m in got[4:]:
            m.ack()
    assert client.zcard(MESSAGES) == 0 and client.llen(queue.name) == 2


def test_under_load_a_pop_and_its_note_are_one_step_with_the_acks(url: str, client: Any) -> None:
    """After a pop that brought all it asked for (a backlog), the next pop is one script
    (lua/pop_note.lua): it removes the acks gathered since the last write, then pops and notes the messages, so
    no message is ever popped and not noted, at one round trip a pop."""
    # Loaded as an earlier pop would have (a new server's first script pop meets NOSCRIPT
    # and loads it for the next, as test_a_pop_the_server_refuses_takes_nothing shows).
    client.script_load(scripts.source("pop_note"))
    with _consuming(url, 4, prefetch=2) as (conn, queue, got):
        conn.drain_events(timeout=5)  # nothing came before: BLMPOP, then the note
        for m in got:
            m.ack()
        with monitored(client) as seen:
            conn.drain_events(timeout=5)
        assert [m.payload for m in got] == ["m0", "m1", "m2", "m3"]
        sent = [cmd for kind, cmd, _ in seen if kind != "lua" and cmd in BROKER_COMMANDS]
        inside = [(cmd, key) for kind, cmd, key in seen if kind == "lua"]
        assert sent == ["evalsha"]
        keys = str(len(conn.default_channel.priority_steps))  # the queue's priority lists
        assert inside == [("zrem", MESSAGES), ("lmpop", keys), ("zadd", MESSAGES)]
        assert client.zcard(MESSAGES) == 2 and client.llen(queue.name) == 0
        noted = {
            json.loads(m)[0]["properties"]["delivery_tag"] for m in client.zrange(MESSAGES, 0, -1)
        }
        assert noted == {m.delivery_tag for m in got[2:]}
        for m in got[2:]:
            m.ack()
        assert client.zcard(MESSAGES) == 2  # gathered, not written yet
        with pytest.raises(TimeoutError):
            conn.drain_events(timeout=2.5)  # the script finds nothing, but removes the acks
        assert client.zcard(MESSAGES) == 0


def test_acks_taken_for_a_script_pop_that_never_went_are_kept(url: str, client: Any) -> None:
    """The acks a script pop was to remove are given back when the pop cannot be sent
    (the broker went away): they go with a later write, not lost in memory (a member left
    in the set would come back as a redelivery after the visibility timeout)."""
    with _consuming(url, 4, prefetch=2) as (conn, _, got):
        conn.drain_events(timeout=5)
        for m in got:
            m.ack()
        channel = conn.default_channel
        sent = channel.client.connection.send_command

        def broken(*args: Any, **kwargs: Any) -> None:
            if args[0] == "EVALSHA":
                raise redis.exceptions.ConnectionError("the broker went away")
            sent(*args, **kwargs)

        channel.client.connection.send_command = broken
        with pytest.raises(redis.exceptions.ConnectionError):
            channel._brpop_start()
        channel.client.connection.send_command = sent
        channel._in_poll = None
        assert len(channel.qos._acked) == 2 and channel._popping is None
        channel.qos.flush_acks()
        assert client.zcard(MESSAGES) == 0


def test_after_an_empty_pop_acks_are_flushed_before_the_wait(url: str, client: Any) -> None:
    """An idle worker's acks are written within the pop's 1 s timeout: the ``BLMPOP`` that
    waits for a message (after a pop that found the queue drained) flushes them first."""
    with _consuming(url, 2, prefetch=3) as (conn, _, got):
        conn.drain_events(timeout=5)
        assert len(got) == 2 and client.zcard(MESSAGES) == 2
        with monitored(client) as seen, pytest.raises(TimeoutError):
            conn.drain_events(timeout=2.5)
        # The pop brought less than it asked for (no backlog): no script pop, which would
        # find nothing; a BLMPOP waits.
        sent = [cmd for kind, cmd, _ in seen if kind != "lua" and cmd in BROKER_COMMANDS]
        assert sent[0] == "blmpop" and "evalsha" not in sent
        for m in got:
            m.ack()
        assert client.zcard(MESSAGES) == 2
        with monitored(client) as seen, pytest.raises(TimeoutError):
            conn.drain_events(timeout=1.5)
        assert client.zcard(MESSAGES) == 0
        sent = [cmd for kind, cmd, _ in seen if kind != "lua" and cmd in BROKER_COMMANDS]
        assert sent[:2] == ["zrem", "blmpop"]


def test_a_pop_the_server_refuses_takes_nothing() -> None:
    """A script pop the server does not know (restarted, flushed: NOSCRIPT) takes nothing
    from the queue: a plain pop follows at once, and the script is loaded again for the
    pop after it. (A server of its own: SCRIPT FLUSH is server-wide.)"""
    from duet.embedded.server import EmbeddedRedis

    with (
        EmbeddedRedis() as server,
        redis.Redis(port=server.port) as client,
        _consuming(server.url, 6, prefetch=2) as (conn, queue, got),
    ):
        conn.drain_events(timeout=5)
        for m in got:
            m.ack()
        client.script_flush()
        with monitored(client) as seen:
            conn.drain_events(timeout=5)
        sent = [cmd for kind, cmd, _ in seen if kind != "lua" and cmd in BROKER_COMMANDS]
        assert sent[0] == "evalsha" and "blmpop" in sent
        assert [m.payload for m in got] == ["m0", "m1", "m2", "m3"]
        assert client.llen(queue.name) == 2 and client.zcard(MESSAGES) == 2
        for m in got[2:]:
            m.ack()
        with monitored(client) as seen:
            conn.drain_events(timeout=5)
        assert [cmd for kind, cmd, _ in seen if kind != "lua" and cmd in BROKER_COMMANDS] == [
            "evalsha"
        ]
        assert [m.payload for m in got] == [f"m{k}" for k in range(6)]
        assert client.llen(queue.name) == 0 and client.zcard(MESSAGES) == 2
        for m in got[4:]:
            m.ack()


def test_a_pop_refused_for_lack_of_memory_takes_nothing() -> None:
    """At ``maxmemory`` Redis refuses the whole script pop (a script with a shebang and no
    ``allow-oom`` flag), so it takes nothing; the plain pop after it holds its messages
    until their note is taken. Nothing is lost."""
    from duet.embedded.server import EmbeddedRedis

    with (
        EmbeddedRedis() as server,
        redis.Redis(port=server.port) as admin,
        _consuming(server.url, 5, prefetch=2) as (conn, queue, got),
    ):
        admin.script_load(scripts.source("pop_note"))  # refused for memory, not NOSCRIPT
        conn.drain_events(timeout=5)
        for m in got:
            m.ack()
        admin.config_set("maxmemory", "1")
        try:
            with ThreadPoolExecutor(1) as pool:
                draining = pool.submit(conn.drain_events, timeout=60)
                # the refused script took nothing; the plain pop took 2 and holds them,
                # their note refused (the acks' ZREM before it went through)
                wait_for(
                    lambda: admin.llen(queue.name) == 1 and admin.zcard(MESSAGES) == 0,
                    30,
                    "the plain pop, its note waiting",
                )
                assert len(got) == 2 and not draining.done()
                admin.config_set("maxmemory", "0")
                draining.result(timeout=30)
        finally:
            admin.config_set("maxmemory", "0")
        assert [m.payload for m in got] == ["m0", "m1", "m2", "m3"]
        assert admin.zcard(MESSAGES) == 2
        for m in got[2:]:
            m.ack()
        conn.drain_events(timeout=5)
        assert [m.payload for m in got] == [f"m{k}" for k in range(5)]
        assert admin.llen(queue.name) == 0 and admin.zcard(MESSAGES) == 1


def test_a_pop_is_capped_and_a_consumer_without_acks_notes_nothing(url: str, client: Any) -> None:
    with _consuming(url, POP_MAX + 3, prefetch=0, no_ack=True) as (conn, queue, got):
        conn.drain_events(timeout=5)
        assert len(got) == POP_MAX and client.zcard(MESSAGES) == 0
        conn.drain_events(timeout=5)
        assert len(got) == POP_MAX + 3 and client.llen(queue.name) == 0


@pytest.mark.parametrize("pops", [1, 2], ids=["plain-pop", "script-pop"])
def test_a_popped_message_is_noted_as_it_was_pushed(url: str, client: Any, pops: int) -> None:
    """The member noting a popped message holds its text as pushed (not encoded again),
    with the anonymous exchange and the queue it came from; a restore puts back that same
    message. The first pop of a consumer is a BLMPOP, the one after it the script."""
    queue = _queue()
    with _connection(url) as conn:
        _publish_many(conn, queue, pops)
        pushed = json.loads(client.lindex(queue.name, 0))  # the last to be popped
        consumer, got = _consume(conn, queue, 1, False)
        with consumer:
            for _ in range(pops):
                conn.drain_events(timeout=5)
                if len(got) < pops:
                    got[-1].ack()
            conn.default_channel.qos.flush_acks()
            [member] = client.zrange(MESSAGES, 0, -1)
            assert json.loads(member) == [pushed, "", queue.name]
            conn.default_channel.qos._delivered.clear()  # the consumer dies, nothing acked
            conn.default_channel.qos._members.clear()
    with _connection(url, visibility_s=1) as conn:
        client.zadd(MESSAGES, {member: time.time() - 5})  # past the visibility timeout
        conn.default_channel.qos.restore_visible(num=None, interval=1)
    assert client.zcard(MESSAGES) == 0
    back = json.loads(client.lindex(queue.name, 0))
    # kombu marks a restored message redelivered; the rest is the message as pushed
    assert back["headers"].pop("redelivered") is True
    assert back["properties"]["delivery_info"].pop("redelivered") is True
    assert back == pushed


def test_messages_delivered_and_never_acked_go_back_on_close(url: str, client: Any) -> None:
    with _consuming(url, 3, prefetch=3) as (conn, queue, got):
        conn.drain_events(timeout=5)
        assert len(got) == 3
        got[0].ack()
    # The acked one is gone; the two delivered and not acked are back on the queue.
    assert client.zcard(MESSAGES) == 0 and client.llen(queue.name) == 2


def test_a_message_left_unacked_past_the_visibility_timeout_is_restored(
    url: str, client: Any
) -> None:
    queue = _queue()
    with _connection(url) as conn:
        _publish(conn, queue, "lost")
        message = _take(conn, queue)
        assert message.payload == "lost"
        # The consumer dies: nothing acks or restores it (a clean close would restore it).
        conn.default_channel.qos._delivered.clear()
        conn.default_channel.qos._members.clear()
    assert client.llen(queue.name) == 0 and client.zcard(MESSAGES) == 1

    with _connection(url, visibility_s=1) as conn:
        qos = conn.default_channel.qos
        qos.restore_visible(num=None, interval=1)  # not yet past the timeout
        assert client.llen(queue.name) == 0
        time.sleep(1.1)
        qos.restore_visible(num=None, interval=1)
        assert client.zcard(MESSAGES) == 0
        again = _take(conn, queue)
        assert again.payload == "lost" and again.delivery_info.get("redelivered", True)
        again.ack()


def test_the_stock_transport_notes_in_the_same_set_and_acks_at_once(url: str, client: Any) -> None:
    queue = _queue()
    with _connection(url, transport=STOCK_TRANSPORT) as conn:
        _publish_many(conn, queue, 2)
        first, second = _take(conn, queue), _take(conn, queue)
        assert client.zcard(MESSAGES) == 2 and client.zcard("unacked_index") == 0
        first.ack()  # no pop of Duet's to carry it: written at once
        assert client.zcard(MESSAGES) == 1
        second.ack()
        assert client.zcard(MESSAGES) == 0 and client.hlen("unacked") == 0


@pytest.mark.parametrize(
    ("died", "restorer"),
    [(TRANSPORT, STOCK_TRANSPORT), (STOCK_TRANSPORT, TRANSPORT)],
    ids=["fast-died", "stock-died"],
)
def test_either_transport_restores_what_the_other_died_holding(
    url: str, client: Any, died: str, restorer: str
) -> None:
    queue = _queue()
    with _connection(url, transport=died) as conn:
        _publish(conn, queue, "held")
        assert _take(conn, queue).payload == "held"
        # The consumer dies: nothing acks or restores it.
        conn.default_channel.qos._delivered.clear()
        conn.default_channel.qos._members.clear()
    assert client.llen(queue.name) == 0 and client.zcard(MESSAGES) == 1

    with _connection(url, visibility_s=1, transport=restorer) as conn:
        time.sleep(1.1)
        conn.default_channel.qos.restore_visible(num=None, interval=1)
        assert client.zcard(MESSAGES) == 0
        again = _take(conn, queue)
        assert again.payload == "held"
        again.ack()


def test_a_message_noted_the_kombu_way_is_still_restored(url: str, client: Any) -> None:
    queue = _queue()
    with _connection(url) as conn:
        _publish(conn, queue, "old")
        raw = client.rpop(queue.name)
        assert raw is not None
    # What kombu's QoS writes for a delivered message: its tag in the index, the message
    # (with exchange and routing key) in the hash.
    payload = kombu.utils.json.loads(raw)
    tag = payload["properties"]["delivery_tag"]
    client.zadd("unacked_index", {tag: time.time() - 10})
    client.hset("unacked", tag, dumps([payload, "", queue.name]))

    with _connection(url, visibility_s=1) as conn:
        conn.default_channel.qos.restore_visible(num=None, interval=1)
        assert client.hlen("unacked") == 0 and client.zcard("unacked_index") == 0
        assert _take(conn, queue).payload == "old"


def test_a_scan_refused_for_lack_of_memory_is_skipped() -> None:
    """A worker scans for messages past the visibility timeout when it connects; a Redis
    at ``maxmemory`` refuses the scan's lock (SET NX), which ended the worker at its start."""
    from duet.embedded.server import EmbeddedRedis

    with (
        EmbeddedRedis() as server,
        redis.Redis(port=server.port) as admin,
        _connection(server.url) as conn,
    ):
        qos = conn.default_channel.qos
        admin.config_set("maxmemory", "1")
        try:
            with pytest.raises(redis.exceptions.OutOfMemoryError):
                admin.set("probe", "x")  # the fault is on
            qos.restore_visible(num=None, interval=1)  # skipped, not raised
        finally:
            admin.config_set("maxmemory", "0")


def test_kombus_half_open_pop_check_drops_a_pop_never_answered(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kombu's ``maybe_check_brpop_health`` drops a pop's connection once its reply is
    overdue (a half-open socket never becomes readable): it needs the time the pop went
    out, which Duet's pop sets as kombu's does."""
    from kombu.transport import redis as kombu_redis

    with _consuming(url, 0, prefetch=4) as (conn, _, _got):
        channel = conn.default_channel
        # As the event loop does: a BLMPOP waiting on the empty queue, no reply yet.
        conn.transport.cycle._register_BRPOP(channel)
        assert channel._brpop_sent_at is not None and channel._in_poll is not None
        sock = channel.client.connection._sock
        assert sock is not None
        now = kombu_redis.monotonic()
        overdue = channel.brpop_timeout + channel.health_check_interval + 1
        monkeypatch.setattr(kombu_redis, "monotonic", lambda: now + overdue)
        conn.transport.cycle.maybe_check_brpop_health()
        assert channel.client.connection._sock is None  # dropped: the loop reconnects
        channel._in_poll = None
        conn.transport.cycle._unregister(channel, channel.client, "BRPOP")


@pytest.mark.parametrize("died", [TRANSPORT, STOCK_TRANSPORT])
def test_a_dead_workers_messages_go_back_by_tag_at_once(url: str, client: Any, died: str) -> None:
    """The healer's restore: the messages a dead worker noted it held (by delivery tag)
    go back to the front of their queues at once, well inside the visibility timeout;
    another worker's are left."""
    queue = _queue()
    with _connection(url, transport=died) as conn:
        _publish(conn, queue, "held")
        _publish(conn, queue, "other's")
        held, other = _take(conn, queue), _take(conn, queue)
        conn.default_channel.qos._delivered.clear()  # the consumer dies
        conn.default_channel.qos._members.clear()
    assert client.llen(queue.name) == 0 and client.zcard(MESSAGES) == 2
    with _connection(url) as conn:
        back = restore_delivered(conn.default_channel, {held.delivery_tag, "gone-tag"})
        assert back == {held.delivery_tag}
        assert client.zcard(MESSAGES) == 1 and client.llen(queue.name) == 1
        again = _take(conn, queue)
        assert again.payload == "held" and again.delivery_tag == held.delivery_tag
        again.ack()
        assert restore_delivered(conn.default_channel, {other.delivery_tag}) == {other.delivery_tag}
        _take(conn, queue).ack()
        conn.default_channel.qos.flush_acks()


def test_messages_no_live_worker_holds_go_back_at_once(url: str, client: Any) -> None:
    """The healer's restore of orphans: a message delivered before the cut-off and held by
    no live worker (a dead one took it after its last note) goes back to its queue; one a
    live worker notes it holds, or delivered after the cut-off, is left."""
    queue = _queue()
    with _connection(url) as conn:
        for body in ("orphan", "held", "late"):
            _publish(conn, queue, body)
        orphan, held = _take(conn, queue), _take(conn, queue)
        cut = time.time()
        late = _take(conn, queue)
        conn.default_channel.qos._delivered.clear()  # the consumer dies
        conn.default_channel.qos._members.clear()
    assert client.llen(queue.name) == 0 and client.zcard(MESSAGES) == 3
    client.zadd(MESSAGES, {m: cut - 1 for m in client.zrange(MESSAGES, 0, -1)}, xx=True)
    late_member = next(m for m in client.zrange(MESSAGES, 0, -1) if late.delivery_tag.encode() in m)
    client.zadd(MESSAGES, {late_member: cut + 1}, xx=True)
    with _connection(url) as conn:
        back = restore_orphans(conn.default_channel, {held.delivery_tag}, cut)
        assert back == {orphan.delivery_tag}
        assert client.zcard(MESSAGES) == 2 and client.llen(queue.name) == 1
        again = _take(conn, queue)
        assert again.payload == "orphan" and again.delivery_tag == orphan.delivery_tag
        again.ack()
        conn.default_channel.qos.flush_acks()
