"""Helpers shared by tests: waiting on a condition, a real worker process."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parents[1]
#: The smallest review config: actor and critic on the offline simulator.
SIM_CONFIG = """\
[actor]
instructions = "Fix the code."
model = "sim"

[critic]
instructions = "Find security bugs."
model = "sim"
"""


def pings(client: redis.Redis) -> bool:
    """Whether the server behind ``client`` answers a ping now (not yet: False)."""
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False


def wait_for(condition, timeout: float, what: str, interval: float = 0.05):  # type: ignore[no-untyped-def]
    """Poll ``condition`` until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def _answers(probe: Any, hostname: str) -> bool:
    try:
        return bool(probe.control.ping(destination=[hostname], timeout=0.5))
    except redis.exceptions.RedisError:
        return False


@contextlib.contextmanager
def celery_worker(
    redis_url: str,
    *,
    concurrency: int = 32,
    env: dict[str, str] | None = None,
    queues: str = "actor,critic,coordinator",
    name: str = "w1",
    broker_url: str | None = None,
    loglevel: str = "WARNING",
) -> Iterator[subprocess.Popen[bytes]]:
    """A ``celery -A workers worker`` subprocess, ready when this yields.

    Its log (stdout and stderr) is the file ``proc.log_path`` (removed afterwards).
    """
    full_env = {**os.environ, "DUET_REDIS_URL": redis_url, "PYTHONUNBUFFERED": "1", **(env or {})}
    full_env.pop("DUET_BROKER_URL", None)
    if broker_url:
        full_env["DUET_BROKER_URL"] = broker_url
    log = open(ROOT / f".pytest-worker-{name}-{os.getpid()}.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "workers", "worker", "--pool", "threads",
         "-c", str(concurrency), "-Q", queues, "--loglevel", loglevel,
         "--without-heartbeat", "--without-mingle", "--without-gossip",
         "-n", f"{name}-{os.getpid()}@%h"],
        cwd=ROOT, env=full_env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    proc.log_path = ROOT / log.name  # type: ignore[attr-defined]
    from celery import Celery

    from orchestration.state.keys import BROKER_PREFIX

    probe = Celery("probe", broker=broker_url or redis_url, set_as_current=False)
    # The workers' broker keys (and so their control channels) are under Duet's prefix,
    # on Duet's transport and kombu's stock one alike.
    probe.conf.broker_transport_options = {"global_keyprefix": BROKER_PREFIX}
    hostname = f"{name}-{os.getpid()}@{socket.gethostname()}"
    try:
        # This worker's own answer (another worker of the test may answer first); a Redis
        # that refuses the ping's reply queue (a fault test) is "not yet".
        wait_for(
            lambda: proc.poll() is not None or _answers(probe, hostname), 60,
            "the worker to answer a ping",
        )  # fmt: skip
        if proc.poll() is not None:
            raise AssertionError(f"worker exited: {(ROOT / log.name).read_text()[-2000:]}")
        yield proc
    finally:
        probe.close()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
        with contextlib.suppress(OSError):
            os.unlink(log.name)


@contextlib.contextmanager
def stock_libraries() -> Iterator[dict[str, str]]:
    """This process's client on the stock libraries (``DUET_FAST_PATHS=off``) until the
    block ends; yields the variable, for the workers' environment."""
    from orchestration.state import fastpaths

    saved = os.environ.get(fastpaths.SWITCH)
    os.environ[fastpaths.SWITCH] = "off"
    fastpaths.reset()
    try:
        yield {fastpaths.SWITCH: "off"}
    finally:
        if saved is None:
            os.environ.pop(fastpaths.SWITCH, None)
        else:
            os.environ[fastpaths.SWITCH] = saved
        fastpaths.reset()


@contextlib.contextmanager
def client_pointed_at(redis_url: str, broker_url: str | None = None) -> Iterator[str]:
    """Point this process's client API (settings, Redis pool, producer) at ``redis_url``,
    and back to nothing afterwards."""
    from orchestration.settings import get_settings
    from orchestration.state import connection

    saved = {k: os.environ.get(k) for k in ("DUET_REDIS_URL", "DUET_BROKER_URL")}
    os.environ["DUET_REDIS_URL"] = redis_url
    if broker_url:
        os.environ["DUET_BROKER_URL"] = broker_url
    else:
        os.environ.pop("DUET_BROKER_URL", None)
    get_settings.cache_clear()
    connection.use_redis(redis_url)
    try:
        yield redis_url
    finally:
        connection.reset()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        get_settings.cache_clear()


def stored_calls(redis_url: str, run_ids: list[str]) -> int:
    """Model calls the stored step results of ``run_ids`` account for (one per step that
    called the model, whatever its outcome)."""
    import json

    import redis

    from orchestration.state import keys

    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        pipe = client.pipeline(transaction=False)
        for run_id in run_ids:
            pipe.hvals(keys.run_steps(run_id))
        return sum(
            int(json.loads(raw).get("calls", 0)) for steps in pipe.execute() for raw in steps
        )
    finally:
        client.close()


def swept_runs(logs: list[str]) -> int:
    """Runs the periodic sweep sent on, from the workers' logs (its WARNING lines)."""
    import re

    return sum(int(n) for log in logs for n in re.findall(r"sweep: (\d+) runs had stopped", log))


def peak_in_flight(run_ids: list[str]) -> int:
    """Most of ``run_ids`` started and not finished at one moment, from their
    ``run.started`` / ``run.finished`` events (the client pointed at their Redis)."""
    from orchestration.client.handles import RunHandle
    from orchestration.core import events as ev

    edges = []
    for run_id in run_ids:
        events = list(RunHandle(run_id).events(follow=False))
        edges.append((min(e.ts for e in events if e.type == ev.RUN_STARTED), 1))
        edges.append((max(e.ts for e in events if e.type == ev.RUN_FINISHED), -1))
    peak = now = 0
    for _, step in sorted(edges):
        now += step
        peak = max(peak, now)
    return peak
