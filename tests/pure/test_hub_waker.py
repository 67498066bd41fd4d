"""A pool thread's ``call_soon`` wakes the worker's event loop at once (workers.hub_waker):
on kombu before 5.7 a late ack otherwise waited up to 10 s for the hub's poll to end."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from kombu.asynchronous import Hub

from workers.hub_waker import Waker, needed


@pytest.fixture
def looping_hub() -> Iterator[tuple[Hub, Waker]]:
    """A kombu hub whose loop runs in a thread of its own (as the worker's main thread),
    with a :class:`Waker` installed there, and a timer far off: its poll waits 10 s."""
    hub, waker = Hub(), Waker()
    installed, stop = threading.Event(), threading.Event()

    def run() -> None:
        waker.install(hub)
        loop = hub.create_loop()
        installed.set()
        while not stop.is_set():
            next(loop)

    hub.call_later(60, lambda: None)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert installed.wait(5)
    yield hub, waker
    stop.set()
    hub.call_soon(lambda: None)  # wakes the loop to see ``stop``
    thread.join(5)
    hub.close()
    waker.close()


def test_another_threads_call_soon_runs_without_waiting_for_the_poll(
    looping_hub: tuple[Hub, Waker],
) -> None:
    hub, waker = looping_hub
    for _ in range(3):  # and again after each wake-up is drained
        ran = threading.Event()
        hub.call_soon(ran.set)
        assert ran.wait(2), "the loop slept through another thread's call_soon"
    assert waker.wakeups >= 1


def test_needed_before_kombu_5_7_only() -> None:
    assert needed((5, 5)) and needed((5, 6))
    assert not needed((5, 7)) and not needed((6, 0))
