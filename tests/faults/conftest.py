"""Fault-test fixtures: a private Redis server per test (these tests kill, freeze, fill or
watch it), one with an append-only file that survives a kill, and a capture of every
command a server receives."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
from collections.abc import Iterator

import pytest
import redis

from duet.embedded import EmbeddedRedis
from tests.support import pings, wait_for


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
        from duet.embedded import free_port

        self.port = free_port()
        self.dir = directory
        self.appendfsync = appendfsync
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        from duet.embedded import find_server_binary

        log = open(os.path.join(self.dir, "server.log"), "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [find_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "yes", "--appendfsync", self.appendfsync,
             "--dir", self.dir, "--loglevel", "warning", "--maxclients", "10000"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
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
