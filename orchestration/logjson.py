"""Log lines as JSON, one object per line with the ids of what it is about, shared by the
workers and the ``duet`` command line (no Celery here); and which characters a terminal
acts on (:data:`TERMINAL_UNSAFE`) and how they are escaped, in text and in JSON lines.
"""

from __future__ import annotations

import json
import logging
import re
import time
from typing import Any

#: Ids a JSON line carries when they apply, in this order.
ID_FIELDS = ("run_id", "batch_id", "step_key", "seq", "task_id")
#: Characters above ASCII a terminal acts on instead of showing: DEL, the C1 controls
#: (8-bit CSI ``\x9b``, OSC ``\x9d``...) and the bidi overrides that reorder a line.
_ACTED_ON_ABOVE_ASCII = "\x7f-\x9f\u202a-\u202e\u2066-\u2069"
#: Every character a terminal acts on but newline and tab: the C0 controls too. Text for
#: a terminal escapes these (``duet.commands.support.clean``); JSON escapes the C0 ones itself.
TERMINAL_UNSAFE = "\x00-\x08\x0b-\x1f" + _ACTED_ON_ABOVE_ASCII
#: What ``json.dumps(ensure_ascii=False)`` leaves raw that a terminal acts on, the Unicode
#: line separators (which end a line for some readers) and lone surrogates (which no
#: UTF-8 file can hold: a broken escape in a vendor's JSON).
_RAW_IN_JSON = re.compile(f"[{_ACTED_ON_ABOVE_ASCII}\u2028\u2029\ud800-\udfff]")


_UNSAFE = re.compile(f"[{TERMINAL_UNSAFE}]")


def escape_unsafe(text: str) -> str:
    """``text`` as a terminal shows it as is: each character it would act on becomes a
    visible escape (``\\x1b``, ``\\x9b``, ``\\u202e``). Newlines and tabs are kept."""
    return _UNSAFE.sub(_visible, text)


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


class TerminalSafeFilter(logging.Filter):
    """A log filter for text lines: the message and traceback of each record with
    :func:`escape_unsafe` applied (a vendor's error or an id quoted in a line is shown,
    never obeyed). JSON lines need none: :func:`json_line` escapes them."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        record.msg, record.args = escape_unsafe(record.getMessage()), None
        if record.exc_text:
            record.exc_text = escape_unsafe(record.exc_text)
        return True


def json_line(value: Any, **options: Any) -> str:
    """``value`` as one line of JSON, other languages' text kept as is but every
    character a terminal acts on escaped (``\\u009b``): parsed, it is the same value;
    printed, it is only shown. ``options`` go to :func:`json.dumps`."""
    text = json.dumps(value, ensure_ascii=False, **options)
    return _RAW_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


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
        return json_line(doc, default=str)
