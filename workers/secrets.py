"""Which values are secrets in this worker process, and text cleaned of them.

The secrets are the values of the API-key variables: ``OPENAI_API_KEY``,
``ANTHROPIC_API_KEY``, every key-shaped variable of the environment (``*_API_KEY``,
``*_TOKEN``, ``*_SECRET``: :data:`KEY_NAME`, from the first use on) and every variable a
spec names with ``api_key_env`` or in its ``base_url``'s credentials (the stored specs' at
worker start, a new spec's when its adapter is made, before its first call).
:func:`redact` removes each value, whatever it looks like, plus anything shaped like a
key, an auth header (bearer or basic) or a password in a URL (:func:`scrub`). Everything a task lets out — run errors, events, Celery's task events
(exception and traceback) and the worker's log — passes through it. Model output passes
through :func:`scrub_output` (key values only) before anything of it is stored.

A value is found where it is written as it is and where it is only once decoded:
percent-encoded (a URL in a provider's error), as JSON or Python ``\\u`` / ``\\x``
escapes (a critique's JSON), in any mixture. Each character so encoded is replaced in
place (the text around it, a critique's JSON say, keeps its shape); a value hidden
deeper (up to :data:`DECODE_ROUNDS` layers) leaves the text decoded, the value removed.
"""

from __future__ import annotations

import base64
import logging
import os
import re
import threading
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache

#: Key variables every worker treats as secret, named by a spec or not (the fleet key of
#: the cache's integrity tags among them).
DEFAULT_KEY_VARIABLES = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "DUET_FLEET_KEY")
#: Names of environment variables whose values are secrets, named by a spec or not.
KEY_NAME = re.compile(r"(?i)(?:^|_)(?:API_KEY|TOKEN|SECRET)$")
#: Values shorter than this are not searched for (a placeholder such as "x" would
#: otherwise be cut out of every message); real keys are far longer.
MIN_SECRET_CHARS = 6
#: Layers of encoding looked through for a key value (a key percent-encoded in a URL that
#: is itself percent-encoded in a query string: two).
DECODE_ROUNDS = 3
#: A JSON or Python escape of one character: ``\\u0064``, ``\\x64``.
_ESCAPE = re.compile(r"\\u([0-9a-fA-F]{4})|\\x([0-9a-fA-F]{2})")
#: An escape inside a percent-escape (``%25``: ``%``; ``%5C``: a backslash): a value
#: under it is only seen once the text is decoded.
_NESTED = re.compile(r"%25|%5[cC]")
#: Any escape a character of a value may be written as (``_encoded``).
_ANY_ESCAPE = re.compile(r"%[0-9a-fA-F]{2}|\\x[0-9a-fA-F]{2}|\\u[0-9a-fA-F]{4}")


def _basic_credentials(found: re.Match[str]) -> str:
    """A basic-auth header's value hidden: ``Basic`` and base64 of ``user:password``."""
    try:
        plain = base64.b64decode(found[1], validate=True)
    except ValueError:
        return found[0]
    return "Basic [REDACTED]" if b":" in plain else found[0]


_SECRET_PATTERNS: tuple[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]], ...] = (
    # OpenAI (sk-..., sk-proj-...) and Anthropic (sk-ant-...) style keys.
    (re.compile(r"sk-[A-Za-z0-9_\-*.]{6,}"), "sk-[REDACTED]"),
    (re.compile(r"(?i)\bbearer\s+[^\s,;\"']+"), "Bearer [REDACTED]"),
    # Basic auth (before the header pattern, which would take "Basic" for the value).
    (re.compile(r"(?i)\bbasic\s+([A-Za-z0-9+/]{4,}={0,2})(?![A-Za-z0-9+/=])"), _basic_credentials),
    # A password in a URL (a ${VARIABLE} naming one is no secret).
    (re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://[^\s/?#@:]*:)(?!\$\{)[^\s/?#@]+@"), r"\1[REDACTED]@"),
    (
        re.compile(
            r"(?i)\b(authorization|x-api-key|api[-_]?key|access[-_]?token)(\"?\s*[:=]\s*\"?)([^\s,;\"'}]+)"
        ),
        r"\1\2[REDACTED]",
    ),
)


#: Matches wherever any of :data:`_SECRET_PATTERNS` could (each needs one of these words,
#: "sk-" in any case is looser than the pattern): text without it needs no pattern run.
_PATTERN_HINT = re.compile(
    r"(?i)sk-|bearer|basic\s|authorization|x-api-key|api[-_]?key|access[-_]?token|://[^\s/]*@"
)


def decoded(text: str) -> str:
    """``text`` with one layer of encoding taken off: percent-escapes, and JSON / Python
    ``\\u`` and ``\\x`` escapes (the text as it is when it has none)."""
    if "%" in text:
        text = urllib.parse.unquote(text)
    if "\\" in text:
        text = _ESCAPE.sub(lambda m: chr(int(m[1] or m[2], 16)), text)
    return text


@lru_cache(maxsize=64)
def _encoded(value: str) -> re.Pattern[str]:
    """Matches ``value`` with each character as written, ``\\u00hh``, ``\\xhh``, ``%hh`` or
    ``%25hh`` (percent-encoded twice), hex digits in either case."""

    def hex_of(code: str) -> str:
        return "".join(f"[{c}{c.upper()}]" if c.isalpha() else c for c in code)

    parts = []
    for char in value:
        h = hex_of(f"{ord(char):02x}")
        forms = [re.escape(char), rf"%{h}", rf"%25{h}"]
        if ord(char) < 0x100:
            forms.append(rf"\\x{h}")
        forms.append(rf"\\u{hex_of(f'{ord(char):04x}')}")
        parts.append(f"(?:{'|'.join(forms)})")
    return re.compile("".join(parts))


def _escaped(text: str) -> bool:
    """Whether ``text`` has an escape :func:`_encoded` reads (else no encoded value)."""
    return ("%" in text or "\\" in text) and _ANY_ESCAPE.search(text) is not None


def _replaced(text: str, values: Sequence[str]) -> str:
    escaped = _escaped(text)  # a replacement adds no escape
    for value in values:  # longest first: a key inside another goes last
        if value in text:
            text = text.replace(value, "[REDACTED]")
        if escaped:
            text = _encoded(value).sub("[REDACTED]", text)
    return text


def _found(text: str, values: Sequence[str]) -> bool:
    """Whether one of ``values`` is in ``text``, as written or one layer encoded."""
    if any(value in text for value in values):
        return True
    return _escaped(text) and any(_encoded(v).search(text) for v in values)


def without_values(text: str, values: Iterable[str | None]) -> str:
    """``text`` with each of ``values`` replaced by ``[REDACTED]``: as written, one layer
    encoded (in place), or nested deeper (an escape inside a percent-escape: the text is
    then decoded layer by layer, up to :data:`DECODE_ROUNDS`, and given back decoded)."""
    ordered = sorted({v for v in values if v}, key=len, reverse=True)
    if not ordered:
        return text
    text = probe = _replaced(text, ordered)
    for _ in range(DECODE_ROUNDS):
        if not _NESTED.search(probe):
            break
        probe = decoded(probe)
        if _found(probe, ordered):
            text = probe = _replaced(probe, ordered)
    return text


def _holds(text: str, values: Iterable[str]) -> bool:
    """Whether ``text`` holds one of ``values`` in a form :func:`without_values` removes."""
    ordered = list(values)
    probe = text
    for _ in range(DECODE_ROUNDS + 1):
        if _found(probe, ordered):
            return True
        if not _NESTED.search(probe):
            return False
        probe = decoded(probe)
    return False


def scrub(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` with every known secret value (in any encoding :func:`without_values`
    sees through), key-looking token and auth header removed."""
    text = without_values(text, secrets)
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
    discusses). On every answer, so cheap: a substring search per key value, decoding
    only text with a ``%`` or a backslash."""
    return without_values(text, key_values())


def may_hold_secret(text: str, values: Iterable[str] | None = None) -> bool:
    """Whether :func:`redact` could change ``text``: it holds a key value (of ``values``,
    by default :func:`key_values`) or a word a key-shaped pattern needs. One search, no
    substitution: what the hot paths ask first."""
    if _PATTERN_HINT.search(text):
        return True
    return _holds(text, key_values() if values is None else values)


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
        found
        for found in logging.Logger.manager.loggerDict.values()
        if isinstance(found, logging.Logger)
    ]
    for logger in loggers:
        redact_logs(logger)
    last = logging.lastResort
    if last is not None and not any(isinstance(f, RedactingFilter) for f in last.filters):
        last.addFilter(RedactingFilter())
