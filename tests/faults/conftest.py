"""Fault-test fixtures: a private Redis server per test (these tests kill, freeze, fill or
watch it), one with an append-only file that survives a kill, and a capture of every
command a server receives."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

import pytest
import redis

from duet.embedded.server import EmbeddedRedis
from tests.support import (
    TLS_SERVER_OPTIONS,
    celery_worker,
    client_pointed_at,
    duet_cli,
    flower,
    flower_get,
    make_certificates,
    pings,
    wait_for,
)


class Monitor:
    """Every byte a Redis ``MONITOR`` connection receives, from start to :meth:`stop`."""

    def __init__(self, port: int) -> None:
        self._sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self._sock.sendall(b"MONITOR\r\n")
        first = self._sock.recv(5)
        assert first == b"+OK\r\n", first
        self._sock.settimeout(None)
        self._chunks: list[bytes] = []
        self._thread = threading.Thread(target=self._read, name="redis-monitor", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = self._sock.recv(65536)
            except OSError:
                return
            if not chunk:
                return
            self._chunks.append(chunk)

    def text(self) -> bytes:
        return b"".join(self._chunks)

    def stop(self) -> bytes:
        self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(5)
        return self.text()


@pytest.fixture
def private_redis() -> Iterator[EmbeddedRedis]:
    """A Redis server of this test's own, on a free port, stopped afterwards."""
    with EmbeddedRedis() as server:
        yield server


class DurableRedis:
    """A redis-server with an append-only file (fsync on every write, or ``appendfsync``
    as given) in a directory of its own, which a test can kill (SIGKILL) and start again
    on the same port and file."""

    def __init__(self, directory: str, appendfsync: str = "always") -> None:
        from duet.embedded.server import free_port

        self.port = free_port()
        self.dir = directory
        self.appendfsync = appendfsync
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        from duet.embedded.server import find_server_binary

        log = open(os.path.join(self.dir, "server.log"), "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                find_server_binary(),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                self.appendfsync,
                "--dir",
                self.dir,
                "--loglevel",
                "warning",
                "--maxclients",
                "10000",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        client = redis.Redis(port=self.port, socket_timeout=1)
        wait_for(lambda: pings(client), 30, "the Redis server to answer")
        client.close()

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill()


@pytest.fixture
def durable_redis(tmp_path, request) -> Iterator[DurableRedis]:  # type: ignore[no-untyped-def]
    """A Redis with an append-only file, started; killed afterwards. Indirect
    parametrization gives its ``appendfsync`` (default ``always``)."""
    server = DurableRedis(str(tmp_path), getattr(request, "param", "always"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


class SentinelSet:
    """A primary, a replica of it and three sentinels watching them (quorum 2), each a
    redis-server of its own on a free loopback port, in a directory of the test's; with
    ``tls``, every one of them on TLS only (client certificates required), the
    certificates of :func:`tests.support.make_certificates` in that directory."""

    MASTER = "mymaster"
    #: Sentinel's ``down-after-milliseconds``. Not 1000: Sentinel pings every second, so
    #: a just-promoted primary was marked down under load and the killed one, restarted
    #: empty as its replica, promoted in its place (every key lost).
    DOWN_AFTER_MS = 3000
    COMMON = (
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--loglevel",
        "warning",
        "--maxclients",
        "10000",
    )

    def __init__(self, directory: str, password: str | None = None, tls: bool = False) -> None:
        from duet.embedded.server import free_port

        self.dir = directory
        #: The sentinels' own ``requirepass`` (None: none).
        self.password = password
        self.tls = tls
        self.ports = [free_port(), free_port()]  # primary, replica (they swap roles)
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.procs: list[subprocess.Popen[bytes]] = []
        self.servers: dict[int, subprocess.Popen[bytes]] = {}  # by port

    @property
    def url(self) -> str:
        """The ``sentinel://`` URL of the three sentinels (database 0); ``sentinels://``
        with the CA and client certificate for TLS ones."""
        if not self.tls:
            return ";".join(f"sentinel://127.0.0.1:{p}" for p in self.sentinel_ports) + "/0"
        parts = ";".join(f"sentinels://127.0.0.1:{p}" for p in self.sentinel_ports)
        return f"{parts}/0?{urlencode(self.tls_files())}"

    def tls_files(self, ca: str = "ca.crt") -> dict[str, str]:
        """redis-py's TLS arguments for a client of these servers (``ca``: the CA file)."""
        return {
            "ssl_ca_certs": os.path.join(self.dir, ca),
            "ssl_certfile": os.path.join(self.dir, "client.crt"),
            "ssl_keyfile": os.path.join(self.dir, "client.key"),
        }

    def _client(self, port: int, **kwargs: object) -> redis.Redis:
        """A client of the server on ``port`` (over TLS for TLS servers)."""
        tls = {"ssl": True, **self.tls_files()} if self.tls else {}
        return redis.Redis(port=port, **tls, **kwargs)  # type: ignore[arg-type]

    def _listen(self, port: int) -> list[str]:
        """The options that have a server listen on ``port`` (on TLS only, with TLS)."""
        if not self.tls:
            return ["--port", str(port)]
        tls = [*TLS_SERVER_OPTIONS, "--tls-replication", "yes"]
        return ["--port", "0", "--tls-port", str(port), *tls]

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        from duet.embedded.server import find_server_binary

        log = open(os.path.join(self.dir, f"{name}.log"), "ab")  # noqa: SIM115
        proc = subprocess.Popen(
            [find_server_binary(), *args],
            cwd=self.dir,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.procs.append(proc)
        return proc

    def start(self) -> None:
        primary, replica = self.ports
        common = self.COMMON
        self.servers[primary] = self._spawn("primary", [*self._listen(primary), *common])
        self.servers[replica] = self._spawn(
            "replica",
            [*self._listen(replica), *common, "--replicaof", "127.0.0.1", str(primary)],
        )
        for n, port in enumerate(self.sentinel_ports):
            conf = os.path.join(self.dir, f"sentinel{n}.conf")
            with open(conf, "w") as f:
                listen = self._listen(port)
                f.write(
                    "".join(
                        f"{k[2:]} {v}\n" for k, v in zip(listen[::2], listen[1::2], strict=True)
                    )
                    + f"bind 127.0.0.1\ndir {self.dir}\n"
                    f"sentinel monitor {self.MASTER} 127.0.0.1 {primary} 2\n"
                    f"sentinel down-after-milliseconds {self.MASTER} {self.DOWN_AFTER_MS}\n"
                    f"sentinel failover-timeout {self.MASTER} 10000\n"
                )
                if self.password:  # and the others are asked with it too
                    f.write(
                        f"requirepass {self.password}\nsentinel sentinel-pass {self.password}\n"
                    )
            self._spawn(f"sentinel{n}", [conf, "--sentinel"])
        wait_for(lambda: self._replicating(primary), 30, "the replica to be in sync")
        wait_for(self._sentinels_ready, 60, "every sentinel to see the others and the replica")

    def sentinel(self, n: int = 0) -> redis.Redis:
        return self._client(
            self.sentinel_ports[n],
            socket_timeout=2,
            decode_responses=True,
            password=self.password,
        )

    def primary_port(self) -> int:
        """The port of the primary the first sentinel names now."""
        with self.sentinel() as s:
            return int(s.sentinel_get_master_addr_by_name(self.MASTER)[1])

    def primary_url(self) -> str:
        if self.tls:
            return f"rediss://127.0.0.1:{self.primary_port()}/0?{urlencode(self.tls_files())}"
        return f"redis://127.0.0.1:{self.primary_port()}/0"

    def _replicating(self, primary: int) -> bool:
        with self._client(primary, socket_timeout=1) as client:
            if not pings(client):
                return False
            info = client.info("replication")
            return (
                bool(info.get("connected_slaves"))
                and info.get("slave0", {}).get("state") == "online"
            )

    def _sentinels_ready(self) -> bool:
        for n in range(len(self.sentinel_ports)):
            with self.sentinel(n) as s:
                if not pings(s):
                    return False
                state = s.sentinel_master(self.MASTER)
                if int(state["num-other-sentinels"]) < 2 or int(state["num-slaves"]) < 1:
                    return False
        return True

    def failover(self, kill: bool = False) -> tuple[int, int]:
        """Have the sentinels promote the replica now (``SENTINEL FAILOVER``), or kill the
        primary (SIGKILL: they promote the replica a second later, and the killed server is
        started again empty, as the new one's replica: a server without persistence
        started again as a primary would be empty, Redis's documented hazard); the old
        primary's port and the new one's, once every sentinel names the new one."""
        old = self.primary_port()
        if kill:
            self.servers[old].kill()
            self.servers[old].wait()
        else:
            with self.sentinel() as s:
                s.execute_command("SENTINEL", "FAILOVER", self.MASTER)
        new = next(p for p in self.ports if p != old)
        wait_for(
            lambda: all(self._names(n) == new for n in range(3)),
            30,
            "every sentinel to name the new primary",
        )
        if kill:  # as the new primary's replica: an empty server must never be a primary
            self.servers[old] = self._spawn(
                "restarted",
                [*self._listen(old), *self.COMMON, "--replicaof", "127.0.0.1", str(new)],
            )
        return old, new

    def _names(self, n: int) -> int | None:
        """The primary's port sentinel ``n`` lists in ``SENTINEL MASTERS`` (what redis-py
        asks): the new one only once the failover is over (``GET-MASTER-ADDR-BY-NAME``
        names it while the failover runs), so a server started again before that is not
        taken for the primary."""
        with self.sentinel(n) as s:
            try:
                return int(s.sentinel_master(self.MASTER)["port"])
            except (redis.RedisError, KeyError, TypeError):
                return None

    def events(self) -> list[str]:
        """The failover events sentinel 0 logged (``+switch-master``, ``+sdown`` …), in
        order: shown when a test fails, to tell one failover from two."""
        kinds = ("+switch-master", "+sdown", "-sdown", "+odown", "+selected-slave", "no-good")
        with open(os.path.join(self.dir, "sentinel0.log"), errors="replace") as f:
            return [line.rstrip() for line in f if any(k in line for k in kinds)]

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture
def sentinels(tmp_path, request) -> Iterator[SentinelSet]:  # type: ignore[no-untyped-def]
    """A primary, a replica and three sentinels, started; killed afterwards. Indirect
    parametrization gives the sentinels' own password (default: none)."""
    group = SentinelSet(str(tmp_path), getattr(request, "param", None))
    try:
        group.start()
        yield group
    finally:
        group.stop()


@pytest.fixture
def tls_sentinels(tmp_path) -> Iterator[SentinelSet]:  # type: ignore[no-untyped-def]
    """A primary, a replica and three sentinels on TLS only (client certificates
    required), started; killed afterwards."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make certificates with")
    make_certificates(Path(tmp_path))
    group = SentinelSet(str(tmp_path), tls=True)
    try:
        group.start()
        yield group
    finally:
        group.stop()


@dataclass
class ServedBatch:
    """What a batch served through one URL showed: its runs' statuses, ``duet ls``,
    Flower's ``/api/queues/length`` and ``/broker`` answers, and the worker's log."""

    statuses: list[str]
    listed: subprocess.CompletedProcess[str]
    lengths: tuple[int, bytes]
    broker: tuple[int, bytes]
    worker_log: str


def serve_a_batch(
    url: str, flower_log: Path, runs: int, *, name: str, timeout: float = 90
) -> ServedBatch:
    """A worker (8 threads), a batch of ``runs`` one-round runs on the simulator, ``duet
    ls`` and Flower (its log ``flower_log``), all given ``url`` only."""
    from orchestration import Agent, Team

    team = Team.actor_critic(
        actor=Agent("Fix.", model="sim"),
        critic=Agent("Review.", model="sim?scores=0.95"),
        max_rounds=1,
    )
    with (
        client_pointed_at(url),
        celery_worker(url, concurrency=8, name=name) as worker,
        flower(url, flower_log) as port,
    ):
        batch = team.submit_batch([f"task {n}" for n in range(runs)])
        statuses = [r.status for r in batch.results(timeout=timeout)]
        listed = duet_cli(url, "ls", timeout=60)
        lengths = flower_get(port, "/api/queues/length")
        broker = flower_get(port, "/broker")
        worker_log = Path(worker.log_path).read_text(errors="replace")
    return ServedBatch(statuses, listed, lengths, broker, worker_log)
