"""The embedded Redis server and the thread that starts it.

On Linux the server is started with PR_SET_PDEATHSIG, which the kernel sends when the
*thread* that forked it ends. A server started from a thread that then ends (the client
API called from a request thread or a pool) must keep running: it is forked from a
thread that lasts as long as the process. (That a killed ``duet run`` leaves no server is
``tests/faults/test_embedded_signals.py::test_a_killed_run_leaves_no_redis``.)
"""

from __future__ import annotations

import threading

import pytest
import redis

from duet.embedded.server import EmbeddedRedis
from tests.support import pings, wait_for

pytestmark = pytest.mark.system


def test_a_server_started_from_a_thread_outlives_the_thread() -> None:
    started: list[EmbeddedRedis] = []
    thread = threading.Thread(target=lambda: started.append(EmbeddedRedis().start()))
    thread.start()
    thread.join(30)
    assert started, "the server did not start"
    server = started[0]
    client = redis.Redis(port=server.port, socket_timeout=1)
    try:
        # A parent-death signal would arrive as the thread ended: the server stops within
        # milliseconds. It must not stop at all.
        with pytest.raises(AssertionError, match="timed out"):
            wait_for(lambda: not pings(client), 2.0, "the server to stop")
    finally:
        client.close()
        server.stop()
