"""The stand-in as a server: it queues a burst of connections as a vendor's front end does,
and a port it cannot take is one line, not a traceback."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from duet.standin.server import FakeLLM

pytestmark = pytest.mark.system


def test_a_burst_of_connections_waits_in_the_queue_instead_of_being_dropped() -> None:
    server = FakeLLM()  # bound and listening, not yet accepting: every connection queues
    opened: list[socket.socket] = []
    try:
        for _ in range(150):
            try:
                opened.append(socket.create_connection(("127.0.0.1", server.port), timeout=0.5))
            except OSError:
                break
        assert len(opened) == 150, f"only {len(opened)} of 150 connections were queued"
    finally:
        for s in opened:
            s.close()
        server.stop()


def test_a_busy_port_is_one_line_and_exit_2() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "duet", "fake-llm", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2, done.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
