"""Log lines as JSON: one object per line with the ids of the run, batch, step and task it
is about. Shared by the workers (:mod:`workers.logs` adds the running task's ids) and the
``duet`` command line; no Celery here, so the command line starts without it.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

#: Ids a JSON line carries when they apply, in this order.
ID_FIELDS = ("run_id", "batch_id", "step_key", "seq", "task_id")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, ids, exception.

    Ids come from the logging call's ``extra`` (``run_id=...``), else from
    :meth:`context_ids` (a worker's running task: :mod:`workers.logs`).
    """

    def context_ids(self) -> dict[str, Any]:
        """Ids of what the process is doing now; none here."""
        return {}

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        ids = self.context_ids()
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
