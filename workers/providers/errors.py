"""Classify vendor failures into :class:`ProviderError`, the same way for every SDK.

Pure functions of an HTTP status code, the response headers and the exception's type
names, so the whole table is testable without importing ``openai`` or ``anthropic``.
Every message passes through :func:`scrub` so no API key reaches logs, events or Redis.
"""

from __future__ import annotations

import email.utils
import math
import time
from collections.abc import Iterable, Mapping

from orchestration.core.errors import ProviderError
from orchestration.core.ratelimit import VendorLimits
from workers.providers.limits import read_limits
from workers.secrets import scrub

#: status code -> (kind, transient). Codes not listed: 5xx transient ``server_error``,
#: other 4xx permanent ``client_error``.
STATUS_KINDS: dict[int, tuple[str, bool]] = {
    400: ("bad_request", False),
    401: ("auth", False),
    402: ("payment_required", False),
    403: ("permission", False),
    404: ("not_found", False),
    408: ("timeout", True),
    409: ("conflict", True),
    413: ("too_large", False),
    422: ("unprocessable", False),
    429: ("rate_limited", True),
    529: ("overloaded", True),
}

#: Vendor error codes of a 400 that mean the conversation overflowed the model's context
#: window (OpenAI's ``context_length_exceeded``): kind ``context_window``, which
#: interrupts the agent with that reason rather than as a provider error.
CONTEXT_WINDOW_CODES = frozenset({"context_length_exceeded"})
#: ...and how Anthropic's 400 for a prompt longer than the context window begins.
CONTEXT_WINDOW_TEXT = "prompt is too long"

#: Exception type names (anywhere in the MRO) that mean the call timed out...
_TIMEOUT_NAMES = frozenset(
    {
        "APITimeoutError",
        "TimeoutException",
        "ReadTimeout",
        "ConnectTimeout",
        "WriteTimeout",
        "PoolTimeout",
        "TimeoutError",
        "timeout",
    }
)
#: ...or that the connection failed or broke before a response arrived.
_CONNECTION_NAMES = frozenset(
    {
        "APIConnectionError",
        "ConnectError",
        "NetworkError",
        "TransportError",
        "ProtocolError",
        "RemoteProtocolError",
        "ReadError",
        "WriteError",
        "ConnectionError",
        "IncompleteRead",
    }
)


def _header(headers: Mapping[str, str] | None, name: str) -> str | None:
    if not headers:
        return None
    value = headers.get(name)
    if value is not None:
        return value
    for key, val in headers.items():
        if key.lower() == name:
            return val
    return None


def parse_retry_after(headers: Mapping[str, str] | None, now: float | None = None) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date).

    Returns ``None`` when neither header is present or parseable; never negative.
    """
    ms = _header(headers, "retry-after-ms")
    if ms is not None:
        try:
            value = float(ms.strip())
        except ValueError:
            value = math.nan
        if math.isfinite(value) and value >= 0:
            return value / 1000
    raw = _header(headers, "retry-after")
    if raw is None:
        return None
    raw = raw.strip()
    try:
        value = float(raw)
    except ValueError:
        pass
    else:
        return value if math.isfinite(value) and value >= 0 else None
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None or when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def kind_for_status(status: int) -> tuple[str, bool]:
    """``(kind, transient)`` for an HTTP error status."""
    if status in STATUS_KINDS:
        return STATUS_KINDS[status]
    if status >= 500:
        return "server_error", True
    return "client_error", False


def error_for_status(
    status: int,
    headers: Mapping[str, str] | None = None,
    message: str = "",
    *,
    provider: str,
    secrets: Iterable[str | None] = (),
    code: object = None,
) -> ProviderError:
    """The :class:`ProviderError` for an HTTP error response; ``code`` is the vendor's
    error code when the body has one (``error.code``)."""
    kind, transient = kind_for_status(status)
    if status == 400 and (code in CONTEXT_WINDOW_CODES or message.startswith(CONTEXT_WINDOW_TEXT)):
        kind = "context_window"
    retry_after = parse_retry_after(headers) if transient else None
    text = f"{provider}: HTTP {status} ({kind})"
    if message:
        text += f": {message}"
    return ProviderError(
        scrub(text, secrets),
        kind=kind,
        transient=transient,
        retry_after=retry_after,
        status_code=status,
        limits=_stated(read_limits(headers)),
    )


def _stated(limits: VendorLimits | None) -> VendorLimits | None:
    """``limits`` when an error's headers state some: an error without them (a proxy's,
    say) does not teach that the account has none."""
    return limits if limits is not None and (limits.rpm or limits.tpm) else None


def _type_names(exc: BaseException) -> set[str]:
    names: set[str] = set()
    seen: set[int] = set()
    current: BaseException | None = exc
    # The exception itself and what it was raised from (SDKs wrap transport errors).
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        names.update(cls.__name__ for cls in type(current).__mro__)
        current = current.__cause__
    return names


def _status_of(exc: BaseException) -> int | None:
    status = getattr(exc, "status_code", None)
    if not isinstance(status, int):
        status = getattr(getattr(exc, "response", None), "status_code", None)
    return status if isinstance(status, int) and 400 <= status <= 599 else None


def classify_exception(
    exc: BaseException, *, provider: str, secrets: Iterable[str | None] = ()
) -> ProviderError:
    """Map any SDK or transport exception to a :class:`ProviderError`.

    HTTP status errors go by :data:`STATUS_KINDS` (reading ``exc.status_code`` and
    ``exc.response.headers``); timeouts and broken connections by type name; anything
    else is a permanent ``unexpected`` error.
    """
    secrets = list(secrets)
    status = _status_of(exc)
    if status is not None:
        headers = getattr(getattr(exc, "response", None), "headers", None)
        message = getattr(exc, "message", None) or str(exc)
        return error_for_status(
            status,
            headers,
            message,
            provider=provider,
            secrets=secrets,
            code=getattr(exc, "code", None),
        )
    names = _type_names(exc)
    detail = f"{type(exc).__name__}: {exc}"
    cause = exc.__cause__
    if cause is not None:
        detail += f" ({type(cause).__name__}: {cause})"
    if names & _TIMEOUT_NAMES:
        kind, transient = "timeout", True
    elif names & _CONNECTION_NAMES:
        kind, transient = "connection", True
    else:
        kind, transient = "unexpected", False
    return ProviderError(
        scrub(f"{provider}: {kind}: {detail}", secrets), kind=kind, transient=transient
    )
