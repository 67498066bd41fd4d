"""A Redis that cannot keep Duet's state is refused at start, in one line, exit 2: by
every ``duet`` command and by a worker process (an evicting ``maxmemory-policy``, a Redis
Cluster node, a URL scheme Duet does not serve); ``DUET_ALLOW_EVICTION=1`` lets an
evicting server through with a warning."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from duet.embedded.server import EmbeddedRedis, find_server_binary, free_port
from tests.reliability import CLIENTS, Reliability
from tests.support import CELERY, ROOT, pings, wait_for

pytestmark = pytest.mark.system

FIX = "CONFIG SET maxmemory-policy noeviction"


def duet(args: list[str], url: str, **env: str) -> tuple[int, str, str]:
    full = {**os.environ, "DUET_REDIS_URL": url, "DUET_REDIS_CONNECT_TIMEOUT_S": "2", **env}
    full.pop("DUET_BROKER_URL", None)
    proc = subprocess.run(
        [sys.executable, "-m", "duet", *args],
        cwd=ROOT,
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return proc.returncode, proc.stdout, proc.stderr


def worker(url: str, **env: str) -> tuple[int | None, str]:
    """Start a worker process on ``url``; its exit code within 60 s (None: still up)."""
    full = {**os.environ, "DUET_REDIS_URL": url, **env}
    full.pop("DUET_BROKER_URL", None)
    proc = subprocess.Popen(
        [
            *CELERY,
            "worker",
            "--pool",
            "threads",
            "--concurrency",
            "2",
            "--without-gossip",
            "--without-mingle",
            "-n",
            "preflight@%h",
        ],
        cwd=ROOT,
        env=full,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        code = proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = None
    out = proc.communicate()[0]
    return code, out


@pytest.fixture(scope="module")
def evicting() -> Iterator[str]:
    with EmbeddedRedis() as server:
        with redis.Redis(port=server.port) as admin:
            admin.config_set("maxmemory-policy", "allkeys-lru")
        yield server.url


def _cluster_port() -> int:
    """A free port a cluster node can take: at most 55535, since its cluster bus listens
    10,000 higher (redis-server refuses higher ports), with that bus port free too."""
    for _ in range(200):
        port = free_port()
        if port <= 55535:
            with socket.socket() as bus:
                try:
                    bus.bind(("127.0.0.1", port + 10000))
                except OSError:
                    continue
            return port
    raise AssertionError("no free port at or below 55535 with its cluster bus port free")


@pytest.fixture(scope="module")
def cluster_node() -> Iterator[str]:
    """A redis-server started with ``cluster-enabled yes`` (one node, no slots).

    A free port can be taken by another server between the pick and the bind: a node that
    exits at start is started again on a new port (its log says why it exited)."""
    with tempfile.TemporaryDirectory() as directory:
        for attempt in range(3):
            port = _cluster_port()
            log = Path(directory) / f"node-{attempt}.log"
            proc = subprocess.Popen(
                [
                    find_server_binary(),
                    "--port",
                    str(port),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    f"nodes-{port}.conf",
                    "--dir",
                    directory,
                    "--loglevel",
                    "warning",
                    "--logfile",
                    str(log),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            client = redis.Redis(port=port, socket_timeout=1)
            wait_for(
                lambda p=proc, c=client: p.poll() is not None or pings(c),
                60,
                "the cluster node to answer or exit",
            )
            client.close()
            if proc.poll() is None:
                break
        else:
            raise AssertionError(f"the cluster node never started: {log.read_text()[-500:]}")
        try:
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            proc.kill()
            proc.wait()


def one_line_refusal(code: int | None, err: str) -> list[str]:
    lines = err.strip().splitlines()
    return [
        what
        for what, bad in [
            (f"exit {code}", code != 2),
            (f"{len(lines)} lines on stderr", len(lines) != 1),
        ]
        if bad
    ]


def test_an_evicting_server_is_refused_by_a_command(
    evicting: str, reliability: Reliability
) -> None:
    code, out, err = duet(["ls"], evicting)
    wrong = one_line_refusal(code, err)
    reliability.record(
        section=CLIENTS,
        fault="`maxmemory-policy allkeys-lru` (a common managed-service default)",
        load="`duet ls`; a worker process",
        lost="; ".join(wrong)
        or f"nothing: refused at start, one line naming the setting "
        f"and the fix (`{FIX}`, or `DUET_ALLOW_EVICTION=1`), exit 2",
        before="nothing warned at start; under memory pressure all 50 runs of a batch were "
        "lost (records, batch and budget limit evicted)",
    )
    assert not wrong, err
    assert "maxmemory-policy allkeys-lru" in err and FIX in err, err
    assert "DUET_ALLOW_EVICTION=1" in err


def test_an_evicting_server_is_refused_by_a_worker(evicting: str, reliability: Reliability) -> None:
    code, out = worker(evicting)
    reliability.record(
        section=CLIENTS,
        fault="`maxmemory-policy allkeys-lru`, at a worker's start",
        load="`celery -A workers worker`",
        lost="nothing: the worker exits 2 before taking a message"
        if code == 2 and FIX in out
        else f"the worker exited {code} without naming the fix",
    )
    assert code == 2, out[-3000:]
    assert FIX in out


def test_an_evicting_server_is_accepted_when_allowed(
    evicting: str, reliability: Reliability
) -> None:
    code, out, err = duet(["ls"], evicting, DUET_ALLOW_EVICTION="1")
    reliability.record(
        section=CLIENTS,
        fault="`maxmemory-policy allkeys-lru` with `DUET_ALLOW_EVICTION=1` (the risk accepted)",
        load="`duet ls`",
        lost="nothing: runs, with a warning naming the policy"
        if code == 0 and "allkeys-lru" in err
        else f"exit {code}: {err[-200:]}",
    )
    assert code == 0, err
    assert "warning:" in err and "allkeys-lru" in err


def test_a_cluster_node_is_refused(cluster_node: str, reliability: Reliability) -> None:
    code, out, err = duet(["ls"], cluster_node)
    wrong = one_line_refusal(code, err)
    reliability.record(
        section=CLIENTS,
        fault="a Redis Cluster endpoint (`cluster_enabled:1`)",
        load="`duet ls`",
        lost="; ".join(wrong)
        or "nothing: refused at start, one line saying why (keys in several hash slots), exit 2",
        before="not checked: commands and scripts failed later with `CROSSSLOT` / `MOVED`",
    )
    assert not wrong, err
    assert "Redis Cluster" in err


def test_an_unknown_scheme_is_one_line(reliability: Reliability) -> None:
    code, out, err = duet(["ls"], "http://127.0.0.1:6379/0")
    wrong = one_line_refusal(code, err)
    reliability.record(
        section=CLIENTS,
        fault="`DUET_REDIS_URL=http://…` (a scheme Duet does not serve)",
        load="`duet ls`",
        lost="; ".join(wrong)
        or "nothing: one line naming the variable and the schemes served, exit 2",
    )
    assert not wrong, err
    assert "DUET_REDIS_URL=" in err and "redis://" in err


def test_an_unknown_scheme_is_refused_by_a_worker(reliability: Reliability) -> None:
    code, out = worker("memory://127.0.0.1:6379/0")
    reliability.record(
        section=CLIENTS,
        fault="`DUET_REDIS_URL=memory://…` (a kombu transport, not Redis), at a worker's start",
        load="`celery -A workers worker`",
        lost="nothing: the worker exits 2 with one line" if code == 2 else f"exit {code}",
    )
    assert code == 2, out[-3000:]
    assert "memory:// is not a Redis URL Duet serves" in out


def test_a_server_that_will_not_say_is_let_through_with_a_warning(
    reliability: Reliability,
) -> None:
    """A user without INFO and CONFIG (as some managed services give): unknown, warned."""
    from orchestration.state import preflight

    reliability.record(
        section=CLIENTS,
        fault="a managed Redis that refuses `INFO` and `CONFIG` to Duet's user",
        load="the start check, twice",
        lost="nothing: let through with one warning that the policy is unknown",
    )

    with EmbeddedRedis() as server, redis.Redis(port=server.port) as admin:
        admin.acl_setuser(
            "app",
            enabled=True,
            passwords=["+pw"],
            keys=["*"],
            channels=["*"],
            commands=["+@all", "-info", "-config"],
        )
        url = f"redis://app:pw@127.0.0.1:{server.port}/0"
        preflight.forget()
        warnings = preflight.check_server(url, "DUET_REDIS_URL")
        assert len(warnings) == 1 and "does not say its maxmemory-policy" in warnings[0]
        assert preflight.check_server(url, "DUET_REDIS_URL") == []  # warned once
        preflight.forget()
