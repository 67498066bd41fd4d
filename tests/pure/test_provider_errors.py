"""Provider error classification: status table, Retry-After, type names, scrubbing."""

from __future__ import annotations

import email.utils

import pytest

from orchestration.core.errors import ProviderError
from workers.providers.errors import (
    classify_exception,
    error_for_status,
    kind_for_status,
    parse_retry_after,
    scrub,
)


@pytest.mark.parametrize(
    ("status", "kind", "transient"),
    [
        (400, "bad_request", False),
        (401, "auth", False),
        (403, "permission", False),
        (404, "not_found", False),
        (408, "timeout", True),
        (409, "conflict", True),
        (422, "unprocessable", False),
        (429, "rate_limited", True),
        (500, "server_error", True),
        (502, "server_error", True),
        (503, "server_error", True),
        (504, "server_error", True),
        (529, "overloaded", True),
        (418, "client_error", False),
    ],
)
def test_status_table(status: int, kind: str, transient: bool) -> None:
    assert kind_for_status(status) == (kind, transient)
    err = error_for_status(status, {}, "boom", provider="openai")
    assert (err.kind, err.transient, err.status_code) == (kind, transient, status)
    assert f"HTTP {status}" in str(err) and "boom" in str(err) and str(err).startswith("openai:")


def test_retry_after_seconds_and_ms() -> None:
    assert parse_retry_after({"Retry-After": "7"}) == 7.0
    assert parse_retry_after({"retry-after": "1.5"}) == 1.5
    assert parse_retry_after({"RETRY-AFTER-MS": "250"}) == 0.25
    # milliseconds are more precise and win when both are sent
    assert parse_retry_after({"retry-after": "3", "retry-after-ms": "2500"}) == 2.5


def test_retry_after_http_date() -> None:
    now = 1_700_000_000.0
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert parse_retry_after({"Retry-After": date}, now=now) == pytest.approx(30.0)
    past = email.utils.formatdate(now - 30, usegmt=True)
    assert parse_retry_after({"Retry-After": past}, now=now) == 0.0


@pytest.mark.parametrize(
    "headers",
    [None, {}, {"Retry-After": "soon"}, {"Retry-After": "-3"}, {"retry-after-ms": "x"}],
)
def test_retry_after_absent_or_bad(headers: dict[str, str] | None) -> None:
    assert parse_retry_after(headers) is None


def test_bad_ms_falls_back_to_seconds() -> None:
    assert parse_retry_after({"retry-after-ms": "nope", "retry-after": "4"}) == 4.0


def test_rate_limit_carries_retry_after_permanent_does_not() -> None:
    assert error_for_status(429, {"Retry-After": "12"}, provider="x").retry_after == 12.0
    assert error_for_status(503, {"retry-after-ms": "100"}, provider="x").retry_after == 0.1
    assert error_for_status(400, {"Retry-After": "12"}, provider="x").retry_after is None


class _Resp:
    def __init__(self, status: int, headers: dict[str, str]) -> None:
        self.status_code = status
        self.headers = headers


class APIStatusError(Exception):
    def __init__(self, message: str, status: int, headers: dict[str, str]) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status
        self.response = _Resp(status, headers)


class APIConnectionError(Exception):
    pass


class APITimeoutError(APIConnectionError):
    pass


class RemoteProtocolError(Exception):
    pass


def test_classify_status_exception_reads_response_headers() -> None:
    exc = APIStatusError("Error code: 429 - slow down", 429, {"retry-after": "2"})
    err = classify_exception(exc, provider="anthropic")
    assert (err.kind, err.transient, err.retry_after, err.status_code) == (
        "rate_limited",
        True,
        2.0,
        429,
    )
    assert "slow down" in str(err)


def test_classify_timeout_before_connection() -> None:
    # The SDKs' timeout error subclasses their connection error: timeout must win.
    err = classify_exception(APITimeoutError("Request timed out."), provider="openai")
    assert (err.kind, err.transient, err.status_code) == ("timeout", True, None)
    assert classify_exception(TimeoutError("t"), provider="openai").kind == "timeout"


def test_classify_connection_by_name_and_cause() -> None:
    err = classify_exception(APIConnectionError("Connection error."), provider="openai")
    assert (err.kind, err.transient) == ("connection", True)
    try:
        try:
            raise RemoteProtocolError("Server disconnected without sending a response.")
        except RemoteProtocolError as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as outer:
        err = classify_exception(outer, provider="openai")
    assert (err.kind, err.transient) == ("connection", True)
    assert "Server disconnected" in str(err)
    assert classify_exception(ConnectionResetError(), provider="x").kind == "connection"


def test_classify_unknown_is_permanent() -> None:
    err = classify_exception(KeyError("choices"), provider="openai")
    assert (err.kind, err.transient) == ("unexpected", False)


KEY = "sk-proj-AbCdEf0123456789xyz"


@pytest.mark.parametrize(
    "text",
    [
        f"Incorrect API key provided: {KEY}.",
        f"headers: {{'Authorization': 'Bearer {KEY}'}}",
        "Authorization: Bearer abc.def.ghi",
        'x-api-key: "sk-ant-api03-zzzzzzzzzzzz"',
        "api_key=hunter2hunter2",
    ],
)
def test_scrub_removes_keys(text: str) -> None:
    out = scrub(text, [KEY])
    for secret in (KEY, "abc.def.ghi", "sk-ant-api03-zzzzzzzzzzzz", "hunter2hunter2"):
        assert secret not in out
    assert "REDACTED" in out


def test_scrub_known_value_that_does_not_look_like_a_key() -> None:
    out = scrub("the key was plainvalue42 ok", ["plainvalue42", None, ""])
    assert out == "the key was [REDACTED] ok"


def test_messages_are_scrubbed() -> None:
    err = error_for_status(401, {}, f"Incorrect API key provided: {KEY}", provider="openai")
    assert KEY not in str(err)
    exc = APIStatusError(f"bad key custom-secret-1 {KEY}", 401, {})
    err = classify_exception(exc, provider="openai", secrets=["custom-secret-1"])
    assert "custom-secret-1" not in str(err) and KEY not in str(err)
    err = classify_exception(
        APIConnectionError("failed with custom-secret-1"), provider="x", secrets=["custom-secret-1"]
    )
    assert "custom-secret-1" not in str(err)


def test_a_worker_without_the_vendor_sdk_fails_the_call_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    from workers.providers.sdk import vendor_sdk

    monkeypatch.setitem(sys.modules, "anthropic", None)  # as if never installed
    with pytest.raises(ProviderError) as raised:
        vendor_sdk("anthropic")
    assert raised.value.kind == "missing_sdk" and not raised.value.transient
    assert "pip install 'duet-review[anthropic] @ git+https://" in str(raised.value)
