"""A worker that cannot reach Redis for ``DUET_REDIS_UNREACHABLE_EXIT_S`` exits non-zero
for its supervisor to start it again (unset: it waits, as before)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from duet.embedded.server import EmbeddedRedis
from tests.reliability import ENGINE, Reliability, lost_of
from tests.support import celery_worker, wait_for

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
