"""Duet's customisations of Celery: the consumer's event flush (a fast path), the
broker connections' name, the redacted task events, and the app's pools.

The consumer override leans on names Celery does not document; it runs only while the
``consumer`` fast path is on (:mod:`orchestration.state.fastpaths`), else Celery's stock
consumer does (:func:`consumer`). The redacting request is always used: it keeps secrets
out of task events and calls only Celery's ``send_event``.
"""

from __future__ import annotations

import math
import time
from typing import Any

from celery.app.amqp import AMQP as CeleryAMQP
from celery.worker import consumer as celery_consumer
from celery.worker.request import Request as CeleryRequest

from orchestration.state import fastpaths
from orchestration.state.broker import Connection
from workers.secrets import may_hold_secret, redact

#: Shortest interval between two publishes of buffered task events (seconds).
EVENTS_FLUSH_INTERVAL_S = 0.05
#: Task events a worker buffers before a task's thread publishes them itself (Celery: 24,
#: which at ~200 tasks/s is a publish every ~40 ms besides the loop's timed ones).
EVENTS_BUFFER_LIMIT = 256


class Consumer(celery_consumer.Consumer):
    """Celery's consumer, publishing buffered task events at most every 50 ms on the event
    loop's timer (Celery: a publish and a loop wake-up per task); Flower needs them no
    sooner, as each event keeps the time it happened."""

    _events_flushed_at = -math.inf
    #: When the put-off flush is due (monotonic s), or None. A timer lost with the hub
    #: (a broker reconnect resets it) is ignored once it is a second overdue.
    _events_flush_due: float | None = None

    def _flush_pending(self, now: float) -> bool:
        due = self._events_flush_due
        return due is not None and now < due + 1.0

    def on_send_event_buffered(self) -> None:
        dispatcher = self.event_dispatcher
        if dispatcher is not None and dispatcher.buffer_limit < EVENTS_BUFFER_LIMIT:
            dispatcher.buffer_limit = EVENTS_BUFFER_LIMIT  # the timed flush publishes them
        if not self._flush_pending(time.monotonic()):  # else the put-off flush takes it
            super().on_send_event_buffered()

    def _flush_events(self) -> None:
        now = time.monotonic()
        hub = self.hub
        if hub is not None:
            if self._flush_pending(now):
                return
            wait = self._events_flushed_at + EVENTS_FLUSH_INTERVAL_S - now
            if wait > 0:
                self._events_flush_due = now + wait
                hub.call_later(wait, self._flush_events_now)
                return
        self._events_flush_due = None
        self._events_flushed_at = now
        super()._flush_events()

    def _flush_events_now(self) -> None:
        self._events_flush_due = None
        self._flush_events()


class AMQP(CeleryAMQP):
    """Celery's messaging setup, with connections that name Duet's transports ``redis``
    in their URL (so Flower shows the Broker page and queue lengths)."""

    Connection = Connection


class Waiting(Exception):
    """Raised through ``task.retry(exc=...)`` for a task re-scheduled to wait, not after a
    failure: its ``task-retried`` event goes out without a traceback (see :class:`Request`)."""


class Request(CeleryRequest):
    """Celery's task request, sending task events with secrets redacted, and a wait's
    retry (:class:`Waiting`) without a traceback: Flower shows it RETRY with what it
    waits for, not as an error.

    A task's exception and traceback go out in ``task-retried`` / ``task-failed`` events
    (to Flower, and through the broker); a traceback may show an exception chain the task
    never meant to publish. Every text field of every event is redacted — when any may
    hold a secret: the fields are searched once, together (:func:`may_hold_secret`), and
    an event of ids and task names (~7 a model call) goes out as it is.
    """

    def on_retry(self, exc_info: Any) -> None:
        # billiard's ``ExceptionInfo``: ``.exception`` wraps the ``Retry`` (``.exc``), whose
        # ``.exc`` is what the task passed to ``task.retry``.
        signal = getattr(exc_info.exception, "exc", None)
        if isinstance(getattr(signal, "exc", None), Waiting):
            exc_info.traceback = ""
        super().on_retry(exc_info)

    def send_event(self, type: str, **fields: Any) -> None:  # noqa: A002 - Celery's name
        texts = [value for value in fields.values() if isinstance(value, str)]
        if texts and may_hold_secret("\n".join(texts)):
            for name, value in fields.items():
                if isinstance(value, str):
                    fields[name] = redact(value)
        super().send_event(type, **fields)


#: ``Task.Request`` value selecting :class:`Request`.
REQUEST = f"{__name__}:Request"

#: Celery's ``worker_consumer`` value selecting :class:`Consumer`.
CONSUMER = f"{__name__}:Consumer"
#: Celery's default ``worker_consumer``: the stock consumer.
STOCK_CONSUMER = "celery.worker.consumer:Consumer"


def consumer() -> str:
    """The ``worker_consumer`` setting: :class:`Consumer` while the ``consumer`` fast
    path is on, else Celery's own."""
    return CONSUMER if fastpaths.enabled("consumer") else STOCK_CONSUMER


def amqp() -> type[CeleryAMQP]:
    """The app's ``amqp`` class: :class:`AMQP`, whose connections name both of Duet's
    Redis transports (its own, and kombu's stock one it selects when the ``transport``
    fast path is off) ``redis``; only the name they are shown by changes."""
    return AMQP


def forget_pools(app: Any) -> None:
    """Drop ``app``'s broker connection and producer pools (as Celery does after a fork),
    so the next send opens them on the broker the app is configured for now."""
    app._pool = None
    if "amqp" in app.__dict__:
        app.amqp._producer_pool = None
