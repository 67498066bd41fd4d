"""Wake the worker's event loop when a pool thread hands it work (kombu before 5.7).

With the threads pool a task's late ack (or reject) is queued from the task's thread with
``hub.call_soon``; kombu's hub before 5.7 never interrupts its poll for it, so the ack
waits for the next broker reply or timer (up to 10 s). Meanwhile the message holds its
prefetch credit: a worker with every slot's message done but unacked takes no new one
(Celery issue 6941). kombu 5.7 wakes its hub itself; for older releases this consumer
bootstep adds the same wake-up: a socket pair whose reading end the loop polls.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any

import kombu
from celery import bootsteps

#: The first kombu whose hub wakes itself on a ``call_soon`` from another thread.
SELF_WAKING_KOMBU = (5, 7)


def needed(version: tuple[int, ...] = tuple(kombu.VERSION[:2])) -> bool:
    """Whether kombu ``version``'s hub sleeps through another thread's ``call_soon``."""
    return version < SELF_WAKING_KOMBU


class Waker:
    """Makes ``hub.call_soon`` from any thread but the loop's interrupt the hub's poll."""

    def __init__(self) -> None:
        self.reader, self.writer = socket.socketpair()
        self.reader.setblocking(False)
        self.writer.setblocking(False)
        self._lock = threading.Lock()
        self._pending = False  # a wake-up byte sent and not yet drained
        self._loop_thread: int | None = None
        self._wrapped: Any = None  # the hub whose call_soon wakes through this
        #: Wake-ups the loop drained (for tests and debugging).
        self.wakeups = 0

    def install(self, hub: Any) -> None:
        """Poll the reading end in ``hub`` (again: a hub reset drops its readers) and wrap
        its ``call_soon`` once; the calling thread is the loop's."""
        self._loop_thread = threading.get_ident()
        hub.remove(self.reader)  # registered twice, epoll would refuse it
        hub.add_reader(self.reader, self._drain)
        if self._wrapped is not hub:
            self._wrapped = hub
            call_soon = hub.call_soon

            def waking_call_soon(callback: Any, *args: Any) -> Any:
                queued = call_soon(callback, *args)
                self.wake()
                return queued

            hub.call_soon = waking_call_soon

    def wake(self) -> None:
        """Interrupt the loop's poll, unless on the loop's thread or a wake-up is pending
        (one is enough: the loop runs every queued callback before it polls again)."""
        if threading.get_ident() == self._loop_thread:
            return
        with self._lock:
            if self._pending:
                return
            self._pending = True
        with contextlib.suppress(OSError):  # closed at shutdown, or the buffer full
            self.writer.send(b"\0")

    def _drain(self) -> None:
        # Drain before clearing the flag: a byte sent in between then stays to be read.
        with contextlib.suppress(OSError):
            self.reader.recv(4096)
        with self._lock:
            self._pending = False
        self.wakeups += 1

    def close(self) -> None:
        self.reader.close()
        self.writer.close()


class WakeHub(bootsteps.StartStopStep):
    """A consumer bootstep giving the worker's hub a :class:`Waker` on kombu before 5.7."""

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.waker: Waker | None = None

    def include_if(self, parent: Any) -> bool:
        return needed()

    def register_with_event_loop(self, parent: Any, hub: Any) -> None:
        # Celery calls this from the loop's thread each time the loop (re)starts.
        if self.waker is None:
            self.waker = Waker()
        self.waker.install(hub)

    def shutdown(self, parent: Any) -> None:
        if self.waker is not None:
            self.waker.close()
            self.waker = None
