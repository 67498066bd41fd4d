"""Duet's customisations of Celery: the broker connections' name, the redacted task
events, and the app's pools. The redacting request keeps secrets out of task events and
calls only Celery's ``send_event``.
"""

from __future__ import annotations

from typing import Any

from celery.app.amqp import AMQP as CeleryAMQP
from celery.worker.request import Request as CeleryRequest

from orchestration.state.broker import Connection
from workers.secrets import may_hold_secret, redact


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
