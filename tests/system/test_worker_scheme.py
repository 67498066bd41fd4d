"""A worker given a Redis URL scheme Duet does not serve refuses in one line, exit 2, on
every entry point, before Celery builds a broker connection (kombu's error there was a
63-line traceback)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support import ROOT

pytestmark = pytest.mark.system

ENTRY_POINTS = {
    "duet worker": [sys.executable, "-m", "duet", "worker"],
    "celery worker": [sys.executable, "-m", "celery", "-A", "workers", "worker"],
}


@pytest.mark.parametrize("command", list(ENTRY_POINTS))
@pytest.mark.parametrize("url", ["sentinels://:pw-9q@127.0.0.1:1/0", "redis+tls://127.0.0.1:1/0"])
def test_an_unknown_scheme_is_one_line(command: str, url: str) -> None:
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
    assert len(lines) == 1 and "is not a Redis URL Duet serves" in lines[0], lines
    assert "pw-9q" not in lines[0]
