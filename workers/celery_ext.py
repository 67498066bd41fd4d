"""Every customisation of Celery that leans on its private names, and the version check.

Duet overrides a few methods Celery does not document (the consumer's event flush, the
app's connection pools) and swaps the class of its broker connections. They are tested with the Celery release pinned in
``pyproject.toml``; another release may rename them silently, so :func:`check_versions`
refuses to start a worker or client on an untested Celery (or kombu: its Redis transport
is customised in :mod:`orchestration.state.broker`, which the client uses too and which
checks its own kombu) with a message saying what to install.
"""

from __future__ import annotations

import math
import time
from typing import Any

from celery import Celery
from celery.app.amqp import AMQP as CeleryAMQP
from celery.worker import consumer as celery_consumer
from celery.worker.request import Request as CeleryRequest

from orchestration.state import broker
from orchestration.state.broker import Connection, check_release
from workers.secrets import may_hold_secret, redact

#: The Celery releases the overrides below are tested with (pyproject.toml pins the same).
CELERY_TESTED = ">=5.7,<5.8"

#: Shortest interval between two publishes of buffered task events (seconds).
EVENTS_FLUSH_INTERVAL_S = 0.05
#: Task events a worker buffers before a task's thread publishes them itself (Celery: 24,
#: which at ~200 tasks/s is a publish every ~40 ms besides the loop's timed ones).
EVENTS_BUFFER_LIMIT = 256


def check_versions() -> None:
    """Refuse to run on a Celery or kombu release the overrides were not tested with.

    Raises:
        ConfigError: naming the package, the installed release, the tested range and the
            private name that is missing, if any.
    """
    import celery

    check_release("celery", celery.__version__, CELERY_TESTED, _missing_celery_names())
    broker.check_versions()


def _missing_celery_names() -> list[str]:
    needed = [
        (celery_consumer.Consumer, "_flush_events"),
        (celery_consumer.Consumer, "on_send_event_buffered"),
        (Celery, "_pool"),
        (CeleryAMQP, "_producer_pool"),
        (CeleryAMQP, "Connection"),
        (CeleryRequest, "send_event"),
    ]
    return [
        f"{cls.__module__}.{cls.__name__}.{name}" for cls, name in needed if not hasattr(cls, name)
    ]


class Consumer(celery_consumer.Consumer):
    """Celery's consumer, publishing buffered task events at most every 50 ms.

    Celery buffers task events (received / started / succeeded) and publishes them as
    one message on the next turn of the event loop, waking the loop from the pool thread
    to do so: about one publish and one wake-up per task. Flower does not need them
    sooner than every 50 ms (each event keeps the time it happened), so here a flush
    that comes sooner is put off until then, on the loop's own timer, and events sent
    meanwhile join it without waking the loop. A task's thread publishes the buffer itself
    only once it holds :data:`EVENTS_BUFFER_LIMIT` events (Celery's 24 would add a publish
    from a pool thread every ~8 tasks under load).
    """

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
    """Celery's messaging setup, with connections that name Duet's transport ``redis``
    in their URL (so Flower shows the Broker page and queue lengths)."""

    Connection = Connection


class Request(CeleryRequest):
    """Celery's task request, sending task events with secrets redacted.

    A task's exception and traceback go out in ``task-retried`` / ``task-failed`` events
    (to Flower, and through the broker); a traceback may show an exception chain the task
    never meant to publish. Every text field of every event is redacted — when any may
    hold a secret: the fields are searched once, together (:func:`may_hold_secret`), and
    an event of ids and task names (~7 a model call) goes out as it is.
    """

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


def forget_pools(app: Any) -> None:
    """Drop ``app``'s broker connection and producer pools (as Celery does after a fork),
    so the next send opens them on the broker the app is configured for now."""
    app._pool = None
    if "amqp" in app.__dict__:
        app.amqp._producer_pool = None
