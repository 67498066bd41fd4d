"""Task events leave a worker in batches the event loop's timer publishes: a task's thread
publishes the buffer itself only when it holds ``EVENTS_BUFFER_LIMIT`` events (Celery's
24 would make it publish every ~8 tasks under load)."""

from __future__ import annotations

from typing import Any

import kombu
from celery import Celery

from workers import celery_ext


def _dispatcher_with(consumer: Any) -> tuple[Any, list[int]]:
    app = Celery("events-test", set_as_current=False)
    dispatcher = app.events.Dispatcher(
        kombu.Connection("memory://"),
        hostname="w@h",
        enabled=True,
        buffer_group=["task"],
        on_send_buffered=consumer.on_send_event_buffered,
    )
    consumer.event_dispatcher = dispatcher
    flushed: list[int] = []
    dispatcher.flush = lambda *a, **k: flushed.append(len(dispatcher._group_buffer["task"]))
    return dispatcher, flushed


def _consumer() -> Any:
    consumer = celery_ext.Consumer.__new__(celery_ext.Consumer)
    consumer.hub = None  # no loop: the timed flush is not what this looks at
    return consumer


def test_a_task_thread_does_not_publish_celerys_24_events_itself() -> None:
    dispatcher, flushed = _dispatcher_with(_consumer())
    for n in range(30):
        dispatcher.send("task-succeeded", uuid=f"t{n}", runtime=0.1)
    assert flushed == [], "a pool thread published the events (Celery's limit of 24)"


def test_the_buffer_is_still_bounded() -> None:
    dispatcher, flushed = _dispatcher_with(_consumer())
    for n in range(celery_ext.EVENTS_BUFFER_LIMIT):
        dispatcher.send("task-received", uuid=f"t{n}", name="duet.generate")
    assert flushed == [celery_ext.EVENTS_BUFFER_LIMIT]
