"""Redis and broker URLs are shown with their password hidden, wherever it is written."""

from __future__ import annotations

import pytest

from orchestration.state.connection import hide_password


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("redis://:s3cret@127.0.0.1:6379/0", "redis://:***@127.0.0.1:6379/0"),
        ("rediss://app:s3cret@Redis.Example:6380/1", "rediss://app:***@Redis.Example:6380/1"),
        ("redis://:s3cret@[::1]:6379/0", "redis://:***@[::1]:6379/0"),
        ("redis://:p@ss:w@rd@host:1/0", "redis://:***@host:1/0"),
        ("redis://host:6379/0?password=s3cret&db=2", "redis://host:6379/0?password=***&db=2"),
        (
            "redis://host/0?ssl_cert_reqs=none&Password=s3cret",
            "redis://host/0?ssl_cert_reqs=none&Password=***",
        ),
        ("amqp://guest:s3cret@rabbit:5672//", "amqp://guest:***@rabbit:5672//"),
        ("redis://:s3cret@host:notaport/0", "redis://:***@host:notaport/0"),
        ("redis://:s3cret@[::1/0", "<unparseable URL>"),
    ],
)
def test_the_password_is_hidden(url: str, shown: str) -> None:
    assert hide_password(url) == shown
    assert "s3cret" not in hide_password(url)
