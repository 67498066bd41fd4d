"""How Duet's processes log: plain text or one JSON object per line (``--log-format json``,
``DUET_LOG_FORMAT=json``), each carrying the ids of what it is about, and Celery's
per-task INFO lines off unless asked for (``DUET_LOG_TASKS=1``).

Ids on a JSON line: ``task_id``, ``run_id`` and ``step_key`` (or ``seq`` for the
coordinator) from the task the line was logged in, ``batch_id`` from the message's
``duet_batch`` header; a logging call's ``extra={"run_id": ...}`` wins. They are looked up
only when a line is written, so a task that logs nothing pays nothing.

Celery logs "Task ... received" and "Task ... succeeded" at INFO for every task: measured
at 0.6-1.1 ms of CPU per model call (two tasks, two lines each). Those two loggers are set
to WARNING before the worker builds its task strategies (which check the level once).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

from celery import current_task

#: Message header carrying a run's batch id (set by the coordinator, forwarded by steps).
BATCH_HEADER = "duet_batch"
#: Celery's loggers of the per-task "received" / "succeeded" INFO lines.
TASK_LINE_LOGGERS = ("celery.app.trace", "celery.worker.strategy")
#: Ids a JSON line carries when they apply, in this order.
ID_FIELDS = ("run_id", "batch_id", "step_key", "seq", "task_id")


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


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, ids, exception."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        ids = task_ids()
        for name in ID_FIELDS:
            value = getattr(record, name, None)
            if value is None:
                value = ids.get(name)
            if value is not None:
                doc[name] = value
        # exc_text first: a filter may have redacted it (workers.secrets).
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            doc["exception"] = record.exc_text
        return json.dumps(doc, default=str, ensure_ascii=False)


def use_json(logger: logging.Logger) -> None:
    """Give every handler of ``logger`` the JSON formatter."""
    for handler in logger.handlers:
        handler.setFormatter(JsonFormatter())


def quiet_task_lines() -> None:
    """Turn off Celery's per-task INFO lines (warnings and errors still log)."""
    for name in TASK_LINE_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


#: The loggers of Duet's own code, which the CLI's JSON mode takes over.
OWN_LOGGERS = ("duet", "orchestration", "workers")


class _CliHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """JSON lines on the stderr of the moment (a test runner swaps it per command)."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(JsonFormatter())

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _: Any) -> None:
        pass


def setup_cli(log_format: str) -> None:
    """The CLI's logging. ``json``: Duet's own loggers write JSON lines (INFO and up) on
    stderr; ``text``: logging is left as Python sets it up (warnings on stderr)."""
    for name in OWN_LOGGERS:
        logger = logging.getLogger(name)
        for handler in [h for h in logger.handlers if isinstance(h, _CliHandler)]:
            logger.removeHandler(handler)
        if log_format == "json":
            logger.addHandler(_CliHandler())
            logger.setLevel(logging.INFO)
            logger.propagate = False
        else:
            logger.setLevel(logging.NOTSET)
            logger.propagate = True
