"""How Duet's processes log: text or one JSON object per line with the ids of the run,
batch, step and task it is about; Celery's per-task INFO lines and the HTTP client's
per-request ones off unless ``DUET_LOG_TASKS=1`` (they cost CPU on every call).
"""

from __future__ import annotations

import logging
from typing import Any

import kombu.exceptions
import redis
from celery import current_task

from orchestration.logjson import JsonFormatter as BaseJsonFormatter
from orchestration.logjson import TerminalSafeFilter

#: Message header carrying a run's batch id (set by the coordinator, forwarded by steps).
BATCH_HEADER = "duet_batch"
#: Loggers of per-task and per-call INFO lines: Celery's "received" / "succeeded", and
#: the SDKs' HTTP client's "HTTP Request: POST ... 200 OK" (one per model call).
TASK_LINE_LOGGERS = ("celery.app.trace", "celery.worker.strategy", "httpx2", "httpx")


def task_ids() -> dict[str, Any]:
    """The ids of the task running in this thread (empty outside a task)."""
    task = current_task
    if not task:
        return {}
    request = task.request
    ids: dict[str, Any] = {"task_id": request.id}
    args: list[Any] = list(request.args or ())
    if len(args) == 2:
        ids["run_id"] = args[0]
        ids["seq" if isinstance(args[1], int) else "step_key"] = args[1]
    batch = getattr(request, BATCH_HEADER, None)
    if batch:
        ids["batch_id"] = batch
    return ids


class JsonFormatter(BaseJsonFormatter):
    """JSON lines with the ids of the task running in the thread that logs."""

    def context_ids(self) -> dict[str, Any]:
        return task_ids()


def use_json(logger: logging.Logger) -> None:
    """Give every handler of ``logger`` the JSON formatter."""
    for handler in logger.handlers:
        handler.setFormatter(JsonFormatter())


def use_terminal_safe_text(logger: logging.Logger) -> None:
    """Give every handler of ``logger`` a :class:`TerminalSafeFilter` (once): text lines
    show control characters in messages as escapes."""
    for handler in logger.handlers:
        if not any(isinstance(f, TerminalSafeFilter) for f in handler.filters):
            handler.addFilter(TerminalSafeFilter())


#: What a lost Redis or broker connection raises, as a log record's exception or its cause.
_AWAY = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    kombu.exceptions.OperationalError,
    ConnectionError,
)
#: Celery's messages about a connection being collected or a step being restarted after
#: the broker went away, where its exception is not one of :data:`_AWAY` (the connection
#: object was already dropped: ``'NoneType' object has no attribute ...``).
_RECONNECT_MESSAGES = ("Error on restarting", "Error on stopping")


class ReconnectFilter(logging.Filter):
    """An expected reconnect (Redis restarted, failed over) as one line: a record whose
    exception is a lost connection (or Celery restarting a step meanwhile) keeps its
    message and the exception's first line, without the traceback, at WARNING."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is None or not _expected(exc, str(record.msg)):
            return True
        record.msg = f"{record.getMessage()} [{type(exc).__name__}: {str(exc)[:200]}; reconnecting]"
        record.args = None
        record.exc_info = None
        record.exc_text = None
        if record.levelno > logging.WARNING:
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def _expected(exc: BaseException, message: str) -> bool:
    seen: BaseException | None = exc
    for _ in range(10):  # the exception and its causes
        if seen is None:
            break
        if isinstance(seen, _AWAY):
            return True
        seen = seen.__cause__ or seen.__context__
    return message.startswith(_RECONNECT_MESSAGES) and isinstance(exc, AttributeError)


def quiet_reconnects(logger: logging.Logger) -> None:
    """Give every handler of ``logger`` a :class:`ReconnectFilter` (once)."""
    for handler in logger.handlers:
        if not any(isinstance(f, ReconnectFilter) for f in handler.filters):
            handler.addFilter(ReconnectFilter())


def quiet_task_lines() -> None:
    """Turn off Celery's per-task INFO lines (warnings and errors still log)."""
    for name in TASK_LINE_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
