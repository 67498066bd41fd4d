"""The broker's ack bookkeeping on a real server (``orchestration.state.broker.QoS``): a
delivered message is one member of one sorted set until acked; one whose consumer went
away without acking is put back on its queue once the visibility timeout has passed; a
message noted the kombu way (an earlier worker's) is still restored."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import kombu
import pytest
import redis
from kombu.utils.json import dumps

from orchestration.state.broker import TRANSPORT, UNACKED_SUFFIX

MESSAGES = f"unacked_index{UNACKED_SUFFIX}"


@pytest.fixture
def url(redis_client: Any, redis_url: str) -> Iterator[str]:
    yield redis_url
    with redis.Redis.from_url(redis_url) as client:
        client.delete(MESSAGES, "unacked", "unacked_index")


@pytest.fixture
def client(url: str) -> Iterator[Any]:
    with redis.Redis.from_url(url) as plain:
        yield plain


def _connection(url: str, visibility_s: int = 3600) -> kombu.Connection:
    return kombu.Connection(
        url, transport=TRANSPORT, transport_options={"visibility_timeout": visibility_s}
    )


def _publish(conn: kombu.Connection, queue: kombu.Queue, body: str) -> None:
    with conn.Producer() as producer:
        producer.publish(body, routing_key=queue.name, declare=[queue], serializer="json")


def _take(conn: kombu.Connection, queue: kombu.Queue) -> kombu.Message:
    message = conn.default_channel.basic_get(queue.name, no_ack=False)
    assert message is not None
    return message


def test_one_write_to_note_a_delivery_and_one_to_ack_it(url: str, client: Any) -> None:
    queue = kombu.Queue(f"q-{uuid.uuid4().hex[:8]}")
    with _connection(url) as conn:
        _publish(conn, queue, "hello")
        before = int(client.info("stats")["total_commands_processed"])
        message = _take(conn, queue)
        noted = int(client.info("stats")["total_commands_processed"])
        message.ack()
        acked = int(client.info("stats")["total_commands_processed"])
        # INFO itself is one command: the pop and the note; the ack.
        assert (noted - before - 1, acked - noted - 1) == (2, 1)
        assert client.zcard(MESSAGES) == 0 and client.hlen("unacked") == 0


def test_a_message_left_unacked_past_the_visibility_timeout_is_restored(
    url: str, client: Any
) -> None:
    queue = kombu.Queue(f"q-{uuid.uuid4().hex[:8]}")
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


def test_a_message_noted_the_kombu_way_is_still_restored(url: str, client: Any) -> None:
    queue = kombu.Queue(f"q-{uuid.uuid4().hex[:8]}")
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
