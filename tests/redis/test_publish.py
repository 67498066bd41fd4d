"""The tasks' own messages (``workers.publish``) are what ``app.send_task`` would send.

On a real Redis: one message sent each way, read back from the queue's list and compared
field by field; the ids each has to make afresh (task id, delivery tag) are compared by
shape and by how they relate (the root of a message sent outside a task is itself).
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery.signals import after_task_publish, before_task_publish

from orchestration.state import keys

pytestmark = pytest.mark.redis


@pytest.fixture
def sending(redis_url: str, redis_client: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The worker app on the test Redis (as broker and run state); yields a function that
    sends one message through Celery's ``send_task`` or the direct push and reads it back."""
    import sys

    import workers.tasks  # noqa: F401 - the tasks registered, as in a worker
    from orchestration.settings import get_settings
    from orchestration.state import connection
    from workers import runtime
    from workers.app import configure

    app_module = sys.modules["workers.app"]  # `workers.app` the attribute is the Celery app
    monkeypatch.setenv("DUET_REDIS_URL", redis_url)
    monkeypatch.delenv("DUET_BROKER_URL", raising=False)
    get_settings.cache_clear()
    connection.use_redis(redis_url)
    configure(redis_url=redis_url)
    if not app_module.direct_push():  # DUET_FAST_PATHS=off, or an untested Celery
        pytest.skip("the publish fast path is off in this environment")

    def send(direct: bool, name: str, args: tuple[str, Any], batch: str | None) -> dict[str, Any]:
        monkeypatch.setattr(app_module, "_direct_push", direct)
        runtime.send(name, args, batch)
        from workers import publish

        key = publish.list_key(name, keys.TASK_QUEUES[name])  # a draft's: its priority's list
        raw = redis_client.lpop(key)
        assert raw is not None and redis_client.llen(key) == 0
        return dict(json.loads(raw))

    yield send
    connection.reset()
    get_settings.cache_clear()
    configure()


def _fresh_ids(message: dict[str, Any]) -> dict[str, str]:
    """Pull out the ids a send makes afresh, checking each is a UUID."""
    ids = {
        "id": message["headers"].pop("id"),
        "correlation_id": message["properties"].pop("correlation_id"),
        "delivery_tag": message["properties"].pop("delivery_tag"),
    }
    for value in ids.values():
        uuid.UUID(value)
    return ids


@pytest.mark.parametrize(
    ("name", "args", "batch"),
    [
        (keys.TASK_COORDINATE, ("run-1", 3), "batch-9"),
        (keys.TASK_GENERATE, ("run-1", "r0.generate"), None),
        (keys.TASK_CRITIQUE, ("run-2", "r1.critique"), "b"),
        (keys.TASK_REFINE, ("run-2", "r1.refine"), None),
    ],
)
def test_the_same_message_as_send_task(
    sending: Any, name: str, args: tuple[str, Any], batch: str | None
) -> None:
    celery, direct = sending(False, name, args, batch), sending(True, name, args, batch)
    ids_celery, ids_direct = _fresh_ids(celery), _fresh_ids(direct)
    for ids, message in ((ids_celery, celery), (ids_direct, direct)):
        assert ids["correlation_id"] == ids["id"]
        assert message["headers"].pop("root_id") == ids["id"]  # sent outside any task
    assert ids_direct["id"] != ids_celery["id"]
    assert direct == celery
    assert base64.b64decode(direct["body"]) == base64.b64decode(celery["body"])
    assert direct["properties"]["delivery_info"]["routing_key"] == keys.TASK_QUEUES[name]
    assert (direct["headers"].get("duet_batch")) == batch


@pytest.mark.parametrize(
    "signal",
    [before_task_publish, after_task_publish],
    ids=["before_task_publish", "after_task_publish"],
)
def test_a_publish_signal_receiver_gets_every_send(sending: Any, signal: Any) -> None:
    """The direct push sends no signals: while a receiver is connected, sends go through
    ``send_task``, which does (and the message still reaches the queue)."""
    seen: list[Any] = []

    def receiver(**kwargs: Any) -> None:
        seen.append(kwargs.get("headers") or kwargs.get("sender"))

    signal.connect(receiver)
    try:
        message = sending(True, keys.TASK_COORDINATE, ("run-1", 3), None)
    finally:
        signal.disconnect(receiver)
    assert len(seen) == 1
    assert message["headers"]["task"] == keys.TASK_COORDINATE


def test_sent_from_a_task_it_names_its_parent_and_root(sending: Any) -> None:
    """A message sent while a worker runs a task has that task as parent and its root as
    root, as Celery's ``send_task`` gives it (Flower's task tree)."""
    from celery._state import _task_stack

    from workers.tasks import coordinate

    coordinate.push_request(id="parent-task", root_id="root-task", called_directly=False)
    _task_stack.push(coordinate)
    try:
        messages = [
            sending(d, keys.TASK_CRITIQUE, ("run-3", "r1.critique"), None) for d in (False, True)
        ]
    finally:
        _task_stack.pop()
        coordinate.pop_request()
    for message in messages:
        _fresh_ids(message)
        assert message["headers"]["parent_id"] == "parent-task"
        assert message["headers"]["root_id"] == "root-task"
    assert messages[0] == messages[1]


def test_the_text_is_what_json_dumps_writes_and_escapes_what_it_carries() -> None:
    """The message is written from parts: it must read back to the same text json.dumps
    writes (keys, order, separators), with quotes, non-ASCII and line separators in ids
    and headers escaped; its two ids are version-4 UUIDs, different each time."""
    from workers import publish
    from workers.app import app

    odd = 'run "1"\u00e9\u2028\\'
    queue, text = publish.message(app, keys.TASK_COORDINATE, (odd, 3), {"duet_batch": odd})
    assert queue == keys.TASK_QUEUES[keys.TASK_COORDINATE]
    message = json.loads(text)
    assert json.dumps(message) == text
    assert text.isascii()
    assert message["headers"]["duet_batch"] == odd
    assert json.loads(base64.b64decode(message["body"]))[0] == [odd, 3]
    assert message["headers"]["argsrepr"] == repr((odd, 3))
    ids = [message["headers"]["id"], message["properties"]["delivery_tag"]]
    assert all(uuid.UUID(i).version == 4 and str(uuid.UUID(i)) == i for i in ids)
    again = json.loads(publish.message(app, keys.TASK_COORDINATE, (odd, 3))[1])
    assert {again["headers"]["id"], again["properties"]["delivery_tag"]}.isdisjoint(ids)


def test_a_header_of_celerys_own_is_refused() -> None:
    from workers import publish
    from workers.app import app

    with pytest.raises(ValueError, match="'task'"):
        publish.message(app, keys.TASK_COORDINATE, ("run-1", 1), {"task": "duet.other"})
