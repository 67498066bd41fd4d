"""Fault-test fixtures: a private Redis server per test (these tests kill, freeze, fill or
watch it), and a capture of every command it receives."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from duet.embedded import EmbeddedRedis


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
