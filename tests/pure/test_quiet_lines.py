"""A worker's per-task and per-call INFO lines are off by default (``DUET_LOG_TASKS``)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from workers.logs import TASK_LINE_LOGGERS, quiet_task_lines


@pytest.fixture
def levels() -> Iterator[None]:
    names = ("", *TASK_LINE_LOGGERS)  # the root logger too
    saved = {name: logging.getLogger(name).level for name in names}
    yield
    for name, level in saved.items():
        logging.getLogger(name).setLevel(level)


@pytest.mark.parametrize(
    "logger",
    [
        "celery.app.trace",  # Task ... succeeded
        "celery.worker.strategy",  # Task ... received
        "httpx2",  # HTTP Request: POST ... "HTTP/1.1 200 OK", the vendor SDKs' client
    ],
)
def test_info_lines_off_warnings_kept(levels: None, logger: str) -> None:
    logging.getLogger().setLevel(logging.INFO)
    quiet_task_lines()
    assert not logging.getLogger(logger).isEnabledFor(logging.INFO)
    assert logging.getLogger(logger).isEnabledFor(logging.WARNING)
