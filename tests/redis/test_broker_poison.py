"""Poison messages and key prefixes on the broker (``orchestration.state.broker``), on a
real server: a popped text that is not JSON or lacks Celery's envelope is moved to the
dead-letter stream with its reason, the rest of its pop is delivered; with kombu's
``global_keyprefix`` every key the channel reads or writes is under the prefix."""

from __future__ import annotations

import time
import uuid
from typing import Any

import kombu
import pytest

from orchestration.state import deadletters, keys
from orchestration.state.broker import TRANSPORT, UNACKED_SUFFIX

#: Not JSON; JSON without ``properties``; without a delivery tag; a body not base64.
POISON = [
    "not json {",
    '{"body": "e30=", "headers": {}}',
    '{"body": "", "properties": {"delivery_info": {}}}',
    '{"body": "abc", "properties": {"delivery_tag": "t", "body_encoding": "base64", '
    '"delivery_info": {"exchange": "", "routing_key": "q"}}}',
]
REASONS = [
    "not JSON",
    "no 'properties' object",
    "no 'properties.delivery_tag'",
    "'body' is not base64",
]


def _connection(url: str, prefix: str, visibility_s: int = 3600) -> kombu.Connection:
    options: dict[str, Any] = {"visibility_timeout": visibility_s}
    if prefix:
        options["global_keyprefix"] = prefix
    return kombu.Connection(url, transport=TRANSPORT, transport_options=options)


def _consume(conn: kombu.Connection, queue: kombu.Queue, prefetch: int) -> list[kombu.Message]:
    got: list[kombu.Message] = []
    consumer = conn.Consumer([queue], callbacks=[lambda _body, m: got.append(m)], accept=["json"])
    consumer.qos(prefetch_count=prefetch)
    consumer.consume()
    return got


def _publish(conn: kombu.Connection, queue: kombu.Queue, body: str) -> None:
    with conn.Producer() as producer:
        producer.publish(body, routing_key=queue.name, declare=[queue], serializer="json")


@pytest.mark.parametrize("prefix", ["", "duet."], ids=["no-prefix", "prefix"])
@pytest.mark.parametrize("pops", [1, 2], ids=["plain-pop", "script-pop"])
def test_poison_is_dead_lettered_and_the_rest_of_its_pop_delivered(
    redis_client: Any, redis_url: str, prefix: str, pops: int
) -> None:
    queue = kombu.Queue(f"q-{uuid.uuid4().hex[:8]}")
    unacked = f"{prefix}unacked_index{UNACKED_SUFFIX}"
    with _connection(redis_url, prefix) as conn:
        # One pop takes the whole credit; with two, the first takes that many good
        # messages (a full pop: the next is the script). The poison sits in the last pop,
        # between good messages.
        credit = 2 + len(POISON)
        for k in range(credit if pops == 2 else 0):
            _publish(conn, queue, f"warm{k}")
        _publish(conn, queue, "a")
        for text in POISON:
            redis_client.lpush(prefix + queue.name, text)
        _publish(conn, queue, "b")
        got = _consume(conn, queue, prefetch=credit)
        for _ in range(pops):
            acked = len(got)
            conn.drain_events(timeout=5)
            for m in got[acked:]:
                m.ack()
        assert [m.payload for m in got][-2:] == ["a", "b"] and len(got) == 2 + pops // 2 * credit
        letters = deadletters.newest(redis_client)
        assert [d.text for d in letters] == POISON[::-1]
        assert [d.queue for d in letters] == [queue.name] * len(POISON)
        for letter, reason in zip(letters[::-1], REASONS, strict=True):
            assert letter.reason.startswith(reason), letter.reason
        conn.default_channel.qos.flush_acks()
        assert redis_client.zcard(unacked) == 0  # no poison left noted, to be restored
        assert redis_client.llen(prefix + queue.name) == 0


def test_a_pop_of_poison_only_delivers_nothing_and_keeps_the_worker(
    redis_client: Any, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    queue = kombu.Queue(f"q-{uuid.uuid4().hex[:8]}")
    with _connection(redis_url, "duet.") as conn:
        _publish(conn, queue, "first")
        got = _consume(conn, queue, prefetch=2)
        conn.drain_events(timeout=5)
        redis_client.lpush("duet." + queue.name, "junk", "[1, 2]", b"\xff\xfe")
        with pytest.raises(TimeoutError):
            conn.drain_events(timeout=1.5)
        _publish(conn, queue, "after")
        conn.drain_events(timeout=5)
        assert [m.payload for m in got] == ["first", "after"]
    letters = deadletters.newest(redis_client)
    assert [(d.text, d.reason.split(":")[0]) for d in letters][::-1] == [
        ("junk", "not JSON"),
        ("[1, 2]", "not a JSON object but a list"),
        ("\\xff\\xfe", "not UTF-8 text"),
    ]
    # The log names each letter, not its (untrusted) text.
    assert [f"duet dead show {d.id}" in caplog.text for d in letters] == [True] * 3
    assert "junk" not in caplog.text


def test_a_prefixed_channel_touches_no_key_outside_its_prefix(
    redis_client: Any, redis_url: str
) -> None:
    """Foreign keys named as the queue and as kombu's own keys stay as they were; a
    message past the visibility timeout is restored onto the prefixed queue."""
    name = f"q-{uuid.uuid4().hex[:8]}"
    queue = kombu.Queue(name)
    redis_client.rpush(name, "theirs")
    redis_client.set("unacked_index", "theirs")
    redis_client.hset("unacked", "tag", "theirs")
    foreign = {k: redis_client.dump(k) for k in (name, "unacked_index", "unacked")}
    with _connection(redis_url, "duet.") as conn:
        _publish(conn, queue, "lost")
        got = _consume(conn, queue, prefetch=1)
        conn.drain_events(timeout=5)
        assert [m.payload for m in got] == ["lost"]
        conn.default_channel.qos._delivered.clear()  # the consumer dies, nothing acked
        conn.default_channel.qos._members.clear()
    unacked = f"duet.unacked_index{UNACKED_SUFFIX}"
    assert redis_client.zcard(unacked) == 1
    [member] = redis_client.zrange(unacked, 0, -1)
    redis_client.zadd(unacked, {member: time.time() - 10})
    with _connection(redis_url, "duet.", visibility_s=1) as conn:
        conn.default_channel.qos.restore_visible(num=None, interval=1)
    assert redis_client.zcard(unacked) == 0 and redis_client.llen("duet." + name) == 1
    assert {k: redis_client.dump(k) for k in foreign} == foreign


def test_a_poison_member_left_by_a_dead_worker_is_dead_lettered_on_restore(
    redis_client: Any, redis_url: str
) -> None:
    unacked = f"duet.unacked_index{UNACKED_SUFFIX}"
    redis_client.zadd(unacked, {'[not json {, "", "actor"]': time.time() - 10})
    with _connection(redis_url, "duet.", visibility_s=1) as conn:
        conn.default_channel.qos.restore_visible(num=None, interval=1)
    assert redis_client.zcard(unacked) == 0
    [letter] = deadletters.newest(redis_client)
    assert (letter.queue, letter.text) == ("actor", "not json {")
    assert letter.reason.startswith("not JSON")


def test_duet_queues_are_under_the_key_prefix() -> None:
    assert keys.queue_key(keys.QUEUE_ACTOR) == f"{keys.PREFIX}.actor"


def test_a_direct_get_dead_letters_poison_too(redis_client: Any, redis_url: str) -> None:
    """kombu's one-message read (``basic_get``): each poison text is dead-lettered and the
    read finds nothing, instead of raising; a good message is read as before."""
    queue = kombu.Queue(f"q-{uuid.uuid4().hex[:8]}")
    with _connection(redis_url, "duet.") as conn:
        _publish(conn, queue, "good")
        for text in POISON[:2]:
            redis_client.rpush("duet." + queue.name, text)
        redis_client.rpush("duet." + queue.name, b"\xff\xfe not utf-8")
        channel = conn.default_channel
        assert [channel.basic_get(queue.name) for _ in range(3)] == [None, None, None]
        got = channel.basic_get(queue.name)
        assert got is not None and got.payload == "good"
        got.ack()
    reasons = [d.reason for d in deadletters.newest(redis_client)]
    # newest first: the last two of POISON, then the bytes (kombu replaced what is not UTF-8)
    assert [r.split(":")[0] for r in reasons] == ["not JSON", "no 'properties' object", "not JSON"]
