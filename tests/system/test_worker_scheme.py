"""A worker given a Redis URL scheme Duet does not serve refuses in one line, exit 2, on
every entry point, before Celery builds a broker connection (kombu's error there was a
63-line traceback); so does a worker whose password Redis refuses at start (it retried
for ever)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import redis

from duet.embedded.server import EmbeddedRedis
from tests.support import ROOT

pytestmark = pytest.mark.system

ENTRY_POINTS = {
    "duet worker": [sys.executable, "-m", "duet", "worker"],
    "celery worker": [sys.executable, "-m", "celery", "-A", "workers", "worker"],
}


def refusal(command: str, url: str) -> list[str]:
    """What ``command`` given ``DUET_REDIS_URL=url`` printed (its lines), having exited 2."""
    done = subprocess.run(
        ENTRY_POINTS[command],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "DUET_REDIS_URL": url},
    )
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 2, lines
    return lines


@pytest.mark.parametrize("command", list(ENTRY_POINTS))
@pytest.mark.parametrize("url", ["valkey://:pw-9q@127.0.0.1:1/0", "redis+tls://127.0.0.1:1/0"])
def test_an_unknown_scheme_is_one_line(command: str, url: str) -> None:
    lines = refusal(command, url)
    assert len(lines) == 1 and "is not a Redis URL Duet serves" in lines[0], lines
    assert "pw-9q" not in lines[0]


@pytest.mark.parametrize("command", list(ENTRY_POINTS))
@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("sentinels://:pw-9q@127.0.0.1:1/0?ssl_ca_certs=/nonexistent/ca.crt", "is not there"),
        ("sentinel://:pw-9q@127.0.0.1:1/0?ssl_ca_cert=/etc/ca.crt", "'ssl_ca_cert' is not one"),
        ("sentinel://:pw-9q@127.0.0.1:1/x", "database 'x'"),
    ],
)
def test_a_sentinel_url_that_cannot_be_used_is_one_line(command: str, url: str, says: str) -> None:
    """Refused before Celery starts (a Sentinel URL is read when the app is imported)."""
    lines = refusal(command, url)
    assert len(lines) == 1 and says in lines[0] and "DUET_REDIS_URL" in lines[0], lines
    assert "pw-9q" not in lines[0]


def test_a_refused_password_stops_the_worker_at_start() -> None:
    with EmbeddedRedis() as server:
        with redis.Redis(port=server.port) as r:
            r.config_set("requirepass", "right-pw-4k")
        done = subprocess.run(
            [sys.executable, "-m", "celery", "-A", "workers", "worker", "--pool", "threads"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=90,
            env={**os.environ, "DUET_REDIS_URL": f"redis://:wrong-pw-4k@127.0.0.1:{server.port}/0"},
        )
        with redis.Redis(port=server.port, password="right-pw-4k") as r:
            r.config_set("requirepass", "")
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2, done.stderr[-2000:]
    assert len(errors) == 1 and "wrong-pw-4k" not in done.stderr, done.stderr[-2000:]
