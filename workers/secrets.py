"""Which values are secrets in this worker process, and text cleaned of them.

The secrets are the values of the API-key variables: ``OPENAI_API_KEY``,
``ANTHROPIC_API_KEY``, every key-shaped variable of the environment (``*_API_KEY``,
``*_TOKEN``, ``*_SECRET``: :data:`KEY_NAME`, from the first use on) and every variable a
spec names with ``api_key_env`` (the stored specs' at worker start, a new spec's when its
adapter is made, before its first call). :func:`redact` removes each value,
whatever it looks like, plus anything shaped like a key or an auth header
(:func:`scrub`). Everything a task lets out — run errors, events, Celery's task events
(exception and traceback) and the worker's log — passes through it. Model output passes
through :func:`scrub_output` (key values only) before anything of it is stored.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Iterable

#: Key variables every worker treats as secret, named by a spec or not.
DEFAULT_KEY_VARIABLES = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")
#: Names of environment variables whose values are secrets, named by a spec or not.
KEY_NAME = re.compile(r"(?i)(?:^|_)(?:API_KEY|TOKEN|SECRET)$")
#: Values shorter than this are not searched for (a placeholder such as "x" would
#: otherwise be cut out of every message); real keys are far longer.
MIN_SECRET_CHARS = 6

_SECRET_PATTERNS = (
    # OpenAI (sk-..., sk-proj-...) and Anthropic (sk-ant-...) style keys.
    (re.compile(r"sk-[A-Za-z0-9_\-*.]{6,}"), "sk-[REDACTED]"),
    (re.compile(r"(?i)\bbearer\s+[^\s,;\"']+"), "Bearer [REDACTED]"),
    (
        re.compile(
            r"(?i)\b(authorization|x-api-key|api[-_]?key|access[-_]?token)(\"?\s*[:=]\s*\"?)([^\s,;\"'}]+)"
        ),
        r"\1\2[REDACTED]",
    ),
)


#: Matches wherever any of :data:`_SECRET_PATTERNS` could (each needs one of these words,
#: "sk-" in any case is looser than the pattern): text without it needs no pattern run.
_PATTERN_HINT = re.compile(r"(?i)sk-|bearer|authorization|x-api-key|api[-_]?key|access[-_]?token")


def scrub(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` with every known secret value, key-looking token and auth header removed."""
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(secret, "[REDACTED]")
    for pattern, replacement in _SECRET_PATTERNS:
        text = pattern.sub(replacement, text)
    return text


_lock = threading.Lock()
_variables: set[str] = set(DEFAULT_KEY_VARIABLES)
_environment_scanned = False


def scan_environment() -> None:
    """Treat every key-shaped variable of the environment (:data:`KEY_NAME`) as a key
    variable (done on the first :func:`key_values`; again for variables set since)."""
    global _environment_scanned
    names = [name for name in list(os.environ) if KEY_NAME.search(name)]
    with _lock:
        _variables.update(names)
        _environment_scanned = True


def register_key_variable(name: str | None) -> None:
    """Treat the value of environment variable ``name`` as a secret from now on."""
    if name:
        with _lock:
            _variables.add(name)


def key_values() -> list[str]:
    """The current values of every key variable (long enough to search for)."""
    if not _environment_scanned:
        scan_environment()
    with _lock:
        names = list(_variables)
    values = {os.environ.get(name) or "" for name in names}
    return [v for v in values if len(v) >= MIN_SECRET_CHARS]


def scrub_output(text: str) -> str:
    """Model output without any key value: each configured key's value, whatever it looks
    like, becomes ``[REDACTED]``. Nothing else is touched (unlike :func:`redact`, no
    key-shaped pattern: a review may quote ``Bearer`` or ``api_key=`` in the code it
    discusses). On every answer, so cheap: a substring search per key value."""
    for secret in sorted(key_values(), key=len, reverse=True):  # a key inside another: last
        if secret in text:
            text = text.replace(secret, "[REDACTED]")
    return text


def may_hold_secret(text: str, values: Iterable[str] | None = None) -> bool:
    """Whether :func:`redact` could change ``text``: it holds a key value (of ``values``,
    by default :func:`key_values`) or a word a key-shaped pattern needs. One search, no
    substitution: what the hot paths ask first."""
    if _PATTERN_HINT.search(text):
        return True
    return any(value in text for value in (key_values() if values is None else values))


def redact(text: str) -> str:
    """``text`` without any key value, key-shaped token or auth header (given back as it
    is when it may hold none: :func:`may_hold_secret`)."""
    values = key_values()
    if not may_hold_secret(text, values):
        return text
    return scrub(text, values)


class RedactingFilter(logging.Filter):
    """A log filter that redacts each record's message and traceback before it is written."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        record.msg, record.args = redact(message), None
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


def redact_logs(logger: logging.Logger) -> None:
    """Add a :class:`RedactingFilter` to each of ``logger``'s handlers (once)."""
    for handler in logger.handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())


def redact_process_logs() -> None:
    """Redact every log handler of this process: each logger's, and Python's last-resort
    handler (what prints warnings when nothing else is set up, as in ``duet run``)."""
    loggers = [logging.getLogger()] + [
        found for found in logging.Logger.manager.loggerDict.values()
        if isinstance(found, logging.Logger)
    ]  # fmt: skip
    for logger in loggers:
        redact_logs(logger)
    last = logging.lastResort
    if last is not None and not any(isinstance(f, RedactingFilter) for f in last.filters):
        last.addFilter(RedactingFilter())
