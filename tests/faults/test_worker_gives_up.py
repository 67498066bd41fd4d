"""A worker that cannot reach Redis for ``DUET_REDIS_UNREACHABLE_EXIT_S`` exits non-zero
for its supervisor to start it again (unset: it waits, as before); a password Redis
refuses at start is one line, exit 2, not a worker retrying for ever."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from duet.embedded.server import EmbeddedRedis
from tests.reliability import ENGINE, Reliability, lost_of
from tests.support import ROOT, celery_worker, wait_for

pytestmark = [pytest.mark.system, pytest.mark.timeout(200)]

GIVE_UP_S = 6


def test_a_worker_gives_up_on_redis_after_the_time_set(reliability: Reliability) -> None:
    env = {"DUET_REDIS_UNREACHABLE_EXIT_S": str(GIVE_UP_S)}
    server = EmbeddedRedis().start()
    try:
        with celery_worker(server.url, env=env, concurrency=2, name="givesup") as worker:
            server.stop()
            stopped = time.monotonic()
            wait_for(lambda: worker.poll() is not None, 90, "the worker to exit")
            took = time.monotonic() - stopped
            log = Path(worker.log_path).read_text(errors="replace")
            code = worker.returncode
    finally:
        server.stop()
    print(f"Redis stopped: the worker exited with {code} after {took:.0f}s")
    reliability.record(
        section=ENGINE,
        fault=f"Redis stopped for good under a worker with `DUET_REDIS_UNREACHABLE_EXIT_S={GIVE_UP_S}`",
        load="an idle worker",
        lost=f"{lost_of(0 if code == 3 else 1, 1, 'workers left waiting')}: exit code {code} "
        f"{took:.0f} s after Redis went, one ERROR line",
        before="a worker kept retrying for ever (its supervisor never saw it fail)",
    )
    assert code == 3
    assert "DUET_REDIS_UNREACHABLE_EXIT_S" in log


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
